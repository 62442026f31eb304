"""Claims under concurrency and at scale on PostgreSQL, where fairness and
the lease cap must survive real races and large tables: the lease cap holds
with eight racing processes, batched claims pass the same race as single
ones, a claim right after a bulk load reads by primary key, and the
ready-tenant table the fair claim samples from stays right."""

import json
import multiprocessing
import re
import threading
from datetime import timedelta
from importlib import import_module

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from jobs import claim as claim_sql
from jobs.clock import Clock
from jobs.errors import Conflict
from jobs.models import Job, JobEvent, ReadyTenant
from jobs.store import _ENQUEUE_GIVEN_TABLE, JobSpec, Store, _finishes
from jobs.worker import Worker, WorkerConfig
from tests.support import auto_explained, explained, in_processes, plan_nodes, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _race(target, processes: int, *args) -> list:
    """Run `target(n, barrier, *args)` in `processes` forked processes that
    start claiming together; return their results (raising on any failure)."""
    barrier = multiprocessing.get_context("fork").Barrier(processes)
    results = in_processes(target, [(n, barrier, *args) for n in range(processes)])
    assert all(status == "ok" for status, _ in results), results
    return [r for _, r in results]


# ---------------------------------------------------------------- the lease cap


def _claim_and_hold(n, barrier, cap: int, tenants: int) -> list[str]:
    """Claim (never finishing) until every tenant's cap is used up."""
    store = Store()
    held = []
    barrier.wait(timeout=60)
    for _ in range(200):
        job = store.claim_next(f"w{n}", ttl=300)
        if job is not None:
            held.append(job.tenant)
        elif Job.objects.filter(state="LEASED").count() >= cap * tenants:
            break
    return held


@pytest.mark.parametrize("cap", [1, 3])
def test_eight_racing_claimers_never_lease_more_than_the_cap_per_tenant(cap):
    with override_settings(JOBS_TENANT_LEASE_CAP=cap):
        for _round in range(3):
            Store().enqueue_many(JobSpec(tenant, f"r{_round}-{i}") for tenant in ("a", "b") for i in range(40))
            held = [t for result in _race(_claim_and_hold, 8, cap, 2) for t in result]
            leased = {t: Job.objects.filter(tenant=t, state="LEASED").count() for t in ("a", "b")}
            # Never more than the cap — and each tenant reached it: a tenant
            # under its cap is not held back by the other's claims.
            assert leased == {"a": cap, "b": cap}, leased
            assert sorted(held) == sorted(["a"] * cap + ["b"] * cap)
            Job.objects.filter(state="LEASED").update(state="DONE", worker_id="", lease_until=None)


def _claim_finish_loop(n, barrier) -> int:
    store = Store()
    done = 0
    barrier.wait(timeout=60)
    while True:
        jobs = store.claim_batch(f"w{n}", limit=3, ttl=300)
        if not jobs:
            if not Job.objects.filter(state__in=["READY", "LEASED"]).exists():
                return done
            continue
        lost = store.finish_many(f"w{n}", [(job, None) for job in jobs])
        assert not lost
        done += len(jobs)


def _finish_and_claim_loop(n, barrier) -> int:
    """As a worker does under a cap: each batch's successes written by the
    statement that claims the next (the capped claim's second statement)."""
    store = Store()
    done, pending = 0, []
    barrier.wait(timeout=60)
    while True:
        jobs, lost = store.finish_and_claim(f"w{n}", [(job, None) for job in pending], limit=3, ttl=300)
        assert not lost
        done += len(pending)
        pending = jobs
        if not jobs and not Job.objects.filter(state__in=["READY", "LEASED"]).exists():
            return done


@override_settings(JOBS_TENANT_LEASE_CAP=2)
@pytest.mark.parametrize("loop", [_claim_finish_loop, _finish_and_claim_loop], ids=["apart", "pipelined"])
def test_under_the_cap_eight_processes_with_batches_finish_every_job_once_and_leases_never_exceed_it(loop):
    Store().enqueue_many(JobSpec(f"t{i % 4}", f"job-{i:04d}") for i in range(400))
    # A check the database makes on every claim, in the claiming transaction:
    # after the claim commits nothing else may lease more of that tenant.
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE cap_seen (tenant varchar(64), leased int)")
        cursor.execute("""
            CREATE FUNCTION cap_record() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO cap_seen SELECT tenant, count(*) FROM jobs_job
                WHERE state = 'LEASED' AND tenant IN (SELECT DISTINCT tenant FROM changed) GROUP BY tenant;
                RETURN NULL;
            END $$""")
        cursor.execute("CREATE TRIGGER cap_record AFTER UPDATE ON jobs_job REFERENCING NEW TABLE AS changed "
                       "FOR EACH STATEMENT EXECUTE FUNCTION cap_record()")
    try:
        done = _race(loop, 8)
        assert sum(done) == 400
        assert Job.objects.filter(state="DONE").count() == 400
        with connection.cursor() as cursor:
            cursor.execute("SELECT max(leased), count(*) FROM cap_seen")
            most, checks = cursor.fetchone()
        assert checks > 0 and most <= 2, most
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS cap_record ON jobs_job")
            cursor.execute("DROP FUNCTION IF EXISTS cap_record()")
            cursor.execute("DROP TABLE IF EXISTS cap_seen")


@override_settings(JOBS_TENANT_LEASE_CAP=2)
def test_work_that_falls_due_while_another_claim_is_uncommitted_does_not_take_the_tenant_past_its_cap():
    """Two claims of one tenant whose snapshots differ: A leases the tenant's two due jobs and has not
    committed; meanwhile a third, more urgent job has fallen due (B's clock is later). B's statement
    still counts no lease (A is uncommitted) and its first head is the new job, which no row lock
    protects: only the tenant's advisory lock keeps B from leasing a third job. With it, B waits for A
    and then sees the tenant at its cap."""
    store = Store()
    # (The claims' statement functions made and committed first, by a claim
    # of the same shape for another tenant: made in A's transaction, B
    # would wait for A's commit to make them too.)
    store.enqueue("warm-up", "w")
    assert [job.key for job in store.claim_batch("wA", limit=2, now=50)] == ["w"]
    store.enqueue("t", "due-1")
    store.enqueue("t", "due-2")
    store.enqueue("t", "urgent-later", priority=10, run_at=100)
    a_claimed, a_commit = threading.Event(), threading.Event()
    claimed = {}

    def claimer_a():
        try:
            with transaction.atomic():
                claimed["a"] = [j.key for j in store.claim_batch("wA", limit=2, now=50, ttl=300)]
                a_claimed.set()
                a_commit.wait(timeout=60)
        finally:
            connections.close_all()

    def claimer_b():
        try:
            claimed["b"] = [j.key for j in store.claim_batch("wB", limit=2, now=150, ttl=300)]
        finally:
            connections.close_all()

    a = threading.Thread(target=claimer_a)
    a.start()
    try:
        assert a_claimed.wait(timeout=60)
        b = threading.Thread(target=claimer_b)
        b.start()

        def b_waits_or_is_done():
            if not b.is_alive():
                return True
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                return cursor.fetchone()[0] > 0

        wait_for(b_waits_or_is_done, timeout=60, what="claimer B to wait for the tenant's lock (or to finish)")
    finally:
        a_commit.set()
        a.join(timeout=60)
    b.join(timeout=60)

    assert sorted(claimed["a"]) == ["due-1", "due-2"]
    assert claimed["b"] == []
    assert Job.objects.filter(tenant="t", state="LEASED").count() == 2


