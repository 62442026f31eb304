"""The benchmarks behind `manage.py bench` (and `bench_gateway`,
`bench_retention`): one run on the configured database, one plain-text
table, each figure next to its target. Speed is measured here and never
asserted by a timed test (DESIGN §12).

Where each part is: the run (`run.py`: every section in turn, cleaned up
before and after), what it is asked and what it measured (`figures.py`),
the table (`report.py`), the worker processes it starts (`fleet.py`), what
it reads of the database and the host (`meters.py`), and what all share
(`common.py`: the bench's tenants, loading and deleting their rows). Then
one module per kind of figure:

- **enqueue rate** (`throughput.py`): `Store.enqueue` one job at a time,
  and `Store.enqueue_many`, with the WAL bytes each writes per job
  (PostgreSQL).
- **enqueue vs peers** (`peers.py`): `Store.enqueue_many` beside
  pgqueuer's list enqueue (with a dedupe key per job, and without), in
  turns, at `--peer-jobs` jobs; skipped with a line when pgqueuer (the
  optional `peers` extra) is not installed.
- **end-to-end throughput** (`throughput.py`, beside `reference.py`):
  `--jobs` no-op jobs committed at once in front of N idle, LISTENing
  `manage.py run_worker` processes (real OS processes, started and idle
  *before* the clock starts, so interpreter start-up is not counted); from
  the commit to the last `finished_at`, both on the database's clock. The
  workers take the default path users run — no `--tenant`, so the fair
  claim — restricted only by `--action jobs.bench_noop` so they never take
  anyone else's jobs. The same number of jobs then goes through N processes
  of a minimal raw-psycopg `SKIP LOCKED` loop on a table of its own
  (PostgreSQL only), in the same run. Then the same with the jobs spread
  over `--tenants` tenants, and with `run_worker --batch N` next to the raw
  loop claiming and finishing N at a time.
- **insert→start latency** (`latency.py`): jobs enqueued one at a time, in
  front of idle workers; the job's `enqueue` event vs its `claim` event,
  both stamped by the database clock. Once with NOTIFY, once with this
  process's NOTIFY switched off, which leaves the workers' polling fallback.
- **claim time** (`claims.py`): the median default claim of one job (and
  the claim and its finish) over a small READY set, with the table as
  found, then with `--rows` DONE rows, then with `--rows` WAITING_EXTERNAL
  rows; with one tenant holding READY work and with `--claim-tenants`
  tenants holding it; of 1 and of 100 jobs from one tenant's READY backlog,
  shallow, then `--backlog` jobs deep, with planner statistics taken while
  many tenants each held a few READY jobs (a burst behind the last ANALYZE:
  they expect fewer READY jobs of the tenant than a batch) — a claim reads
  the backlog's head, so deep it costs what it costs shallow.
- **peak RSS per worker** (`fleet.py`): each `run_worker` process's
  high-water mark (`VmHWM` in /proc/<pid>/status, Linux), read just before
  it is stopped.
- **the console** (`changelist.py`, `queues.py`): the jobs changelist and
  the review queues with many rows in the table, and one bulk approve.
- apart, behind their own flag or command: `pooler.py` (`bench --pooler`),
  `gateway.py` (`bench_gateway`), `retention.py` (`bench_retention`).

Whose data it touches: only the tenants in `BENCH_TENANTS` (all named
`bench-…`) and the table `bench_reference_jobs`, which it creates and drops.
It deletes leftovers there before it starts and everything there when it
ends, by exact tenant name — never TRUNCATE, never a pattern that could
match a user's tenant. Its workers and claims are restricted to its own
action (`jobs.bench_noop`); like any worker they also run the engine's
maintenance (lease recovery, timers, outbox relay).
"""
