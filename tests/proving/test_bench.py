"""`manage.py bench` smoke test: every section is printed and the bench
leaves nothing behind. Speed is never asserted here (DESIGN §12)."""

import importlib.util
import re
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from proving.bench import claims, fleet, run, throughput
from proving.bench.common import BENCH_ACTION, BENCH_TENANTS, REFERENCE_TABLE, TENANT_E2E, delete_tenants, vacuum
from proving.bench.figures import BenchConfig, Results, Throughput
from proving.bench.fleet import WorkerFleet, last_finish, wait_done
from proving.bench.report import render
from jobs.models import Job, JobEvent, JobSearch
from jobs.store import JobSpec, Store

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def test_bench_prints_every_section_and_removes_only_its_own_rows(manage):
    store = Store()
    # A user's work, including a tenant that merely looks like the bench's.
    store.enqueue("studio", "send-quote-017")
    store.enqueue("bench-press-gym", "invoice-reminder-3")
    # A leftover of an interrupted bench run.
    store.enqueue("bench-e2e", "e2e-leftover")

    result = manage.run("bench", "--quick", "--processes", "1", "--rows", "2000", "--jobs", "200",
                        "--latency-jobs", "10", "--claims", "50", "--backlog", "3000", timeout=170)

    out = result.stdout
    for section in ("ENQUEUE", "END TO END", "INSERT → START LATENCY", "CLAIM TIME VS TABLE SIZE",
                    "CLAIM TIME VS BACKLOG", "PEAK RSS PER WORKER PROCESS", "JOBS CHANGELIST", "CONSOLE QUEUES"):
        assert section in out, out
    assert "1 process" in out
    assert "bulk approve of 500 items through the single-decision path: 500 decided" in out, out
    # The queues' rows are loaded with their search rows: the job list finds its one recipient.
    assert re.search(r"job list: q = one recipient +1 ", out), out
    assert "+ 2,000 DONE" in out and "+ 2,000 WAITING_EXTERNAL" in out
    # Claims of 1 and of 100 from a shallow backlog (what 20 timed claims and
    # 3 untimed take) and from --backlog deep, each deep one against its
    # shallow one.
    for batch in (1, 100):
        assert re.search(rf"claim {batch}, 2,323 READY +[\d.]+ +[\d.]+ +1\.00× ", out), out
        assert re.search(rf"claim {batch}, 3,000 READY +[\d.]+ +[\d.]+ +[\d.]+× +(ok|MISS) ", out), out
    # The lease cap's rows: the same work over 10 tenants, uncapped then capped.
    assert "1 process, 10 tenants" in out and "1 process, 10 tenants, lease cap 2" in out
    assert re.search(r"Lease cap 2 over 10 tenants: [\d,]+ jobs/s against [\d,]+ uncapped", out), out
    if connection.vendor == "postgresql":
        assert "NOTIFY (workers poll every 1 s)" in out
        # WAL bytes per job, ours / the raw loop's: both measured, and
        # their ratio against the goal; and the CPU per job of each side's
        # clients and of the rest of the host.
        assert re.search(r"  1 process .* [\d,]+ / [\d,]+ +[\d.]+× (ok|MISS) +[\d,]+\+[\d,]+ / [\d,]+\+[\d,]+ ", out), out
        # And what each enqueue wrote, before any worker saw the job.
        assert re.search(r"batched \(Store.enqueue_many\) +200 +[\d.]+ +[\d,]+ +[\d,]+\n", out), out
    else:
        assert "n/a" in out  # no reference loop on SQLite
        # Our workers' CPU is read all the same.
        assert re.search(r"  1 process .* n/a +[\d,]+\+[\d,]+ / n/a ", out), out
        assert re.search(r"batched \(Store.enqueue_many\) +200 +[\d.]+ +[\d,]+ +n/a\n", out), out

    # Beside pgqueuer's list enqueue where it can run; else a line says why not.
    if connection.vendor == "postgresql" and importlib.util.find_spec("pgqueuer") is not None:
        assert re.search(r"1,000 jobs vs pgqueuer, a dedupe key per job +[\d,]+ +[\d,]+ +[\d.]+× +(ok|MISS)", out), out
        assert "1,000 jobs vs pgqueuer, no keys" in out
    else:
        assert "pgqueuer row skipped: " in out, out
    assert not Job.objects.filter(tenant__in=BENCH_TENANTS).exists()
    assert not JobSearch.objects.filter(tenant__in=BENCH_TENANTS).exists()
    assert REFERENCE_TABLE not in connection.introspection.table_names()
    # The user's jobs are untouched: still there, still READY (bench workers
    # only claim the bench's tenants).
    assert set(Job.objects.values_list("tenant", "key", "state")) == {
        ("studio", "send-quote-017", "READY"),
        ("bench-press-gym", "invoice-reminder-3", "READY"),
    }


