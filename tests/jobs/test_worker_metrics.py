"""A worker's own counters, served on its --metrics-port, read by a real scrape."""

import signal
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from durable.net import free_port
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def worker_samples(port: int) -> dict:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_worker_counts_outcomes_and_times_handlers_on_its_metrics_port(manage, store):
    for n in range(3):
        store.enqueue("studio", f"noop-{n}")
    port = free_port()
    worker = manage.start("run_worker", "--metrics-port", str(port), "--poll-interval", "0.2")
    try:
        samples = wait_for(
            lambda: (s := worker_samples(port)).get(("durable_worker_jobs_total", (("outcome", "done"),))) == 3 and s,
            timeout=60, what="three jobs counted as done")
        assert samples[("durable_worker_jobs_total", (("outcome", "claimed"),))] == 3
        assert samples[("durable_handler_duration_seconds_count", (("action", "jobs.noop"),))] == 3
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    assert worker.returncode == 0
