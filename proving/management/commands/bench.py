import argparse
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from durable.numbers import NumberRefused, number_flag, whole_flag, whole_number
from proving.bench.common import BENCH_TENANTS, MANY_TENANTS, REFERENCE_TABLE, BenchError
from proving.bench.figures import BenchConfig
from proving.bench.report import render
from proving.bench.run import bench_run

QUICK = {"jobs": 1000, "rows": 50_000, "latency_jobs": 50, "claims": 200, "batch_jobs": 2000,
         "tenants": "1000", "claim_tenants": 2000,
         "backlog": 20_000, "peer_jobs": "1000"}
FULL = {"jobs": 5000, "rows": 1_000_000, "latency_jobs": 200, "claims": 500, "batch_jobs": 100_000,
        "tenants": "1000,10000", "claim_tenants": 10_000,
        "backlog": 200_000, "peer_jobs": "3000,20000"}


class Command(BaseCommand):
    help = (
        "Speed figures on the configured database (DATABASE_URL), one run, one table: enqueue rate "
        "and WAL bytes per job (one by one and enqueue_many); end-to-end no-op jobs/s through 1, 2, 4, 8 default run_worker "
        "processes (no --tenant: the fair claim users run) next to a minimal raw-psycopg SKIP LOCKED loop "
        "in the same run (PostgreSQL only; n/a on SQLite), with the WAL bytes each writes per job (--repeat "
        "N: N such pairs side by side per row, medians), then with the jobs spread over --tenants "
        "tenants, then with run_worker --batch 10 and 100 next to the raw loop claiming as many at once, "
        "then over 10 tenants uncapped and with JOBS_TENANT_LEASE_CAP=--lease-cap; "
        "insert→start latency p50/p95/p99 with NOTIFY and with polling only; the seconds from kill -9 of a "
        "worker mid-handler to its job running again in a worker started right after (same host, same "
        "--worker-id; --repeat N: N rounds); claim time with one tenant "
        "vs --claim-tenants tenants holding READY work (with --repeat N, N rounds of the two in turns); claim time of 1 and 100 jobs from one tenant's READY "
        "backlog, shallow then --backlog deep, under planner statistics taken while many tenants held a "
        "few READY jobs each (VACUUM (ANALYZE) of jobs_job, run again after); claim time with the table "
        "as found vs +--rows DONE vs +--rows WAITING_EXTERNAL rows; peak RSS per worker process; the admin's "
        "jobs changelist (plain, by state, by tenant, key search) with --rows DONE jobs in the table; the "
        "console queues (text search, filters by proposer, age, assignee and tenant, the job list's search) "
        "with --queue-rows jobs in the table and one bulk approve of 500 items (time, queries). Each "
        "figure is printed next to its target (ok/MISS); targets are goals, not tests. "
        "It works only in its own tenants (bench-enqueue, bench-e2e, bench-latency, bench-claim, bench-recovery, "
        "bench-bulk-00…49, bench-many-00000…09999) with its own action (jobs.bench_noop: its workers run "
        "with --action jobs.bench_noop and never take other jobs) and the table bench_reference_jobs: it "
        "deletes leftovers there before it "
        "starts and everything there when it ends; other tenants' rows are never touched (on PostgreSQL "
        "the claim section runs a plain VACUUM (ANALYZE) on jobs_job, which blocks no reads or writes; like any "
        "worker, its workers also run lease recovery, timers and the outbox relay). "
        "Examples: `python manage.py bench`, `python manage.py bench --quick`, "
        "`make bench BENCH_ARGS='--rows 100000 --processes 1,2'`. Progress goes to stderr, the table "
        "to stdout."
    )

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=COUNT, default=None,
                            help=f"Jobs per end-to-end run and for enqueue_many (default {FULL['jobs']}; "
                                 "one-by-one enqueue uses at most 2000).")
        parser.add_argument("--rows", type=whole_flag(0, 100_000_000), default=None,
                            help=f"DONE, then WAITING_EXTERNAL rows bulk-loaded for the claim-time section "
                                 f"(default {FULL['rows']:,}).")
        parser.add_argument("--processes", type=_counts(1, 64), default="1,2,4,8",
                            help="Worker process counts for the end-to-end runs, comma-separated (default 1,2,4,8).")
        parser.add_argument("--latency-jobs", type=COUNT, default=None,
                            help=f"Jobs enqueued one at a time per latency row (default {FULL['latency_jobs']}).")
        parser.add_argument("--latency-workers", type=whole_flag(1, 64), default=2,
                            help="Idle worker processes waiting for the latency jobs (default 2).")
        parser.add_argument("--latency-interval", type=number_flag(minimum=0, maximum=60_000), default=20.0,
                            help="Milliseconds between two latency jobs (default 20).")
        parser.add_argument("--claims", type=COUNT, default=None,
                            help=f"Claims timed per table size (default {FULL['claims']}).")
        parser.add_argument("--skip-bulk", action="store_true",
                            help="Skip the bulk loads: claim time is measured on the table as found only.")
        parser.add_argument("--tenants", type=_counts(0, len(MANY_TENANTS)), default=None,
                            help="Tenant counts for the many-tenant end-to-end rows, comma-separated, at most "
                                 f"10000 (default {FULL['tenants']}; 0 skips them). Those rows, and the batched "
                                 "ones, run with 4 processes (fewer if --processes asks for fewer).")
        parser.add_argument("--batches", type=_counts(0, 1000), default="10,100",
                            help="run_worker --batch sizes for the batched rows, comma-separated (default "
                                 "10,100; 0 skips them).")
        parser.add_argument("--batch-jobs", type=COUNT, default=None,
                            help=f"Jobs per batched run (default {FULL['batch_jobs']:,}).")
        parser.add_argument("--claim-tenants", type=whole_flag(1, len(MANY_TENANTS)), default=None,
                            help=f"Tenants holding READY work in the claim-time-vs-tenants row, at most 10000 "
                                 f"(default {FULL['claim_tenants']:,}).")
        parser.add_argument("--backlog", type=whole_flag(0, 10_000_000), default=None,
                            help="READY jobs in one tenant for the deep row of claim time vs backlog (default "
                                 f"{FULL['backlog']:,}; 0 skips the section).")
        parser.add_argument("--peer-jobs", type=_counts(0, 1_000_000), default=None,
                            help="Jobs per enqueue row beside a peer's bulk enqueue (pgqueuer, when installed), "
                                 f"comma-separated (default {FULL['peer_jobs']}; 0 skips the rows).")
        parser.add_argument("--repeat", type=whole_flag(1, 100), default=1,
                            help="Pairs of runs (ours and the raw loop) per end-to-end row, side by side, "
                                 "in turns: ours first, then the raw loop first (default 1). The rows then give "
                                 "the median rates and the median and range of the pairs' ours/ref: on a machine whose speed drifts, a pair's ratio is "
                                 "steadier than one run's. The claim time vs tenants runs that many rounds of its "
                                 "two cases in turns, likewise.")
        parser.add_argument("--lease-cap", type=whole_flag(0, 1000), default=2,
                            help="JOBS_TENANT_LEASE_CAP for the capped row: the same no-op jobs over 10 tenants, "
                                 "uncapped then capped, each beside the raw loop, and the capped/uncapped share "
                                 "(target ≥ 50 %%: within 2×; default 2; 0 skips both rows).")
        parser.add_argument("--queue-rows", type=whole_flag(0, 100_000_000), default=None,
                            help="Jobs loaded for the console queues' section (search, filters, a bulk approve "
                                 "of 500; default: --rows; 0 skips it).")
        parser.add_argument("--queues-only", action="store_true",
                            help="Run only the console queues' section (with --queue-rows jobs).")
        parser.add_argument("--pooler", action="store_true",
                            help="Only the pooler section (PostgreSQL, PgBouncer installed): --jobs no-op jobs "
                                 "through --pooler-processes workers direct, then through a private PgBouncer "
                                 "in transaction mode (DATABASE_POOL_MODE=transaction, the LISTEN direct), "
                                 "insert→start latency p50/p90 both ways, and one worker's server connections "
                                 "at concurrency 1 and 8, idle and busy.")
        parser.add_argument("--pooler-processes", type=whole_flag(1, 64), default=4,
                            help="Worker processes for the --pooler throughput rows (default 4).")
        parser.add_argument("--pool-size", type=whole_flag(1, 1000), default=4,
                            help="PgBouncer's default_pool_size for --pooler (default 4).")
        parser.add_argument("--quick", action="store_true",
                            help="Small sizes: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                                 + " (explicit options win).")

    def handle(self, *args, **opts):
        # Every number was range-checked by the parser (`durable.numbers`);
        # an option's default value is given as text and parsed the same way.
        sizes = QUICK if opts["quick"] else FULL
        processes = _list(opts["processes"], 1, 64)
        chosen = opts["tenants"] if opts["tenants"] is not None else sizes["tenants"]
        tenants = [t for t in _list(chosen, 0, len(MANY_TENANTS)) if t]
        batches = [b for b in _list(opts["batches"], 0, 1000) if b]
        peer_jobs = [n for n in _list(opts["peer_jobs"] if opts["peer_jobs"] is not None else sizes["peer_jobs"],
                                      0, 1_000_000) if n]
        claim_tenants = opts["claim_tenants"] if opts["claim_tenants"] is not None else sizes["claim_tenants"]
        config = BenchConfig(
            jobs=opts["jobs"] if opts["jobs"] is not None else sizes["jobs"],
            rows=opts["rows"] if opts["rows"] is not None else sizes["rows"],
            processes=processes,
            latency_jobs=opts["latency_jobs"] if opts["latency_jobs"] is not None else sizes["latency_jobs"],
            latency_workers=opts["latency_workers"],
            latency_interval_ms=opts["latency_interval"],
            claims=opts["claims"] if opts["claims"] is not None else sizes["claims"],
            skip_bulk=opts["skip_bulk"],
            tenants=tenants,
            batches=batches,
            batch_jobs=opts["batch_jobs"] if opts["batch_jobs"] is not None else sizes["batch_jobs"],
            claim_tenants=claim_tenants,
            repeat=opts["repeat"],
            queue_rows=opts["queue_rows"],
            queues_only=opts["queues_only"],
            lease_cap=opts["lease_cap"],
            backlog=opts["backlog"] if opts["backlog"] is not None else sizes["backlog"],
            peer_jobs=peer_jobs,
        )
        if not processes:
            raise CommandError("--processes needs at least one count, e.g. 1,2,4,8")
        if opts["pooler"]:
            return self._pooler(config, opts)

        started = time.monotonic()

        def progress(message: str) -> None:
            sys.stderr.write(f"[bench {time.monotonic() - started:6.1f} s] {message}\n")
            sys.stderr.flush()

        try:
            results = bench_run(config, progress=progress)
        except BenchError as exc:
            raise CommandError(f"bench failed (its rows were cleaned up): {exc}") from exc
        self.stdout.write(render(results), ending="")
        progress(f"done; tenants {BENCH_TENANTS[0]} … {BENCH_TENANTS[-1]} and {REFERENCE_TABLE} are clean")


    def _pooler(self, config: BenchConfig, opts) -> None:
        from proving.bench.pooler import PoolerConfig, pooler_bench, render_pooler

        started = time.monotonic()

        def progress(message: str) -> None:
            sys.stderr.write(f"[bench {time.monotonic() - started:6.1f} s] {message}\n")
            sys.stderr.flush()

        pooler = PoolerConfig(jobs=config.jobs, processes=opts["pooler_processes"], latency_jobs=config.latency_jobs,
                              latency_workers=config.latency_workers, latency_interval_ms=config.latency_interval_ms,
                              pool_size=opts["pool_size"])
        try:
            results = pooler_bench(pooler, progress=progress)
        except BenchError as exc:
            raise CommandError(f"bench --pooler failed (its rows were cleaned up): {exc}") from exc
        self.stdout.write(render_pooler(results), ending="")


COUNT = whole_flag(1, 10_000_000)


def _counts(minimum: int, maximum: int):
    """An argparse `type=` for a comma-separated list of whole numbers, each in [minimum, maximum]."""

    def parse(text: str) -> list[int]:
        try:
            return [whole_number(part.strip(), minimum=minimum, maximum=maximum) for part in text.split(",")
                    if part.strip()]
        except NumberRefused as exc:
            raise argparse.ArgumentTypeError(f"must be comma-separated counts; one {exc}") from None

    parse.__name__ = "counts"
    return parse


def _list(value, minimum: int, maximum: int) -> list[int]:
    # argparse applies `type=` to a string default too; a list passes through.
    return value if isinstance(value, list) else _counts(minimum, maximum)(value)