def test_repeated_pairs_give_median_rates_and_the_median_and_range_of_their_ratios():
    """`--repeat`: each pair's ours/ref is its own; the row shows their
    median and range, and the median rates."""
    row = Throughput(4, 1000, runs=[(1.0, 2_000_000), (2.0, 2_100_000), (1.25, 1_900_000)],
                     ref_runs=[(0.5, 600_000), (1.0, 600_000), (1.25, 600_000)], claimed_by=[250] * 4)
    assert row.ratios == [0.5, 0.5, 1.0]
    assert row.ratio == 0.5
    assert row.rate == 1000 / 1.25 and row.ref_rate == 1000 / 1.0
    assert row.wal_per_job(row.runs) == 2000 and row.wal_per_job(row.ref_runs) == 600
    out = render(Results(throughput=[row]))
    assert "3 pairs of runs per row" in out
    line = next(line for line in out.splitlines() if line.startswith("  4 processes"))
    assert "50% (50%–100%)" in line and "2,000 / 600" in line and "MISS" in line
    # No CPU figures read: n/a on both sides.
    assert "n/a / n/a" in line


def test_each_row_is_judged_by_its_own_goal_share_rate_and_wal():
    """The goals, row by row: 80 % of the raw loop, 75 % from 10,000
    tenants, 60 % for --batch 100 beside the batched rate, none of the
    share for --batch 10 (its rate only), the capped row by its share of
    the uncapped one (under the table); WAL at most twice the raw loop's."""
    def line(ratio, wal_ratio=1.5, jobs=1000, **row):
        # The raw loop took 1 s and wrote 1,000 B per job.
        t = Throughput(4, jobs, runs=[(1.0 / ratio, jobs * wal_ratio * 1000)], ref_runs=[(1.0, jobs * 1000)], **row)
        return next(x for x in render(Results(throughput=[t])).splitlines() if x.startswith("  4 processes"))

    assert "MISS (≥ 80%)" in line(0.78, tenants=1000)
    assert "ok (≥ 80%)" in line(0.81, tenants=1000)
    assert "ok (≥ 75%)" in line(0.76, tenants=10_000)
    assert "MISS (≥ 75%)" in line(0.74, tenants=10_000)
    assert "MISS (≥ 60%); ok (≥ 10,000/s)" in line(0.50, jobs=100_000, batch=100)
    assert "ok (≥ 60%); MISS (≥ 10,000/s)" in line(0.61, jobs=10_000, batch=100)
    batch_10 = line(0.50, jobs=100_000, batch=10)
    assert "ok (≥ 10,000/s)" in batch_10 and "%)" not in batch_10
    assert "(below)" in line(0.5, tenants=10, lease_cap=2)
    assert "1.50× ok" in line(0.9) and "2.10× MISS" in line(0.9, wal_ratio=2.1)


