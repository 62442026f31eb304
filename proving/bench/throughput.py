"""Throughput: the enqueue rate (`Store.enqueue` one by one and
`Store.enqueue_many`) and end to end — `--jobs` no-op jobs committed at once
in front of N idle, LISTENing `run_worker` processes (the default path users
run: no `--tenant`, restricted only to the bench's action), from the commit
to the last `finished_at` on the database's clock, each row beside the raw
loop (`reference.py`) with as many processes, in turns; then spread over
many tenants, batched (`--batch N`), and capped (`JOBS_TENANT_LEASE_CAP`)."""

import time
from collections.abc import Callable

from django.db import connection, transaction

from jobs.store import JobSpec, Store

from .common import BENCH_ACTION, MANY_TENANTS, TENANT_E2E, TENANT_ENQUEUE, delete_tenants, in_turns, vacuum
from .figures import BenchConfig, Results, Throughput
from .fleet import WorkerFleet, last_finish, wait_done
from .meters import as_aware, cpu_now, cpu_since, db_now, wal_position, wal_since
from .reference import throughput_reference

# The lease cap's rows: the same work over this many tenants, uncapped then
# capped (JOBS_TENANT_LEASE_CAP).
CAPPED_TENANTS = 10


# ---------------------------------------------------------------- enqueue


def enqueue_rates(config: BenchConfig) -> list[tuple[str, int, float, int | None]]:
    """(label, jobs, seconds, WAL bytes written meanwhile) for one-by-one and
    batched enqueues: what a job costs before any worker sees it (the end to
    end rows count only what comes after)."""
    store = Store()

    def measured(enqueue: Callable[[], object]) -> tuple[float, int | None]:
        wal = wal_position()
        started = time.perf_counter()
        enqueue()
        return time.perf_counter() - started, wal_since(wal)

    one_by_one = min(config.jobs, 2000)
    single = measured(lambda: [store.enqueue(TENANT_ENQUEUE, f"one-{i:07d}") for i in range(one_by_one)])
    specs = [JobSpec(TENANT_ENQUEUE, f"many-{i:07d}") for i in range(config.jobs)]
    many = measured(lambda: store.enqueue_many(specs))
    delete_tenants([TENANT_ENQUEUE])
    return [("one by one (Store.enqueue)", one_by_one, *single), ("batched (Store.enqueue_many)", config.jobs, *many)]


# ---------------------------------------------------------------- end to end


def throughput_all(config: BenchConfig, results: Results, progress: Callable[[str], None]) -> None:
    """Every end-to-end row, each next to the raw reference measured in this
    run with the same number of processes (and the same batch size)."""
    postgres = connection.vendor == "postgresql"
    # With one pair per row, a reference run serves every row of its size.
    references: dict[tuple[int, int, int], tuple[float, int | None, tuple[float, float] | None]] = {}

    def reference(jobs: int, processes: int, batch: int) -> tuple[float, int | None, tuple[float, float] | None]:
        if config.repeat > 1 or (jobs, processes, batch) not in references:
            progress(f"end to end: {jobs} jobs through {processes} reference loop process(es), claim {batch}")
            references[(jobs, processes, batch)] = throughput_reference(jobs, processes, batch=batch)
        return references[(jobs, processes, batch)]

    def row(label: str, jobs: int, processes: int, *, tenants: int = 1, batch: int = 1, cap: int = 0) -> None:
        measured = Throughput(processes, jobs, runs=[], tenants=tenants, batch=batch, lease_cap=cap)

        def ours() -> None:
            seconds, wal, measured.claimed_by, cpu = _throughput_ours(jobs, processes, results, tenants=tenants,
                                                                      batch=batch, cap=cap)
            measured.runs.append((seconds, wal))
            measured.cpu.append(cpu)

        def ref() -> None:
            ref_seconds, ref_wal, ref_cpu = reference(jobs, processes, batch)
            measured.ref_runs.append((ref_seconds, ref_wal))
            measured.ref_cpu.append(ref_cpu)

        for i in range(config.repeat):
            progress(f"end to end: {label}" + (f" (pair {i + 1} of {config.repeat})" if config.repeat > 1 else ""))
            # A host whose speed drifts during a row favours neither side.
            for run in in_turns(i, (ours, ref) if postgres else (ours,)):
                run()
        results.throughput.append(measured)

    for n in config.processes:
        row(f"{config.jobs} jobs through {n} run_worker process(es)", config.jobs, n)
    # The many-tenant and batched rows run with 4 processes (or the most
    # asked for, if fewer): their targets (80 % of the raw loop; 10,000
    # jobs/s batched) are stated for 4.
    wide = min(4, max(config.processes))
    for tenants in config.tenants:
        jobs = max(config.jobs, 2 * tenants)
        row(f"{jobs} jobs of {tenants:,} tenants through {wide} run_worker process(es)", jobs, wide,
            tenants=tenants)
    for batch in config.batches:
        row(f"{config.batch_jobs} jobs through {wide} run_worker --batch {batch} process(es)", config.batch_jobs,
            wide, batch=batch)
    # The lease cap's price: the same work over CAPPED_TENANTS tenants, uncapped
    # then capped (a cap the workers never reach: what it costs is the capped
    # claim itself).
    if config.lease_cap:
        for cap in (0, config.lease_cap):
            row(f"{config.jobs} jobs of {CAPPED_TENANTS} tenants through {wide} run_worker process(es)"
                + (f", lease cap {cap}" if cap else ", uncapped"), config.jobs, wide, tenants=CAPPED_TENANTS,
                cap=cap)


def _throughput_ours(jobs: int, processes: int, results: Results, *, tenants: int = 1,
                     batch: int = 1, cap: int = 0) -> tuple[float, int | None, list[int], tuple[float, float] | None]:
    """(seconds, WAL bytes written meanwhile, jobs each worker claimed, CPU
    seconds of the workers and of the rest of the host meanwhile)."""
    names = [TENANT_E2E] if tenants == 1 else MANY_TENANTS[:tenants]
    delete_tenants(names)
    vacuum()
    args = ("--batch", str(batch)) if batch > 1 else ()
    env = {"JOBS_TENANT_LEASE_CAP": str(cap)} if cap else {}
    with WorkerFleet(processes, label="e2e", poll_interval=0.5, args=args, env=env) as fleet:
        specs = [JobSpec(names[i % len(names)], f"e2e-{i:07d}", action=BENCH_ACTION) for i in range(jobs)]
        # One commit makes every job visible at once and sends one NOTIFY;
        # the clock starts when it returns.
        with transaction.atomic():
            Store().enqueue_many(specs)
        started = db_now()
        wal_before = wal_position()
        cpu_before = cpu_now([proc.pid for proc in fleet.procs])
        wait_done(jobs, fleet)
        cpu = cpu_since(cpu_before, cpu_now([proc.pid for proc in fleet.procs]))
        wal = wal_since(wal_before)
        finished = last_finish()
        results.rss_mib.setdefault("end to end", []).extend(fleet.peak_rss_mib())
        claimed_by = fleet.claimed()
    seconds = max((as_aware(finished) - started).total_seconds(), 1e-6)
    delete_tenants(names)
    return seconds, wal, claimed_by, cpu
