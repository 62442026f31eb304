"""`manage.py bench --pooler`: the same workers direct and behind a private
PgBouncer in transaction mode, in one run (DESIGN §17).

- **throughput**: `jobs` no-op jobs committed at once in front of N idle
  `run_worker` processes, first direct, then through PgBouncer
  (`DATABASE_POOL_MODE=transaction`, the LISTEN direct through
  `DATABASE_LISTEN_URL`), from the commit to the last finish on the
  database's clock; the pooled rate as a share of the direct one (goal ≥ 0.8).
- **insert→start latency**: jobs enqueued one at a time every 20 ms in front
  of idle workers polling every 1 s, direct and pooled: the job's `enqueue`
  event vs its `claim` event (p50 goal < 50 ms behind the pooler).
- **connections per worker process**: one direct `run_worker` at
  concurrency 1 and 8, its server backends counted by application_name in
  pg_stat_activity (the most seen over a few samples), idle and with every
  slot busy (budget: concurrency + 1); behind the pooler, the backends of its
  own (the LISTEN) next to the pool's server connections shared by all.
"""

import time
from dataclasses import dataclass, field

from django.db import connection, transaction

from jobs.store import JobSpec, Store

from ..pgbouncer import PgBouncerError, start_pgbouncer
from .common import (BENCH_ACTION, TENANT_E2E, TENANT_LATENCY, BenchError, delete_tenants, percentile, table, vacuum,
                     verdict)
from .fleet import WorkerFleet, database_url, last_finish, wait_done
from .latency import enqueue_paced, start_delays_ms
from .meters import as_aware, db_now

TARGET_SHARE = 0.80
TARGET_P50_MS = 50.0
TENANT_BUDGET = "bench-e2e"  # the end-to-end tenant, cleaned by the bench like the others


@dataclass
class PoolerConfig:
    jobs: int = 5000
    processes: int = 4
    concurrency: int = 1
    latency_jobs: int = 200
    latency_workers: int = 2
    latency_interval_ms: float = 20.0
    pool_size: int = 4
    budgets: list[int] = field(default_factory=lambda: [1, 8])


@dataclass
class PoolerResults:
    config: PoolerConfig
    rates: dict[str, float] = field(default_factory=dict)  # mode → jobs/s
    latency_ms: dict[str, list[float]] = field(default_factory=dict)  # mode → samples
    budget: list[tuple[int, int, int]] = field(default_factory=list)  # (concurrency, idle, busy), direct
    pooled_own: tuple[int, int] | None = None  # behind the pooler, busy: (its own backends, all client backends)
    version: str = ""


def pooler_bench(config: PoolerConfig, *, progress=lambda message: None) -> PoolerResults:
    if connection.vendor != "postgresql":
        raise BenchError("bench --pooler needs PostgreSQL (DATABASE_URL=postgres://…)")
    direct = database_url()
    try:
        bouncer = start_pgbouncer(dbname=connection.settings_dict["NAME"],
                                  host=connection.settings_dict.get("HOST") or "127.0.0.1",
                                  port=int(connection.settings_dict.get("PORT") or 5432), pool_size=config.pool_size)
    except PgBouncerError as exc:
        raise BenchError(str(exc)) from exc
    results = PoolerResults(config)
    pooled_env = {"DATABASE_URL": bouncer.url + "?conn_max_age=600", "DATABASE_POOL_MODE": "transaction",
                  "DATABASE_LISTEN_URL": direct.split("?")[0]}
    modes = {"direct": {}, "pooled": pooled_env}
    try:
        import subprocess

        results.version = subprocess.run([bouncer.process.args[0], "--version"], capture_output=True,
                                         text=True).stdout.splitlines()[0]
        for mode, env in modes.items():
            progress(f"pooler: {config.jobs} jobs through {config.processes} worker(s), {mode}")
            results.rates[mode] = _throughput(config, env)
        for mode, env in modes.items():
            progress(f"pooler: insert→start latency, {config.latency_jobs} jobs, {mode}")
            results.latency_ms[mode] = _latency(config, env)
        for concurrency in config.budgets:
            progress(f"pooler: connections of one worker at concurrency {concurrency}")
            results.budget.append((concurrency, *_connections(concurrency, {})))
        progress("pooler: connections of one worker behind the pooler, concurrency 8")
        results.pooled_own = _connections(max(config.budgets), pooled_env, pooled=True)
    finally:
        delete_tenants([TENANT_E2E, TENANT_LATENCY])
        bouncer.stop()
    return results


def _throughput(config: PoolerConfig, env: dict) -> float:
    delete_tenants([TENANT_E2E])
    # Each run on a table without the previous run's dead rows (the pooled
    # run came second and paid for the direct run's; autovacuum may be off).
    vacuum()
    args = ("--concurrency", str(config.concurrency)) if config.concurrency > 1 else ()
    with WorkerFleet(config.processes, label="pooler", poll_interval=0.5, args=args, env=env) as fleet:
        specs = [JobSpec(TENANT_E2E, f"e2e-{i:07d}", action=BENCH_ACTION) for i in range(config.jobs)]
        with transaction.atomic():
            Store().enqueue_many(specs)
        started = db_now()
        wait_done(config.jobs, fleet)
        finished = last_finish()
    delete_tenants([TENANT_E2E])
    return config.jobs / max((as_aware(finished) - started).total_seconds(), 1e-6)