def test_cpu_per_job_is_the_median_of_the_runs_for_the_clients_and_the_rest_of_the_host():
    row = Throughput(4, 1000, runs=[(1.0, None)] * 3, ref_runs=[(1.0, None)] * 3,
                     cpu=[(0.9, 0.8), (1.1, 0.7), None], ref_cpu=[(0.5, 0.75), (0.6, 0.8), (0.55, 0.7)])
    assert row.cpu_us_per_job(row.cpu) == pytest.approx((1000, 750))
    assert row.cpu_us_per_job(row.ref_cpu) == pytest.approx((550, 750))
    line = next(line for line in render(Results(throughput=[row])).splitlines() if line.startswith("  4 processes"))
    assert "1,000+750 / 550+750" in line


def test_cpu_is_read_from_proc_for_processes_and_the_host():
    """The clients' CPU is their own processes'; the rest is the host's busy
    time less theirs, never below nothing."""
    import os
    import time as _time

    from proving.bench.meters import cpu_now, cpu_since

    before = cpu_now([os.getpid()])
    if before is None:
        pytest.skip("no /proc on this system")
    spin_until = _time.process_time() + 0.2
    while _time.process_time() < spin_until:
        pass
    after = cpu_now([os.getpid()])
    clients, rest = cpu_since(before, after)
    assert clients >= 0.15 and rest >= 0.0
    assert cpu_now([2 ** 22 + 7]) is None  # a process that does not exist
    assert cpu_since(None, after) is None


def test_the_capped_row_is_compared_with_the_uncapped_one_over_the_same_tenants():
    uncapped = Throughput(4, 1000, runs=[(1.0, None)], tenants=10)
    capped = Throughput(4, 1000, runs=[(2.5, None)], tenants=10, lease_cap=2)
    out = render(Results(throughput=[uncapped, capped]))
    assert "4 processes, 10 tenants, lease cap 2" in out
    assert "Lease cap 2 over 10 tenants: 400 jobs/s against 1,000 uncapped, 40% of it (MISS" in out
    assert "(ok" in render(Results(throughput=[uncapped, Throughput(4, 1000, runs=[(1.5, None)], tenants=10,
                                                                      lease_cap=2)]))


def test_end_to_end_pairs_run_in_turns_and_each_ratio_is_its_own_pairs():
    """`--repeat 3`: ours then the raw loop, then the raw loop first, then
    ours first again — a host slowing down during a row must not always
    slow the same side — and each pair's ratio is of its own two runs."""
    calls = []
    ours_seconds, ref_seconds = iter([2.0, 4.0, 1.0]), iter([1.0, 3.0, 0.5])

    def ours(jobs, processes, results, **kwargs):
        calls.append("ours")
        return next(ours_seconds), None, [jobs], None

    def ref(jobs, processes, **kwargs):
        calls.append("ref")
        return next(ref_seconds), None, None

    config = BenchConfig(jobs=100, processes=[4], tenants=[], batches=[], lease_cap=0, repeat=3)
    results = Results()
    with mock.patch.object(throughput, "_throughput_ours", ours), \
            mock.patch.object(throughput, "throughput_reference", ref), \
            mock.patch.object(throughput, "connection", mock.Mock(vendor="postgresql")):
        throughput.throughput_all(config, results, progress=lambda message: None)
    assert calls == ["ours", "ref", "ref", "ours", "ours", "ref"]
    (row,) = results.throughput
    assert row.ratios == [0.5, 0.5, 0.75]