# ---------------------------------------------------------------- batched claims race like single ones


def _drain_batches(n, barrier) -> dict:
    store = Store()
    finished, conflicts, claims = [], 0, []
    barrier.wait(timeout=60)
    while True:
        jobs = store.claim_batch(f"worker-{n}", limit=1 + n * 3, ttl=60)  # 1, 4, 7 … 22 at a time
        if not jobs:
            break
        # Each job's claim as the claim returned it (`Job.claimed_at`).
        claims += [(job.pk, job.worker_id, job.claimed_at) for job in jobs]
        for job in jobs:
            # A fenced-out write (wrong epoch) must never land.
            try:
                store.finish(job.tenant, job.key, f"worker-{n}", job.lease_epoch - 1)
            except Conflict:
                conflicts += 1
        assert store.finish_many(f"worker-{n}", [(job, {"n": n}) for job in jobs]) == []
        # A second, stale batch of finishes writes nothing.
        assert len(store.finish_many(f"worker-{n}", [(job, None) for job in jobs])) == len(jobs)
        finished += [job.key for job in jobs]
    return {"finished": finished, "conflicts": conflicts, "claims": claims}


def test_eight_processes_race_batched_claims_and_each_job_is_done_exactly_once():
    Store().enqueue_many(JobSpec(f"tenant-{i % 5}", f"job-{i:04d}") for i in range(3000))
    results = _race(_drain_batches, 8)
    finished = [key for r in results for key in r["finished"]]
    assert len(finished) == 3000 and len(set(finished)) == 3000
    assert sum(1 for r in results if r["finished"]) > 1
    assert all(r["conflicts"] == len(r["finished"]) for r in results)
    assert Job.objects.filter(state="DONE").count() == 3000
    # One attempt per job (epoch 1), its one row written by the worker
    # holding it, with the time of the claim that worker got.
    attempts = JobEvent.objects.exclude(claimed_at=None)
    assert attempts.count() == attempts.filter(epoch=1, kind="finish").count() == 3000
    finishes = {(e.job_id, e.worker_id, e.claimed_at) for e in attempts}
    assert finishes == {claim for r in results for claim in r["claims"]}


# ---------------------------------------------------------------- plans


def _assert_claim_plan(limit: int, actions=None) -> None:
    sql, params = claim_sql._statement(claim_sql._FAIR_PG, "w", Clock(None), 30, None, actions, limit)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = list(plan_nodes(plan[0]["Plan"]))
    on_jobs = [scan[:2] for scan in _scans_of_jobs(plan)]
    # The row to lease is updated by primary key, the heads read from the
    # claim index in claim order: no sequential scan of the table, no
    # bitmap scan but of primary keys, no sort of its READY rows.
    assert ("Index Scan", "jobs_job_pkey") in on_jobs, on_jobs
    assert any(index == "job_claim_tenant" for _, index in on_jobs), on_jobs
    assert _only_index_reads(on_jobs), on_jobs
    # The rows locked: a batch's ranked heads by primary key; one job, the
    # first a ranked tenant has, from the claim index by that tenant's key.
    locks = [node for node in nodes if node["Node Type"] == "LockRows"]
    locked_by = {(n.get("Index Name"), "tenant" in n.get("Index Cond", "")) for lock in locks
                 for n in plan_nodes(lock) if n.get("Relation Name") == "jobs_job"}
    assert locked_by == ({("job_claim_tenant", True)} if limit == 1 else {("jobs_job_pkey", False)}), locked_by


@pytest.mark.parametrize("limit", [1, 100])
def test_a_claim_right_after_a_bulk_load_of_fifty_thousand_rows_reads_jobs_by_primary_key(limit):
    Store().enqueue_many(JobSpec(f"t{i % 3}", f"k{i:05d}") for i in range(50_000))
    _assert_claim_plan(limit)


