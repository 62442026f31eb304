"""Waiting costs a row, not a process (DESIGN §1, §3): 10,000 jobs waiting on
timers or replies hold no worker, and an idle `run_worker` stays near 0 % CPU.

A behaviour bound, not a benchmark: the CPU limit is generous and only
catches a busy loop (a worker that scans waiting rows or spins when idle)."""

import os
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job, Timer
from jobs.outbox import outbox_relay
from jobs.store import JobSpec
from jobs.timers import timer_fire_due
from tests.support import ProcessOutput, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WAITING = 10_000
WITH_TIMERS = 5_000


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    output = ProcessOutput(worker)
    try:
        output.wait_for("worker.start", timeout=30)
        # Past start-up work: the worker has run a first job and found nothing more.
        store.enqueue("other", "first")
        wait_for(lambda: Job.objects.get(key="first").state == "DONE", timeout=30, what="a first job to run")
        before = cpu_seconds(worker.pid)
        time.sleep(3.0)  # the measurement window, not a synchronisation
        idle_cpu = cpu_seconds(worker.pid) - before
        assert idle_cpu < 0.5, f"an idle worker used {idle_cpu:.2f}s CPU in 3s"
        assert Job.objects.filter(tenant="scale", state="WAITING_EXTERNAL").count() == WAITING
        assert Job.objects.filter(state="LEASED").count() == 0
        assert Job.objects.filter(tenant="scale").exclude(state="WAITING_EXTERNAL").count() == 0

        # A handful of timers come due: the same worker wakes those jobs and runs them.
        due = job_ids[:20]
        Timer.objects.filter(job_id__in=due).update(scheduled_for=timezone.now() - timedelta(seconds=1))
        wait_for(lambda: Job.objects.filter(pk__in=due, state="DONE").count() == 20, timeout=20,
                 what="the 20 woken jobs to run")
        assert Timer.objects.filter(state="FIRED").count() == 20
        assert Job.objects.filter(tenant="scale", state="WAITING_EXTERNAL").count() == WAITING - 20
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
