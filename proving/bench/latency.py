"""Insert→start latency: jobs enqueued one at a time, every
`--latency-interval` ms, in front of idle workers; the job's `enqueue` event
against its first claim, both stamped by the database clock. Once with
NOTIFY, once with this process's NOTIFY switched off, which leaves the
workers' polling fallback."""

import time
from contextlib import nullcontext
from unittest import mock

from django.db import connection
from django.db.models import Q

from jobs import notify
from jobs.models import Job, JobEvent
from jobs.store import Store

from .common import BENCH_ACTION, TENANT_LATENCY, delete_tenants
from .figures import BenchConfig, Latency, Results
from .fleet import WorkerFleet, wait_done


def latency_rows(config: BenchConfig, results: Results) -> list[Latency]:
    """Jobs enqueued one at a time in front of idle workers. The workers'
    poll interval is 1 s, so a NOTIFY that works shows as milliseconds and
    the polling fallback as hundreds of them."""
    delete_tenants([TENANT_LATENCY])
    passes = [("notify", True)] if connection.vendor == "postgresql" else []
    passes.append(("poll", False))
    with WorkerFleet(config.latency_workers, label="latency", poll_interval=1.0) as fleet:
        for prefix, with_notify in passes:
            # Without NOTIFY from this process only the workers' polling is left.
            silenced = mock.patch.object(notify, "job_ready", lambda: None) if not with_notify else nullcontext()
            with silenced:
                enqueue_paced(prefix, config.latency_jobs, config.latency_interval_ms)
            wait_done(config.latency_jobs, fleet)
        results.rss_mib.setdefault("latency", []).extend(fleet.peak_rss_mib())
    samples = start_delays_ms()
    delete_tenants([TENANT_LATENCY])
    rows = []
    for prefix, with_notify in passes:
        label = ("NOTIFY (workers poll every 1 s)" if with_notify
                 else "polling only, no NOTIFY (poll 1 s)" if connection.vendor == "postgresql"
                 else "polling (SQLite has no NOTIFY; poll 1 s)")
        rows.append(Latency(label, samples.get(prefix, []), target=with_notify))
    return rows


def enqueue_paced(prefix: str, jobs: int, interval_ms: float) -> None:
    """`jobs` bench jobs of the latency tenant, enqueued one at a time, one
    every `interval_ms` (keys `<prefix>-000000` …: `start_delays_ms` groups
    them by prefix)."""
    store = Store()
    interval = interval_ms / 1000
    next_at = time.monotonic()
    for i in range(jobs):
        store.enqueue(TENANT_LATENCY, f"{prefix}-{i:06d}", action=BENCH_ACTION)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))


def start_delays_ms() -> dict[str, list[float]]:
    """Per pass: the first claim's time minus the enqueue time, both written
    by the database clock: the enqueue event's time, and the claim kept by
    the row that ended the first attempt (or by the job row while it runs).
    (`Job.created_at` is Django's auto_now_add, stamped by the enqueueing
    process, so the enqueue event is used instead.)"""
    enqueued, claimed = {}, {}
    events = JobEvent.objects.filter(job__tenant=TENANT_LATENCY).filter(
        Q(kind="enqueue") | Q(claimed_at__isnull=False)).order_by("id")
    for key, kind, created_at, claimed_at in events.values_list("job__key", "kind", "created_at", "claimed_at"):
        if kind == "enqueue":
            enqueued.setdefault(key, created_at)
        else:
            claimed.setdefault(key, claimed_at)
    for job in Job.objects.filter(tenant=TENANT_LATENCY, state="LEASED").only("key", "state", "updated_at"):
        claimed.setdefault(job.key, job.claimed_at)
    delays: dict[str, list[float]] = {}
    for key, at in claimed.items():
        if key in enqueued:
            delays.setdefault(key.split("-")[0], []).append((at - enqueued[key]).total_seconds() * 1000)
    return delays