def test_the_claim_plan_holds_when_statistics_were_taken_with_a_single_tenant():
    """Analysed while one tenant held all the work (so "tenant = t" looks
    like the whole table), then 10,000 tenants get work: with or without an
    action filter the claim still reads the claim index and primary keys."""
    Store().enqueue_many(JobSpec("only", f"o{i}", action="jobs.bench_noop") for i in range(10_000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("DELETE FROM jobs_jobevent")
        cursor.execute("DELETE FROM jobs_job")
    Store().enqueue_many(JobSpec(f"t{i % 10_000}", f"k{i}", action="jobs.bench_noop") for i in range(20_000))
    for actions in (None, ["jobs.bench_noop"]):
        _assert_claim_plan(1, actions)
        _assert_claim_plan(100, actions)


# ---------------------------------------------------------------- the ready-tenant table


def _sampled() -> set[str]:
    return set(ReadyTenant.objects.values_list("tenant", flat=True))


def test_every_way_work_becomes_ready_puts_its_tenant_in_the_sample(store):
    store.enqueue("one", "a")
    store.enqueue_many([JobSpec("many", "b"), JobSpec("many", "c")])
    assert _sampled() == {"one", "many"}
    job = store.claim_next("w", tenants=["one"])
    store.wait("one", "a", "w", job.lease_epoch, reason="reply")
    ReadyTenant.objects.filter(tenant="one").delete()
    store.resume("one", "a", reason="the reply arrived")
    assert "one" in _sampled()
    # Retries and recovery go through the same trigger (an UPDATE to READY).
    ReadyTenant.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs_job SET state = 'LEASED' WHERE tenant = 'many'")
        cursor.execute("UPDATE jobs_job SET state = 'READY' WHERE tenant = 'many'")
    assert _sampled() == {"many"}


def test_a_tenant_left_without_ready_work_is_pruned_but_one_with_work_stays(store):
    store.enqueue_many(JobSpec("a", f"a{i}") for i in range(2))
    store.enqueue("b", "b0")
    for _ in range(3):
        job = store.claim_next("w")
        store.finish(job.tenant, job.key, "w", job.lease_epoch)
    assert store.claim_next("w") is None
    assert _sampled() == set()
    store.enqueue("b", "b1")
    assert _sampled() == {"b"}
    with connection.cursor() as cursor:
        cursor.execute("SELECT jobs_readytenant_prune(%s::varchar[])", [["b"]])
    assert _sampled() == {"b"}


def test_the_pruner_plans_its_statements_once_not_on_every_call(store):
    """The pruner's statements name tenants by an array; planned for each
    call's own values, the custom plan always looks cheaper than the
    generic one, and every call (nearly one per job with many small tenants)
    would be planned anew (migration 0023). PostgreSQL's auto_explain shows the
    plan each statement ran with: a kept plan reads the array as a
    parameter, a plan made for the call has it written in."""
    store.enqueue_many(JobSpec(t, "k") for t in ("a", "b"))
    with auto_explained("auto_explain.log_nested_statements = on") as plans, connection.cursor() as cursor:
        for names in (["a", "gone"], ["b"], ["a"]):  # (tenants with work: nothing is deleted)
            cursor.execute("SELECT jobs_readytenant_prune(%s::varchar[])", [names])
    inner = [plan for plan in plans if "jobs_readytenant_prune(" not in plan.split("\n", 2)[1]]
    assert len(inner) == 6, plans  # the lock and the delete, three calls
    assert all(re.search(r"ANY \(\(\$\d+\)", plan) and "ANY ('{" not in plan for plan in inner), "\n\n".join(inner)
    assert _sampled() == {"a", "b"}


def test_a_claim_whose_sample_was_all_drained_samples_again_instead_of_walking_the_whole_claim_index(
        store, monkeypatch):
    """Many tenants with a job or two: a sample can be all tenants whose
    work is gone (not yet taken out of the sample table). The claim takes
    them out, samples again and finds the tenant with work — the plain
    claim, which walks the claim index past every drained entry, is not
    needed."""
    drained = [f"d{i}" for i in range(claim_sql.SAMPLE_TENANTS + 2)]
    for tenant in drained:
        store.enqueue(tenant, "k")
        job = store.claim_next("w", tenants=[tenant, "other"])  # a listed claim prunes nothing
        store.finish(tenant, "k", "w", job.lease_epoch)
    store.enqueue("busy", "work")
    # The drained tenants first in slot order, none of them new.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs_readytenant SET added = now() - interval '1 hour', "
                       "slot = CASE WHEN tenant = 'busy' THEN 0.99 ELSE 0.01 * ascii(right(tenant, 1)) / 100 END")
    assert _sampled() == {*drained, "busy"}
    monkeypatch.setattr(claim_sql.chance.rng, "random", lambda: 0.0)
    claim_sql._last_seen.one_tenant = False
    used = []
    statement = claim_sql._statement

    def spy(template, *args, **kwargs):
        used.append("fair" if template is claim_sql._FAIR_PG else "plain")
        return statement(template, *args, **kwargs)

    monkeypatch.setattr(claim_sql, "_statement", spy)
    job = store.claim_next("w")
    assert job is not None and job.tenant == "busy"
    assert used == ["fair", "fair"]
    # (The first sample's tenants are out; the second's, asked before "busy", may be too.)
    assert "busy" in _sampled() and not _sampled() & set(drained[:claim_sql.SAMPLE_TENANTS])


@pytest.mark.parametrize("limit", [1, 10])
def test_a_claim_asks_once_whether_each_sampled_tenant_is_left_without_ready_work(store, limit):
    """The tenants the claim found drained are tested for emptiness and
    handed to the prune function: written as a subquery the planner pulled
    up, the question was put twice, each sampled tenant's claim index
    read once for each."""
    drained = ["d0", "d1", "d2"]
    for tenant in drained:
        store.enqueue(tenant, "k")
        job = store.claim_next("w", tenants=[tenant, "other"])  # a listed claim prunes nothing
        store.finish(tenant, "k", "w", job.lease_epoch)
    store.enqueue("busy", "work")
    with connection.cursor() as cursor:  # (the drained tenants asked before "busy")
        cursor.execute("UPDATE jobs_readytenant SET slot = CASE WHEN tenant = 'busy' THEN 0.99 ELSE 0.01 END")
    sql, params = claim_sql._statement(claim_sql._FAIR_PG, "w", Clock(None), 30.0, None, None, limit)
    params["lottery"] = 2  # (ranks "busy" last of these tenants)
    asking = [node for node in explained(sql, params) if re.fullmatch(r"r(_\d+)?", node.get("Alias", ""))
              and node.get("Actual Loops", 0) > 0]
    assert [node["Actual Loops"] for node in asking] == [len(drained)], asking


def test_pruning_skips_a_tenant_whose_new_work_is_not_committed_yet(store):
    """The race the lock protocol closes: the pruner's snapshot cannot see
    an uncommitted job, so it must leave the tenant's row alone."""
    store.enqueue("a", "a0")
    job = store.claim_next("w")
    store.finish("a", "a0", "w", job.lease_epoch)
    ctx = multiprocessing.get_context("fork")
    started, release = ctx.Event(), ctx.Event()
    connections.close_all()

    def enqueuer():
        with transaction.atomic():
            Store().enqueue("a", "a1")
            started.set()
            release.wait(60)
        connections.close_all()

    proc = ctx.Process(target=enqueuer)
    proc.start()
    try:
        assert started.wait(60)
        # The claim finds "a" drained in its snapshot and prunes it in the
        # same statement — which does not wait for the enqueuer, and keeps "a".
        assert store.claim_next("w") is None
        assert _sampled() == {"a"}
    finally:
        release.set()
        proc.join(60)
    assert proc.exitcode == 0
    assert store.claim_next("w").key == "a1"



# ---------------------------------------------------------------- finish + claim, generic plans


def _generic_plan_on_jobs(sql: str, params: dict) -> list[tuple[str, str | None, str]]:
    """The plan PostgreSQL keeps for `sql` once a worker's connection has
    prepared it (a generic plan, chosen without the parameter values):
    every scan of jobs_job as (node, index, index condition)."""
    names: list[str] = []

    def number(match):
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, sql)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            types = ", ".join(_pg_type(params[n]) for n in names)
            cursor.execute(f"PREPARE generic_probe ({types}) AS {text}")
            args = ", ".join(f"%s::{_pg_type(params[n])}" for n in names)
            # Arguments as literals: a utility statement takes no parameters.
            execute = connection.ops.compose_sql(f"EXECUTE generic_probe({args})", [params[n] for n in names])
            cursor.execute(f"EXPLAIN (FORMAT JSON) {execute}")
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE generic_probe")
            cursor.execute("RESET plan_cache_mode")
    return _scans_of_jobs(json.loads(plan) if isinstance(plan, str) else plan)


