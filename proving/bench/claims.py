"""Claim timings: the median default claim (and its finish) of one job —
with the table as found, beside `--rows` DONE then WAITING_EXTERNAL rows;
with one tenant holding READY work against `--claim-tenants` tenants; and of
1 and of 100 jobs from one tenant's READY backlog, shallow then `--backlog`
deep, under planner statistics taken while many tenants each held a few
READY jobs. On PostgreSQL also the buffers one claim statement touches: a
count that, unlike time, a busy machine does not blur."""

import itertools
import statistics
import time
from collections.abc import Callable, Iterable

from django.db import connection, transaction

from jobs.models import Job
from jobs.store import JobSpec, Store

from .common import (BENCH_ACTION, BENCH_TENANTS, BULK_TENANTS, MANY_TENANTS, TENANT_CLAIM, BenchError, analyzed_plan,
                     bulk_load, delete_tenants, in_turns, tidy, vacuum)
from .figures import BenchConfig, ClaimCase

# Claim time vs backlog: timed claims per row (after 3 untimed), and the
# batch claimed beside the single one (run_worker --batch 100). Its target
# is the table-size one: a deep backlog at most TARGET_CLAIM_RATIO × shallow.
BACKLOG_CLAIMS = 20
BACKLOG_BATCH = 100
# The statistics its claims are planned with: taken while tenants held
# BACKLOG_STATS_JOBS READY jobs each (a day's traffic, their rows
# interleaved), as many tenants as make the planner expect
# BACKLOG_EXPECTED READY jobs of any one once the backlog is in — fewer
# than a batch, the estimate under which a batch's LIMIT written in as a
# constant is planned as a read and sort of the whole backlog. (Twelve
# each keeps the tenants under a tenth of the rows, so ANALYZE records
# their number, not a share of the table that would grow with it.)
BACKLOG_STATS_JOBS = 12
BACKLOG_EXPECTED = 40


# ---------------------------------------------------------------- claim time vs table size


def claim_vs_size(config: BenchConfig, progress: Callable[[str], None]) -> list[ClaimCase]:
    other_rows = Job.objects.exclude(tenant__in=BENCH_TENANTS).count()
    tidy()
    cases = [ClaimCase("table as found", other_rows, *_claim_times("empty", config.claims))]
    if config.skip_bulk:
        return cases
    for state in ("DONE", "WAITING_EXTERNAL"):
        progress(f"claim time: loading {config.rows} {state} rows")
        started = time.perf_counter()
        bulk_load(state, config.rows)
        tidy()
        load_seconds = time.perf_counter() - started
        progress(f"claim time: {config.claims} claims with {config.rows} {state} rows")
        timings = _claim_times(state.lower(), config.claims)
        cases.append(ClaimCase(f"+ {config.rows:,} {state}", other_rows + config.rows, *timings,
                               load_seconds=load_seconds))
        delete_tenants(BULK_TENANTS)
    return cases


# ---------------------------------------------------------------- claim time vs tenants


def claim_vs_tenants(config: BenchConfig) -> list[ClaimCase]:
    """The default claim with one tenant holding READY work, then with
    `claim_tenants` tenants holding it (one job each), both right after the
    jobs were loaded. With `--repeat`, the two cases run in turns, that many
    rounds (the order swapped each round): this host's speed drifts within
    minutes, two cases a few seconds apart much less, so each round's ratio
    is its own and the row shows their median and range."""
    many = MANY_TENANTS[:config.claim_tenants]
    cases = {"one": None, "many": many}
    rounds: dict[str, list[tuple[float, float, int | None]]] = {name: [] for name in cases}
    for i in range(config.repeat):
        for name in in_turns(i, tuple(cases)):
            rounds[name].append(_claim_times(name, config.claims, cases[name]))
    one, spread = _median_case(rounds["one"]), _median_case(rounds["many"])
    ratios = sorted(m[0] / o[0] for o, m in zip(rounds["one"], rounds["many"]))
    return [ClaimCase("1 tenant with READY work", 1, *one),
            ClaimCase(f"{len(many):,} tenants with READY work", len(many), *spread, ratios=ratios)]


def _median_case(timings: list[tuple[float, float, int | None]]) -> tuple[float, float, int | None]:
    """Rounds of (claim ms, claim+finish ms, buffers) as one: each figure's median."""
    return (statistics.median(c for c, _, _ in timings), statistics.median(t for _, t, _ in timings),
            _median_count(b for _, _, b in timings))


def _median_count(counts: Iterable[int | None]) -> int | None:
    """The median of the counts that could be read (None if none could)."""
    read = [c for c in counts if c is not None]
    return int(statistics.median(read)) if read else None


# ---------------------------------------------------------------- timing claims


def _claim_times(case: str, claims: int, tenants: list[str] | None = None) -> tuple[float, float, int | None]:
    """Median ms of `claim_next`, and of `claim_next` + `finish`, over
    `claims` claims (after a few warm-up claims) on a small READY set — the
    default claim, as run_worker takes it (no tenant filter; only the bench's
    action); and (PostgreSQL) the median buffers one claim statement touches.
    With `tenants`, every one of them holds a job. It starts, like an
    end-to-end row, after a plain VACUUM: the case run just before it
    (thousands of tenants in and out of jobs_readytenant) must not leave this
    one its dead rows — the one-tenant claim asks that table whether one
    tenant alone has work, and would read every dead page of it on each
    claim until autovacuum came."""
    tenants = tenants or [TENANT_CLAIM]
    warmup = min(20, claims)
    vacuum()
    Store().enqueue_many(JobSpec(tenants[i % len(tenants)], f"claim-{case}-{i:06d}", action=BENCH_ACTION)
                         for i in range(max(warmup + claims, len(tenants))))
    timings = _time_claims(claims, warmup)
    delete_tenants(tenants)
    return timings