def _latency(config: PoolerConfig, env: dict) -> list[float]:
    delete_tenants([TENANT_LATENCY])
    with WorkerFleet(config.latency_workers, label="latency", poll_interval=1.0, env=env) as fleet:
        enqueue_paced("notify", config.latency_jobs, config.latency_interval_ms)
        wait_done(config.latency_jobs, fleet)
    samples = start_delays_ms().get("notify", [])
    delete_tenants([TENANT_LATENCY])
    return samples


def _backends(application_name: str | None = None, *, exclude_self: bool = True) -> int:
    with connection.cursor() as cursor:
        if application_name is None:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        else:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name])
        return cursor.fetchone()[0]


def _most(count, samples: int = 20) -> int:
    seen = 0
    for _ in range(samples):
        seen = max(seen, count())
        time.sleep(0.1)
    return seen


def _connections(concurrency: int, env: dict, *, pooled: bool = False) -> tuple[int, int]:
    """(idle, busy) server backends of one worker process named after it;
    behind the pooler (`pooled`): (its own backends, all the database's
    client backends but this process's) while busy."""
    delete_tenants([TENANT_BUDGET])
    with WorkerFleet(1, label=f"budget{concurrency}", poll_interval=0.5,
                     args=("--concurrency", str(concurrency), "--lease-ttl", "3"), env=env) as fleet:
        worker_id = next(arg for arg in fleet.procs[0].args if arg.startswith("bench-budget"))
        name = f"durable-worker {worker_id}"[:63]
        store = Store()
        store.enqueue(TENANT_BUDGET, "warm-up", action=BENCH_ACTION)
        wait_done(1, fleet)
        idle = _most(lambda: _backends(name))
        for n in range(concurrency):
            store.enqueue(TENANT_BUDGET, f"busy-{n}", action=BENCH_ACTION, payload={"hold": 4})
        time.sleep(0.5)
        if pooled:
            own = _most(lambda: _backends(name))
            everyone = _most(lambda: _backends())
            wait_done(concurrency, fleet)
            delete_tenants([TENANT_BUDGET])
            return own, everyone
        busy = _most(lambda: _backends(name))
        wait_done(concurrency, fleet)
    delete_tenants([TENANT_BUDGET])
    return idle, busy


def render_pooler(results: PoolerResults) -> str:
    c = results.config
    lines = [f"bench --pooler: direct vs {results.version or 'PgBouncer'} (pool_mode = transaction, "
             f"default_pool_size = {c.pool_size}); {c.processes} worker process(es) × concurrency {c.concurrency}",
             ""]
    direct, pooled = results.rates.get("direct"), results.rates.get("pooled")
    share = pooled / direct if direct and pooled else None
    rows = [["throughput (jobs/s)", f"{direct:,.0f}", f"{pooled:,.0f}",
             "n/a" if share is None else f"{share:.2f}× direct, goal ≥ {TARGET_SHARE:.1f}× "
             f"{verdict(share >= TARGET_SHARE)}"]]
    for p in (50, 90):
        d = percentile(results.latency_ms.get("direct", []), p)
        q = percentile(results.latency_ms.get("pooled", []), p)
        target = f"< {TARGET_P50_MS:.0f} ms pooled {verdict(q < TARGET_P50_MS)}" if p == 50 else ""
        rows.append([f"insert→start p{p} (ms)", f"{d:.1f}", f"{q:.1f}", target])
    lines += table(["", "direct", "pooled", "goal"], rows)
    lines += ["", f"(latency: {c.latency_jobs} jobs one every {c.latency_interval_ms:.0f} ms, "
                  f"{c.latency_workers} idle workers polling every 1 s; the pooled workers LISTEN through "
                  "DATABASE_LISTEN_URL)", ""]
    budget_rows = [[str(n), str(idle), str(busy), f"{n + 1} {verdict(max(idle, busy) <= n + 1)}"]
                   for n, idle, busy in results.budget]
    lines += table(["concurrency", "idle", "busy", "budget"], budget_rows)
    lines.append("(server backends of one direct worker process, by application_name, most seen over 2 s)")
    if results.pooled_own:
        own, everyone = results.pooled_own
        lines.append(f"behind the pooler at concurrency {max(c.budgets)}, busy: {own} backend(s) named after the "
                     f"worker (its direct LISTEN, and the pool's server connections, which PgBouncer names after "
                     f"the client it last served); all client backends of the database: {everyone} "
                     f"(at most the pool's {c.pool_size} server connections plus the LISTENs, whatever the "
                     f"number of workers)")
    return "\n".join(lines) + "\n"