def _scans_of_jobs(plan) -> list[tuple[str, str | None, str]]:
    """Every read of jobs_job in an EXPLAIN (FORMAT JSON) plan as (node,
    index, condition); a bitmap heap scan is named by its index scans."""
    scans = []
    for node in plan_nodes(plan[0]["Plan"]):
        if node.get("Relation Name") != "jobs_job":
            continue
        if node["Node Type"] == "Bitmap Heap Scan":  # named by the index scans under it
            indexes = {n.get("Index Name") for n in plan_nodes(node) if n["Node Type"] == "Bitmap Index Scan"}
            scans.append(("Bitmap Heap Scan", ",".join(sorted(indexes)), node.get("Recheck Cond", "")))
        else:
            scans.append((node["Node Type"], node.get("Index Name"), node.get("Index Cond", "")))
    return scans


def _only_index_reads(scans: list[tuple[str, str | None]]) -> bool:
    return all(kind in ("Index Scan", "Index Only Scan", "ModifyTable")
               or (kind == "Bitmap Heap Scan" and index == "jobs_job_pkey") for kind, index in scans)


def _pg_type(value) -> str:
    if isinstance(value, list):
        first = next((v for v in value if v is not None), "")
        return _pg_type(first) + "[]"
    return {bool: "boolean", int: "bigint", float: "double precision"}.get(type(value), "text")


@pytest.mark.parametrize("tenants", [1, 3])
def test_the_generic_plan_of_finish_and_claim_reads_jobs_by_key_not_by_every_lease(tenants):
    """Partial indexes on LEASED rows hold every lease since the last vacuum;
    a generic plan that scanned one to find the jobs being finished, or to
    count a tenant's leases across all tenants, grew slower with every job
    done. The finishes are read by primary key, the lease count by
    (tenant, lease_until) for that tenant only."""
    store = Store()
    # Enough rows that reading a table is never the cheap way (a seq scan
    # of a table of a few pages can be; the plan is rebuilt when ANALYZE
    # sees it grow).
    store.enqueue_many(JobSpec(f"t{i % tenants}", f"k{i:05d}") for i in range(30_000))
    jobs = store.claim_batch("w", limit=10)
    finish = _finishes([(job, None) for job in jobs])
    for template, limit, one_tenant in ((claim_sql._FAIR_PG, 1, False), (claim_sql._FAIR_PG, 100, False),
                                        (claim_sql._GLOBAL_PG, 1, False), (claim_sql._GLOBAL_PG, 1, True),
                                        (claim_sql._GLOBAL_PG, 100, True)):
        listed = ["t0"] if template is claim_sql._GLOBAL_PG and not one_tenant else None
        sql, params = claim_sql._statement(template, "w", Clock(None), 30, listed, None, limit, finish=finish,
                                           one_tenant=one_tenant)
        on_jobs = _generic_plan_on_jobs(sql, params)
        leases = [scan for scan in on_jobs if scan[1] == "job_leased_expiry"]
        assert all("tenant" in cond for _, _, cond in leases), leases
        assert _only_index_reads([scan[:2] for scan in on_jobs]), (limit, on_jobs)