def test_claim_time_vs_tenants_runs_its_cases_in_turns_and_gives_the_median_and_range_of_the_rounds_ratios():
    """`--repeat 3`: one tenant and many tenants run in turns, the order
    swapped each round; each round's ratio is its own (a slow round slows
    both of its cases), and the row shows their median and range."""
    calls = []
    timings = iter([(1.0, 2.0, 40), (1.9, 2.5, 44),   # round 1: one, many (1.9×)
                    (6.0, 7.0, 43), (4.0, 5.0, 40),   # round 2 (a slow one): many, one (1.5×)
                    (0.5, 1.0, 40), (0.6, 1.2, 42)])  # round 3: one, many (1.2×)

    def claim_times(case, claims, tenants=None):
        calls.append((case, len(tenants) if tenants else 1))
        return next(timings)

    with mock.patch.object(claims, "_claim_times", claim_times):
        cases = claims.claim_vs_tenants(BenchConfig(claims=5, claim_tenants=10, repeat=3))
    assert calls == [("one", 1), ("many", 10), ("many", 10), ("one", 1), ("one", 1), ("many", 10)]
    one, many = cases
    assert (one.claim_ms, one.claim_finish_ms, one.buffers) == (1.0, 2.0, 40)
    assert (many.claim_ms, many.claim_finish_ms, many.buffers) == (1.9, 2.5, 43)
    assert many.ratios == [1.2, 1.5, 1.9]
    out = render(Results(tenant_claims=cases, claim_count=5))
    assert "3 rounds in turns" in out
    line = next(line for line in out.splitlines() if line.startswith("  10 tenants with READY work"))
    # The median of the rounds' ratios (1.5×), not the ratio of the medians (1.9 / 1.0).
    assert "1.50× (1.20–1.90×)" in line and "ok" in line
    # One round: the ratio of the two medians, no range.
    with mock.patch.object(claims, "_claim_times", lambda case, claims, tenants=None: (
            (1.0, 2.0, 40) if tenants is None else (2.5, 3.0, 41))):
        single = claims.claim_vs_tenants(BenchConfig(claims=5, claim_tenants=10))
    line = next(line for line in render(Results(tenant_claims=single, claim_count=5)).splitlines()
                if line.startswith("  10 tenants with READY work"))
    assert "2.50×" in line and "–" not in line and "MISS" in line


@pytest.mark.postgres
def test_each_claim_time_case_starts_without_the_dead_rows_the_case_before_left():
    """Two thousand tenants in and out of the sample table leave it pages of
    dead rows, and the one-tenant claim's check reads that table whole: the
    one-tenant case run after them must start on the table a VACUUM left
    (its own tenant's page), not on the many-tenant case's leftovers."""
    seen = []
    time_claims = claims._time_claims

    def measured(claims, warmup, batch=1):
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*), pg_relation_size('jobs_readytenant') / current_setting('block_size')::int "
                           "FROM jobs_readytenant")
            seen.append(cursor.fetchone())
        return time_claims(claims, warmup, batch)

    try:
        with mock.patch.object(claims, "_time_claims", measured):
            claims.claim_vs_tenants(BenchConfig(claims=3, claim_tenants=2000, repeat=2))
    finally:
        run.bench_cleanup()
    # Round 1: one, then many; round 2: many, then one — right after the many.
    assert [tenants for tenants, _ in seen] == [1, 2000, 2000, 1]
    assert [pages for _, pages in seen][-1] == 1, seen


@pytest.mark.django_db
def test_repeat_must_be_at_least_one():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="argument --repeat: must be a whole number at least 1"):
        call_command("bench", "--repeat", "0")


@pytest.mark.postgres
def test_removing_a_tenant_s_rows_joins_nothing_even_where_the_statistics_call_the_tables_empty():
    """The bench vacuums its tables between rows; vacuumed empty, then
    filled by the next row, a table is taken for empty (one row) until it
    is analysed. A delete that joined the row's ids to such a table was
    planned as a nested loop going through every id for each of its rows.
    Each delete must name the ids in a way no estimate can turn into a join
    — and remove that tenant's rows, and no one else's."""
    store = Store()
    vacuum()  # the tables as the bench leaves them between rows: empty, just vacuumed
    store.enqueue_many([JobSpec(TENANT_E2E, f"e2e-{i:05d}") for i in range(3000)])
    kept = store.enqueue("studio", "send-quote-017")
    Job.objects.filter(tenant=TENANT_E2E).update(state="DONE")

    with CaptureQueriesContext(connection) as captured:
        delete_tenants([TENANT_E2E])

    deletes = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 5, deletes
    with connection.cursor() as cursor:
        for sql in deletes:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Nested Loop" not in plan and "Join" not in plan, plan
    assert not Job.objects.filter(tenant=TENANT_E2E).exists()
    assert not JobSearch.objects.filter(tenant=TENANT_E2E).exists()
    assert list(Job.objects.values_list("id", flat=True)) == [kept.id]
    assert JobSearch.objects.filter(job_id=kept.id).exists()
    assert JobEvent.objects.filter(job_id=kept.id).exists()


