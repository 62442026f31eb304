"""Waiting costs a row, not a process (DESIGN §1, §3): 10,000 jobs waiting on
timers or replies hold no worker, and an idle `run_worker` stays near 0 % CPU.

A behaviour bound, not a benchmark: the CPU limit is generous and only
catches a busy loop (a worker that scans waiting rows or spins when idle)."""

import os
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job, Timer
from jobs.outbox import outbox_relay
from jobs.store import JobSpec
from jobs.timers import timer_fire_due

pytestmark = pytest.mark.django_db(transaction=True)

WAITING = 10_000
WITH_TIMERS = 5_000


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Output:
    """Drains a child's stdout in the background so it never blocks on a full pipe."""

    def __init__(self, process):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process):
        for line in process.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.05)
        return False


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_ten_thousand_waiting_jobs_hold_no_worker_and_an_idle_worker_stays_cold(store, manage):
    store.enqueue_many(JobSpec("scale", f"reply-or-reminder-{n:05d}") for n in range(WAITING))
    # Test set-up: persist the waits in bulk, as 10,000 handlers returning
    # Wait.external would have (the fenced path is covered elsewhere).
    Job.objects.filter(tenant="scale").update(state="WAITING_EXTERNAL", wait_reason="customer reply or reminder")
    later = timezone.now() + timedelta(days=30)
    job_ids = list(Job.objects.filter(tenant="scale").order_by("id").values_list("id", flat=True)[:WITH_TIMERS])
    Timer.objects.bulk_create(
        [Timer(tenant="scale", job_id=job_id, scheduled_for=later, reason="payment reminder", created_at=timezone.now())
         for job_id in job_ids],
        batch_size=1000,
    )
    # Nothing is due: the sweeps find nothing, whatever is waiting.
    assert timer_fire_due() == 0
    assert outbox_relay() == 0

    worker = manage.start("run_worker", "--worker-id", "idle", "--poll-interval", "1")
    output = Output(worker)
    try:
        assert output.wait_for("worker.start", timeout=30), "".join(output.lines)
        time.sleep(0.5)  # past start-up work
        before = cpu_seconds(worker.pid)
        time.sleep(3.0)
        idle_cpu = cpu_seconds(worker.pid) - before
        assert idle_cpu < 0.5, f"an idle worker used {idle_cpu:.2f}s CPU in 3s"
        assert Job.objects.filter(tenant="scale", state="WAITING_EXTERNAL").count() == WAITING
        assert Job.objects.filter(state="LEASED").count() == 0

        # A handful of timers come due: the same worker wakes those jobs and runs them.
        due = job_ids[:20]
        Timer.objects.filter(job_id__in=due).update(scheduled_for=timezone.now() - timedelta(seconds=1))
        assert wait_until(lambda: Job.objects.filter(pk__in=due, state="DONE").count() == 20, timeout=20), (
            "".join(output.lines[-20:])
        )
        assert Timer.objects.filter(state="FIRED").count() == 20
        assert Job.objects.filter(tenant="scale", state="WAITING_EXTERNAL").count() == WAITING - 20
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