@pytest.mark.parametrize("tenants", [1, 3])
def test_the_generic_plan_reads_jobs_by_key_when_statistics_say_the_table_is_empty(tenants):
    """A queue table analysed (autovacuum) while it held work, then drained
    and analysed again empty, gets a burst: the statistics say "no rows",
    the physical size says "many pages". A worker's prepared statement gets
    a generic plan made from those statistics and keeps it until the next
    ANALYZE — a plan that read the table (or all of an index) to find the
    rows to finish or lease, or every READY row to check whether a sampled
    tenant still has work, cost a full scan per claim. Every read of
    jobs_job goes by key, and the emptiness check by the tenant's own
    index entries."""
    store = Store()
    store.enqueue_many(JobSpec(f"gone{i % 50}", f"g{i:05d}") for i in range(20_000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")  # column statistics of a queue with work
        cursor.execute("DELETE FROM jobs_jobevent")
        cursor.execute("DELETE FROM jobs_job")
        cursor.execute("ANALYZE jobs_job")  # reltuples 0, relpages as many as 20,000 rows fill
    store.enqueue_many(JobSpec(f"t{i % tenants}", f"k{i:05d}") for i in range(20_000))
    jobs = store.claim_batch("w", limit=10)
    finish = _finishes([(job, None) for job in jobs])
    for template, limit, with_finish, one_tenant in (
            (claim_sql._FAIR_PG, 1, True, False), (claim_sql._FAIR_PG, 1, False, False),
            (claim_sql._FAIR_PG, 100, True, False), (claim_sql._GLOBAL_PG, 1, True, False),
            (claim_sql._GLOBAL_PG, 100, False, False), (claim_sql._GLOBAL_PG, 1, True, True),
            (claim_sql._GLOBAL_PG, 100, True, True)):
        listed = ["t0"] if template is claim_sql._GLOBAL_PG and not one_tenant else None
        sql, params = claim_sql._statement(template, "w", Clock(None), 30, listed, ["jobs.noop"], limit,
                                           finish=finish if with_finish else None, one_tenant=one_tenant)
        on_jobs = _generic_plan_on_jobs(sql, params)
        case = (template is claim_sql._FAIR_PG, limit, with_finish, one_tenant)
        assert _only_index_reads([scan[:2] for scan in on_jobs]), (case, on_jobs)
        # No read of jobs_job without a key: a bitmap or index scan whose
        # only condition is the state reads every READY (or LEASED) row.
        keyless = [scan for scan in on_jobs if scan[0] != "ModifyTable" and not ("id" in scan[2] or "tenant" in scan[2])]
        assert not keyless, (case, keyless)
    # Taking drained tenants out of the sample checks each one's READY jobs
    # the same way (as an anti-join, it read every READY entry per prune).
    # (The delete the pruning function runs, its array as a parameter.)
    on_jobs = _generic_plan_on_jobs(_PRUNE_DELETE, {"tenants": ["t0", "drained"]})
    assert on_jobs and all(kind in ("Index Scan", "Index Only Scan") and "tenant" in cond
                           for kind, _, cond in on_jobs), on_jobs


@pytest.mark.parametrize("tenants", [1, 3])
def test_the_capped_claim_asks_each_candidate_tenant_for_work_by_its_own_index_entries(tenants):
    """With a lease cap, the statement that picks the tenants to lock asks
    each whether it has work it may claim. Written as EXISTS, that was
    pulled up into a semi-join that read every READY entry of the claim
    index (all tenants') on every capped claim: the capped claim cost the
    more the longer the queue. Every read of jobs_job goes by a key, in
    the plan a worker keeps (generic) as in a first one (custom)."""
    store = Store()
    store.enqueue_many(JobSpec(f"t{i % tenants}", f"k{i:05d}") for i in range(20_000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    # (The walk over every tenant runs only for a worker not limited to some.)
    for template, listed in ((claim_sql._CAP_TENANTS_PG, None), (claim_sql._CAP_TENANTS_PG, ["t0"]),
                             (claim_sql._CAP_TENANTS_ALL_PG, None)):
        sql, params = claim_sql._statement(template, "w", Clock(None), 30, listed, ["jobs.noop"], 1, cap=2)
        sql = claim_sql._try_locks_sql(sql, 1)
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            plan = cursor.fetchone()[0]
        custom = _scans_of_jobs(json.loads(plan) if isinstance(plan, str) else plan)
        for name, on_jobs in (("custom", custom), ("generic", _generic_plan_on_jobs(sql, params))):
            case = (template is claim_sql._CAP_TENANTS_PG, listed, name)
            assert on_jobs and _only_index_reads([scan[:2] for scan in on_jobs]), (case, on_jobs)
            keyless = [scan for scan in on_jobs if not ("id" in scan[2] or "tenant" in scan[2])]
            assert not keyless, (case, keyless)


_PRUNE_DELETE = re.search(r"DELETE FROM jobs_readytenant .*?IS NULL", import_module(
    "jobs.migrations.0013_readytenant_prune_function").CREATE, re.S).group(0).replace("ANY(locked)", "ANY(%(tenants)s)")


def test_the_capped_claim_s_tenant_statement_keeps_one_plan_whatever_random_points_it_draws(monkeypatch):
    """PostgreSQL keeps a prepared statement's generic plan only if it looks
    no dearer than the custom plans of its first five runs. The sample's
    random point, a parameter, makes a custom plan look the cheaper the lower
    the point: a connection whose first five draw low would plan every claim
    anew, at more than the claim costs. Low points every time here: the
    capped claim's statement that samples tenants runs with its generic
    plan every time (a plan made for a run's values has its point written
    in). (The fair claim itself: the test below.)"""
    store = Store()
    store.enqueue_many(JobSpec(f"t{i % 300:03d}", f"k{i:04d}") for i in range(600))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("ANALYZE jobs_readytenant")
    monkeypatch.setattr(claim_sql.chance.rng, "random", lambda: 0.0234567)
    claim_sql._last_seen.one_tenant = False
    with override_settings(JOBS_TENANT_LEASE_CAP=2), auto_explained(
            "auto_explain.log_nested_statements = on", "auto_explain.log_verbose = on") as plans:
        jobs, lost = store.claim_batch("w", limit=1), []
        for n in range(14):
            jobs, lost = store.finish_and_claim("w", [(job, {"n": n}) for job in jobs], limit=1)
            assert len(jobs) == 1 and lost == []
    # (Each plan's second line is its statement.)
    sampling = [plan for plan in plans if "jobs_readytenant WHERE slot >=" in plan.split("\n", 2)[1]]
    assert len(sampling) >= 15, "\n\n".join(plans)
    assert not [plan for plan in sampling if "0.0234567" in plan], "\n\n".join(sampling)


@pytest.mark.parametrize("limit, cap", [(1, 0), (10, 0), (1, 2)])
def test_the_fair_claim_runs_with_its_generic_plan_from_its_first_run(monkeypatch, limit, cap):
    """Directly, PostgreSQL chooses between a prepared statement's generic
    plan and one made for each run's values by their estimates, averaging
    the custom plans' over every statistics change: after an ANALYZE taken
    while one tenant held a deep backlog, the fair claim is planned anew on
    most runs (docs/internals/claim.md, "Plan stability"). It runs through a
    function that asks for the generic plan (`jobs.pooling`): auto_explain
    shows each run's plan of the claim inside it, and a plan made for a
    run's values has the worker's name written in."""
    store = Store()
    store.enqueue_many(JobSpec(f"t{i % 30:03d}", f"k{i:04d}") for i in range(300))
    monkeypatch.setattr(claim_sql.chance.rng, "random", lambda: 0.02)
    claim_sql._last_seen.one_tenant = False
    with override_settings(JOBS_TENANT_LEASE_CAP=cap), auto_explained(
            "auto_explain.log_nested_statements = on", "auto_explain.log_verbose = on") as plans:
        jobs, lost = store.claim_batch("w-named", limit=limit), []
        for n in range(7):
            jobs, lost = store.finish_and_claim("w-named", [(job, {"n": n}) for job in jobs], limit=limit)
            assert jobs and lost == []
    # (Each plan's second line is its statement: the claim's, inside the function.)
    claims = [plan for plan in plans if "claimed AS (UPDATE jobs_job AS j " in plan.split("\n", 2)[1]]
    assert len(claims) >= 8, "\n\n".join(plans)
    assert not [plan for plan in claims if "'w-named'" in plan], "\n\n".join(claims)


def test_a_worker_finishing_and_claiming_thousands_of_jobs_keeps_a_flat_plan():
    """What the generic-plan test guards, end to end: the statement a worker
    runs over and over, with its kept plan, leaves every job DONE exactly
    once."""
    store = Store()
    store.enqueue_many(JobSpec("a", f"k{i:05d}") for i in range(300))
    jobs, done = store.claim_batch("w", limit=1), 0
    while jobs:
        jobs, lost = store.finish_and_claim("w", [(job, {"n": job.key}) for job in jobs], limit=1)
        assert lost == []
        done += 1
    assert done == 300
    assert Job.objects.filter(state="DONE").count() == 300
    assert JobEvent.objects.filter(kind="finish").count() == 300


def test_with_one_tenant_the_claim_is_the_tenant_s_own_and_a_second_tenant_turns_the_fair_claim_back_on(monkeypatch):
    """A claim that saw one tenant with READY work makes the next one the
    one-tenant claim (a fifth less server CPU). That claim takes nothing
    once a second tenant has READY work — it only writes its finishes — and
    the fair claim chooses: what is claimed is never other than the fair
    claim's choice, and each finish is written once."""
    store = Store()
    claim_sql._last_seen.one_tenant = False
    used = []
    statement = claim_sql._statement

    def spy(template, *args, one_tenant=False, **kwargs):
        used.append("one-tenant" if one_tenant else "fair" if template is claim_sql._FAIR_PG else "global")
        return statement(template, *args, one_tenant=one_tenant, **kwargs)

    monkeypatch.setattr(claim_sql, "_statement", spy)
    store.enqueue_many(JobSpec("big", f"b-{i}") for i in range(6))
    first = store.claim_next("w")
    other = store.claim_next("w2")  # big has another job running: it is the busier tenant
    jobs, lost = store.finish_and_claim("w", [(first, {"n": 1})], limit=1)
    assert used == ["fair", "one-tenant", "one-tenant"] and lost == [] and jobs[0].tenant == "big"

    store.enqueue("small", "s-0")
    used.clear()
    second, lost = store.finish_and_claim("w", [(jobs[0], {"n": 2})], limit=1)
    assert used == ["one-tenant", "fair"] and lost == []
    assert [job.tenant for job in second] == ["small"]  # the least-loaded tenant
    # Nothing was leased that the worker was not handed.
    assert set(Job.objects.filter(state="LEASED").values_list("pk", flat=True)) == {other.pk, second[0].pk}
    finished = JobEvent.objects.filter(kind="finish", job__in=[first, jobs[0]])
    assert sorted(finished.values_list("job_id", flat=True)) == sorted([first.id, jobs[0].id])
    assert Job.objects.get(pk=jobs[0].pk).result == {"n": 2}

    used.clear()
    store.claim_next("w3")
    assert used == ["fair"]  # two tenants: the fair claim from then on
    assert other.tenant == "big"


@pytest.mark.parametrize("limit", [1, 10, 1000])
def test_a_worker_s_claim_statement_is_short_enough_for_psycopg_to_keep_its_conversion(limit):
    """psycopg converts a query's named parameters to $n once and keeps the
    result only for a query of at most 4 KiB (`jobs.sql.compact`): the statement a
    default worker sends per job (or per batch) — its finishes, the fair
    claim, an `--action` filter — stays under that."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    finish = claim_sql.Finishes(ids=[1, 2], epochs=[1, 1], tenants=["a", "b"], results=[None, None])
    sql, _ = claim_sql._statement(claim_sql._FAIR_PG, "w", Clock(None), 30, None, ["jobs.bench_noop"], limit,
                                  finish=finish)
    assert len(sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH, len(sql)


def test_no_plan_of_a_batch_s_finishes_reads_the_whole_table_once_per_job():
    """The worker's finish and claim as PostgreSQL plans it with the values
    known (a connection's first executions), when reading by index looks
    dear (here a high random_page_cost; in the bench, a primary key index
    bloated by millions of updates): a plan that read the whole table once
    per finished job (a nested loop over a sequential scan, its outer side
    estimated at one row) made a batch of 100 take 100+ ms."""
    store = Store()
    store.enqueue_many(JobSpec("t", f"early{i}") for i in range(20))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    store.enqueue_many(JobSpec("t", f"k{i:05d}") for i in range(20_000))
    jobs = store.claim_batch("w", limit=100)
    finish = _finishes([(job, None) for job in jobs])
    sql, params = claim_sql._statement(claim_sql._GLOBAL_PG, "w", Clock(None), 30, None, None, 100, finish=finish,
                                       one_tenant=True)
    # (Read whole once, a table is a fair plan where an index looks dear.)
    repeated = [(node["Node Type"], node["Actual Loops"])
                for node in explained(sql, params, settings=("SET LOCAL random_page_cost = 1000",))
                if node.get("Relation Name") == "jobs_job" and node["Node Type"] == "Seq Scan"
                and node["Actual Loops"] > 1]
    assert not repeated, repeated
    assert Job.objects.filter(state="DONE").count() == 0  # (the explained statement was rolled back)


@pytest.mark.parametrize("template", ["_GLOBAL_PG", "_FAIR_PG"])
def test_a_batch_s_claim_sends_the_ids_it_finished_once_not_on_every_claimed_row(template):
    """A worker's finish-and-claim of 30 returns its 30 finished ids on one
    row of the result: written on every claimed row, a batch of 100 made
    the server send and the worker parse 10,000 ids. (The one-tenant claim
    takes work only while a single tenant holds any.)"""
    store = Store()
    tenants = 1 if template == "_GLOBAL_PG" else 3
    store.enqueue_many(JobSpec(f"t{i % tenants}", f"k{i:03d}") for i in range(60))
    jobs = store.claim_batch("w", limit=30)
    finish = _finishes([(job, None) for job in jobs])
    sql, params = claim_sql._statement(getattr(claim_sql, template), "w", Clock(None), 30, None, None, 30,
                                       finish=finish, one_tenant=template == "_GLOBAL_PG")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
    carrying = [row[-2] for row in rows if row[-2] is not None]
    assert len(rows) == 30 and all(row[0] is not None for row in rows)
    assert len(carrying) == 1 and sorted(carrying[0]) == sorted(job.id for job in jobs)
    assert Job.objects.filter(state="DONE").count() == 30 and Job.objects.filter(state="LEASED").count() == 30


@pytest.mark.parametrize("limit", [1, 30])
def test_finish_and_claim_reports_every_finished_id_whichever_row_carries_them(limit):
    store = Store()
    store.enqueue_many(JobSpec(f"t{i % 3}", f"k{i:03d}") for i in range(60))
    jobs = store.claim_batch("w", limit=30)
    claimed, lost = store.finish_and_claim("w", [(job, None) for job in jobs], limit=limit)
    assert lost == [] and len(claimed) == limit
    assert set(Job.objects.filter(state="DONE").values_list("id", flat=True)) == {job.id for job in jobs}


def _vacuumed(statement: str) -> tuple[float, int]:
    """Run `statement` (a VACUUM) and return the job table's statistics
    after it, (reltuples, relpages): what the tests below are about."""
    with connection.cursor() as cursor:
        cursor.execute(statement)
        cursor.execute("SELECT reltuples, relpages FROM pg_class WHERE relname = 'jobs_job'")
        return cursor.fetchone()


@pytest.mark.parametrize("statistics", ["a day's traffic", "pages but no rows"])
@pytest.mark.parametrize("template", ["_GLOBAL_PG", "_FAIR_PG"])
def test_a_batch_claim_reads_the_head_of_a_deep_backlog_not_all_of_it_whatever_the_statistics(template, statistics):
    """Statistics taken while many tenants held a few jobs each, their rows
    interleaved (a day's traffic), then one tenant's backlog of thousands:
    the planner expects a dozen READY rows for any tenant, finds a bitmap
    scan and a sort of them as cheap as the claim index's order, and with
    a batch's LIMIT written in as a constant chooses it — every batch would
    read and sort the tenant's whole backlog. The same claims under
    statistics that give the table pages but no rows (the day's rows
    deleted, then a VACUUM that could not shorten the table: the planner
    expects one row from any scan) walk the claim index too."""
    store = Store()
    tenants = [f"day-{i:03d}" for i in range(500)]
    store.enqueue_many(JobSpec(tenant, f"k{round_}") for round_ in range(10) for tenant in tenants)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    Job.objects.filter(tenant__in=tenants).delete()
    if statistics == "pages but no rows":
        rows, pages = _vacuumed("VACUUM (TRUNCATE false) jobs_job")
        assert rows == 0 and pages > 10  # the statistics this is about
    store.enqueue_many(JobSpec("deep", f"k{i:05d}") for i in range(20_000))
    with connection.cursor() as cursor:
        cursor.execute("SELECT jobs_readytenant_prune(%s)", [tenants])  # (as the claims would, drained)
        if statistics == "a day's traffic":
            cursor.execute("VACUUM jobs_job")
    limit = 100
    jobs = store.claim_batch("w", limit=limit)
    assert len(jobs) == limit and ReadyTenant.objects.count() == 1
    finish = _finishes([(job, None) for job in jobs])
    sql, params = claim_sql._statement(getattr(claim_sql, template), "w", Clock(None), 30, None, None, limit,
                                       finish=finish, one_tenant=template == "_GLOBAL_PG")
    read = [(node["Node Type"], node["Actual Rows"]) for node in explained(sql, params)
            if node.get("Index Name") == "job_claim_tenant" or node["Node Type"] == "Sort"]
    assert read and all(rows <= 2 * limit for _, rows in read), read
    assert Job.objects.filter(state="LEASED").count() == limit  # (the explained statement was rolled back)


@pytest.mark.parametrize("kind", ["one tenant", "fair"])
def test_a_single_claim_walks_the_claim_index_in_order_where_a_bitmap_scan_looks_cheaper(kind):
    """A question the claim index answers in its order ("tenant T's first
    READY job"), a bitmap scan answers by reading all of T's entries and
    sorting them. After an ANALYZE taken while many tenants held a couple of
    jobs each, the planner expects two READY rows for any tenant and takes
    the bitmap scan for as cheap: each claim then reads and sorts the
    tenant's whole backlog, for as long as the workers' connections keep
    that generic plan (docs/internals/claim.md, "Plan stability"). The
    claim functions run without bitmap scans. Here a session that will not
    use a plain index scan stands for such statistics: the claim, planned
    in a new server process, still reads the backlog's head."""
    store = Store()
    store.enqueue_many(JobSpec("deep", f"k{i:05d}") for i in range(5000))
    connection.close()  # (a new server process: the claim's plan is made now)
    with auto_explained("auto_explain.log_nested_statements = on", "auto_explain.log_analyze = on",
                        "auto_explain.log_timing = off", "auto_explain.log_format = json",
                        "enable_indexscan = off") as plans:
        claim_sql._last_seen.one_tenant = kind == "one tenant"
        job = store.claim_next("w")
    assert job is not None and job.key == "k00000"
    [plan] = [json.loads(p.split("plan:", 1)[1]) for p in plans if "UPDATE jobs_job AS j" in p]
    read = [(node["Node Type"], node["Actual Rows"] * node["Actual Loops"]) for node in plan_nodes(plan["Plan"])
            if node.get("Index Name") == "job_claim_tenant" or node["Node Type"] in ("Sort", "Bitmap Heap Scan")]
    assert read and all(rows <= 10 for _, rows in read), read


def test_a_claim_estimated_dear_is_not_jit_compiled():
    """Under statistics an ANALYZE took while the queue was busy, the fair
    claim's generic plan can be estimated above jit_above_cost, and
    PostgreSQL then JIT-compiles its expressions before running it, which
    costs far more CPU than the millisecond's claim itself
    (docs/internals/schema.md, "Storage settings"). The application's
    connections run without JIT (settings, DATABASE_JIT), so even a claim
    estimated above any mark runs as planned."""
    with transaction.atomic(), connection.cursor() as cursor:
        # (pg_jit_available() is false while jit is off: asked with it on.)
        cursor.execute("SET LOCAL jit = on")
        cursor.execute("SELECT pg_jit_available()")
        if not cursor.fetchone()[0]:
            pytest.skip("this PostgreSQL has no JIT to leave off")
        transaction.set_rollback(True)
    store = Store()
    store.enqueue_many(JobSpec(f"t{i}", f"k{i}") for i in range(4))
    job = store.claim_next("w")
    sql, params = claim_sql._statement(claim_sql._FAIR_PG, "w", Clock(None), 30, None, None, 1,
                                       finish=_finishes([(job, None)]))
    with transaction.atomic(), connection.cursor() as cursor:
        # (Every plan passes these marks: a connection with JIT on compiles it.)
        cursor.execute("SET LOCAL jit_above_cost = 0")
        cursor.execute("SET LOCAL jit_inline_above_cost = -1")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    assert plan[0]["Plan"]["Node Type"] and "JIT" not in plan[0], plan[0].get("JIT")


@pytest.mark.parametrize("overrides, jit", [
    ({}, "off"),
    ({"DATABASE_JIT": True}, "on"),
    # (A session setting behind a transaction-mode pooler would reach
    # other clients' transactions: left to the role or database.)
    ({"DATABASE_POOL_MODE": "transaction"}, "on"),
])
def test_a_new_connection_turns_jit_off_where_its_session_is_its_own(overrides, jit):
    fresh = connections.create_connection("default")
    try:
        with override_settings(**overrides), fresh.cursor() as cursor:
            # (What the session started with: the server's setting, on by default.)
            cursor.execute("SELECT reset_val FROM pg_settings WHERE name = 'jit'")
            server = cursor.fetchone()[0]
            cursor.execute("SHOW jit")
            assert cursor.fetchone()[0] == (jit if jit == "off" else server)
    finally:
        fresh.close()


@pytest.mark.parametrize("write", ["finish", "renewal"])
def test_a_batch_s_finish_and_renewal_handle_rows_in_proportion_to_the_batch_whatever_the_statistics(write):
    """Statistics that give the job table pages but no rows — a VACUUM of a
    drained queue that could not shorten the table — then a batch of 100
    leases, given back in no particular order. Joined to the table, the
    batch's ids would make the generic plan of its finish (and of a renewal
    of its leases) a nested loop going through all 100 ids for each of the
    100 rows. Each row finds its own values by its place among the ids: auto_explain shows no
    node of the statement's generic plan handling more rows than a few
    times the batch, and every job gets its own outcome."""
    store = Store()
    store.enqueue_many(JobSpec("drained", f"d{i:05d}") for i in range(3000))
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobs_jobsearch; DELETE FROM jobs_jobevent; DELETE FROM jobs_job")
    rows, pages = _vacuumed("VACUUM (TRUNCATE false) jobs_job")
    assert rows == 0 and pages > 10  # the statistics this is about
    store.enqueue_many(JobSpec("t", f"k{i:04d}") for i in range(300))
    jobs = store.claim_batch("w", limit=100)[::-1]
    with auto_explained("auto_explain.log_nested_statements = on", "auto_explain.log_analyze = on",
                        "auto_explain.log_timing = off", "auto_explain.log_format = json") as plans:
        if write == "finish":
            assert store.finish_many("w", [(job, {"n": job.id}) for job in jobs]) == []
        else:
            assert store.renew_many("w", jobs, ttl=600) == {job.id for job in jobs}
    [plan] = [json.loads(p.split("plan:", 1)[1]) for p in plans if "UPDATE jobs_job AS" in p]
    handled = max((node["Actual Rows"] * node["Actual Loops"], node["Node Type"]) for node in plan_nodes(plan["Plan"]))
    assert handled[0] <= 3 * len(jobs), handled
    if write == "finish":
        assert all(job.result == {"n": job.id} for job in Job.objects.filter(state="DONE")), "a job took another's result"
        assert Job.objects.filter(state="DONE").count() == len(jobs)
    else:
        assert Job.objects.filter(state="LEASED", lease_until__gt=timezone.now() + timedelta(seconds=300)).count() == len(jobs)


def _claim_as(kind: str, store: Store):
    """One claim of the kind `kind` names (see the test below)."""
    if kind == "plain":  # (what a fair claim falls back on when every candidate was locked)
        return claim_sql._run(*claim_sql._statement(claim_sql._GLOBAL_PG, "idle", Clock.of(None), 60, None, None, 1))[0]
    claim_sql._last_seen.one_tenant = kind == "one tenant"
    with override_settings(JOBS_TENANT_LEASE_CAP=2 if kind == "capped" else 0):
        return store.claim_batch("idle", limit=1, tenants=["t0"] if kind == "listed tenant" else None)


@pytest.mark.parametrize("start", ["empty", "small"])
@pytest.mark.parametrize("kind", ["fair", "one tenant", "listed tenant", "plain", "capped"])
def test_a_claim_planned_over_an_empty_table_still_walks_the_indexes_once_it_fills(kind, start):
    """A worker idle over an empty queue (the job table vacuumed to no
    pages) plans its claims then, and the planner takes a sequential scan of
    an empty table for free; so it does for a table of a page, analysed
    (`small`: a dozen jobs, claimed one by one). A plan kept on the server
    (a function's, or a prepared statement's generic plan, chosen after
    five runs) stays until the table's statistics change (autovacuum's next
    ANALYZE): a worker's claims after a refill would read the whole table.
    No claim statement is ever planned as a
    sequential scan of the job table."""
    store = Store()
    assert _vacuumed("VACUUM jobs_job, jobs_readytenant")[1] == 0  # no pages: the statistics this is about
    if start == "small":
        # (A tenant each where the claim is fair: under the cap, two of one tenant's.)
        store.enqueue_many(JobSpec(f"t{i}" if kind in ("fair", "capped") else "t0", f"s{i:02d}") for i in range(12))
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs_job")
        for _ in range(12):  # (prepared on the second run; a generic plan from the sixth)
            assert len(_claim_as(kind, store)) == 1
    else:
        for _ in range(10):
            assert _claim_as(kind, store) == []
    tenants = 1 if kind == "one tenant" else 50
    store.enqueue_many(JobSpec(f"t{i % tenants}", f"k{i:04d}") for i in range(2000))
    with auto_explained("auto_explain.log_nested_statements = on", "auto_explain.log_format = json") as plans:
        assert _claim_as(kind, store)
    claims = [json.loads(p.split("plan:", 1)[1]) for p in plans if "jobs_stmt_" not in p]
    scanned = {node["Relation Name"] for plan in claims for node in plan_nodes(plan["Plan"])
               if node["Node Type"] == "Seq Scan"}
    assert [plan for plan in claims if "candidate AS" in plan["Query Text"]] and "jobs_job" not in scanned, \
        [plan["Query Text"][:300] for plan in claims]


def test_a_worker_s_housekeeping_run_over_an_empty_table_reads_the_indexes_once_it_fills():
    """The same trap for the application's other statements: a worker's
    housekeeping (lease recovery, timer sweep, the periodic tasks) runs
    every heartbeat while it idles over an emptied queue. As prepared
    statements their generic plans (chosen after five runs) would be made
    over a table with no pages, and kept after a refill: a sweep would read
    the whole table. The housekeeping
    connection prepares none of them."""
    worker = Worker(WorkerConfig(worker_id="w", until_idle=True, poll_interval=0.05))
    # The bulk enqueue's temporary table made first: a table made later, by
    # any session, would reset every backend's cached plans (a new row type),
    # and the trap would close by chance.
    with connection.cursor() as cursor:
        cursor.execute(_ENQUEUE_GIVEN_TABLE)
    assert _vacuumed("VACUUM jobs_job")[1] == 0  # no pages: the statistics this is about
    for _ in range(10):
        assert worker._maintain(force=True) == 0
    Store().enqueue_many(JobSpec(f"t{i % 10}", f"k{i:04d}") for i in range(2000))
    # Outside a transaction: the timer sweep and the outbox relay open their own.
    with auto_explained("auto_explain.log_format = json", session=True) as plans:
        worker._maintain(force=True)
    read = [json.loads(p.split("plan:", 1)[1]) for p in plans]
    on_jobs = [plan["Query Text"][:120] for plan in read if '"jobs_job"' in plan["Query Text"]]
    scanned = {node.get("Relation Name") for plan in read for node in plan_nodes(plan["Plan"])
               if node["Node Type"] == "Seq Scan"}
    assert len(on_jobs) >= 2 and "jobs_job" not in scanned, on_jobs