def test_a_run_s_end_is_read_from_the_job_table_alone_and_is_its_last_finish():
    """A run ends at its last job's finish. Read by joining the history to
    the jobs, on a fresh cluster whose tables autovacuum has not analysed
    yet, it is planned as a nested loop reading the whole history for each
    job. The query names one table, and gives the newest finish of the
    bench's own jobs, not another action's."""
    store = Store()
    store.enqueue_many([JobSpec(TENANT_E2E, f"e2e-{i:05d}", action=BENCH_ACTION) for i in range(3)])
    other = store.enqueue("studio", "send-quote-017")
    for job in Job.objects.filter(tenant=TENANT_E2E):
        epoch = store.claim(job.tenant, job.key, "w-1", ttl=30)
        store.finish(job.tenant, job.key, "w-1", epoch)
    epoch = store.claim(other.tenant, other.key, "w-1", ttl=30)
    store.finish(other.tenant, other.key, "w-1", epoch)

    with CaptureQueriesContext(connection) as captured:
        last = last_finish()

    (sql,) = [q["sql"] for q in captured.captured_queries]
    assert "JOIN" not in sql.upper() and "jobs_jobevent" not in sql, sql
    finishes = JobEvent.objects.filter(kind="finish", job__tenant=TENANT_E2E).values_list("created_at", flat=True)
    assert last == max(finishes)
    assert last < Job.objects.get(pk=other.pk).finished_at
    delete_tenants([TENANT_E2E])


def test_a_fleet_counts_the_successes_its_workers_logged_reading_each_log_on_from_where_it_stopped(tmp_path):
    workers = WorkerFleet(2, label="t", poll_interval=1.0)
    workers.logs = [tmp_path / "worker-0.log", tmp_path / "worker-1.log"]
    workers.logs[0].write_bytes(b"2026-12-07T07:00:00.000+00:00 INFO    job.claim tenant=a key=k-1\n"
                              b"2026-12-07T07:00:00.001+00:00 INFO    job.done tenant=a key=k-1\n"
                              b"2026-12-07T07:00:00.002+00:00 INFO    job.done tenant=a key=k-2\n")
    workers.logs[1].write_bytes(b"2026-12-07T07:00:00.000+00:00 INFO    batch.done jobs=100\n"
                              b"2026-12-07T07:00:00.001+00:00 INFO    batch.done jobs=5")  # still being written
    assert workers.finished() == 102
    with open(workers.logs[1], "ab") as log:
        log.write(b"0 lost=1\n2026-12-07T07:00:00.002+00:00 INFO    job.failed tenant=a key=k-3\n")
    assert workers.finished() == 152
    assert workers.finished() == 152  # nothing counted twice


def test_the_wait_for_a_run_s_end_asks_the_database_only_once_the_logs_count_every_job():
    """The reference's processes report their own end; a question to the
    database four times a second would take CPU from our rows alone."""
    counts = iter([0, 0, 0, 5])
    workers = mock.Mock(finished=lambda: next(counts))
    with mock.patch.object(fleet.time, "sleep"), CaptureQueriesContext(connection) as captured:
        wait_done(5, workers)
    assert len(captured.captured_queries) == 2  # READY? LEASED? — asked once, when the logs said 5