def _time_claims(claims: int, warmup: int, batch: int = 1) -> tuple[float, float, int | None]:
    """Median ms of a default claim of `batch` jobs (`claim_batch`, as
    run_worker --batch takes it: no tenant filter, only the bench's action),
    and of the claim and the finish of what it took (`finish_many`), over
    `claims` claims after `warmup` untimed ones, on the READY jobs already
    loaded; and (PostgreSQL) the median buffers one claim statement touches,
    sampled at three points — a count that, unlike time, a busy machine does
    not blur."""
    store = Store()
    worker = "bench-claimer"
    samples = {warmup + claims * k // 4 for k in (1, 2, 3)}
    claim_ms, total_ms, buffers = [], [], []
    for i in range(warmup + claims):
        if i in samples:
            buffers.append(_claim_buffers(worker, batch))
        started = time.perf_counter()
        jobs = store.claim_batch(worker, limit=batch, actions=[BENCH_ACTION])
        claimed = time.perf_counter()
        if not jobs:
            # (Fewer than `batch` is a claim's right: a fair batch takes a
            # share from each tenant it samples, some of whose READY jobs
            # may be other actions', a user's.)
            raise BenchError(f"a claim of {batch} found nothing after {i} of {warmup + claims} claims")
        store.finish_many(worker, [(job, None) for job in jobs])
        finished = time.perf_counter()
        if i >= warmup:
            claim_ms.append((claimed - started) * 1000)
            total_ms.append((finished - started) * 1000)
    return statistics.median(claim_ms), statistics.median(total_ms), _median_count(buffers)


def _claim_buffers(worker: str, limit: int = 1) -> int | None:
    """Shared buffers (hit + read) that the next default claim statement of
    `limit` jobs touches — the global claim if this thread's last claim saw
    one tenant with READY work, else the fair one — from EXPLAIN (ANALYZE,
    BUFFERS) in a transaction that is rolled back, so no job is claimed.
    PostgreSQL only; None if the claim module's statement builder changed
    shape."""
    if connection.vendor != "postgresql":
        return None
    from jobs import claim as claim_sql
    from jobs.clock import Clock

    one_tenant = getattr(claim_sql._last_seen, "one_tenant", False)
    template = claim_sql._GLOBAL_PG if one_tenant else claim_sql._FAIR_PG
    try:
        sql, params = claim_sql._statement(template, worker, Clock(None), 30.0, None, [BENCH_ACTION], limit,
                                           one_tenant=one_tenant)
    except (AttributeError, TypeError):
        return None
    top = analyzed_plan(sql, params)
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


# ---------------------------------------------------------------- claim time vs backlog


def claim_vs_backlog(config: BenchConfig, progress: Callable[[str], None]) -> list[ClaimCase]:
    """Default claims of 1 and of BACKLOG_BATCH jobs from one tenant's READY
    backlog, first a shallow one (just what the claims take), then
    `config.backlog` jobs deep, with the planner's statistics as an ANALYZE
    left them while many tenants each held a few READY jobs (see
    BACKLOG_EXPECTED), and the table vacuumed since the backlog came
    (autovacuum's VACUUM counts its rows; only its ANALYZE, later, would
    see whose they are). A claim reads the
    backlog's head: deep, it must cost what it costs shallow. The statistics
    are taken again at the end, so the table is left with true ones."""
    claims = min(config.claims, BACKLOG_CLAIMS)
    warmup = 3
    shallow = (warmup + claims) * (1 + BACKLOG_BATCH)
    deep = max(config.backlog, shallow)
    many = MANY_TENANTS[:max(1, min(len(MANY_TENANTS), deep // BACKLOG_EXPECTED))]
    progress(f"claim time vs backlog: statistics taken while {len(many):,} tenants hold "
             f"{BACKLOG_STATS_JOBS} READY jobs each")
    _enqueue_ready(JobSpec(tenant, f"stats-{n}", action=BENCH_ACTION) for n in range(BACKLOG_STATS_JOBS)
                   for tenant in many)
    tidy()
    delete_tenants(many)
    cases = []
    for ready in (shallow, deep):
        progress(f"claim time vs backlog: {ready:,} READY jobs in one tenant")
        started = time.perf_counter()
        _enqueue_ready(JobSpec(TENANT_CLAIM, f"backlog-{i:07d}", action=BENCH_ACTION) for i in range(ready))
        load_seconds = time.perf_counter() - started
        vacuum()
        for batch in (1, BACKLOG_BATCH):
            cases.append(ClaimCase(f"claim {batch}, {ready:,} READY", ready, *_time_claims(claims, warmup, batch),
                                   load_seconds=load_seconds if batch == 1 else None, batch=batch))
        delete_tenants([TENANT_CLAIM])
    tidy()
    return cases


def _enqueue_ready(specs: Iterable[JobSpec], chunk: int = 10_000) -> None:
    """`Store.enqueue_many`, a transaction per `chunk` jobs."""
    store = Store()
    for batch in iter(lambda: list(itertools.islice(specs, chunk)), []):
        with transaction.atomic():
            store.enqueue_many(batch)
