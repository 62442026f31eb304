"""The claim statements run through PL/pgSQL functions made for them
(`jobs.pooling.execute`), whose plans each server process keeps: behind a
transaction-mode pooler nothing can be prepared on a connection, and
directly a prepared statement's plan follows the session's settings, where
the functions keep their generic plans, made without sequential scans.
Directly, the calls are prepared."""

import logging

import pytest
from django.db import DEFAULT_DB_ALIAS, ProgrammingError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from jobs import claim as claim_sql
from jobs import pooling
from jobs.models import Job
from jobs.states import State
from jobs.store import JobSpec

# Committed, as a worker's claims are: a function made inside a transaction
# that is rolled back is not remembered.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL (PL/pgSQL)")]


def _functions() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'jobs_stmt_%%'")
        return {name for (name,) in cursor.fetchall()}


def _drop_functions() -> None:
    pooling._calls.clear()
    with connection.cursor() as cursor:
        for name in _functions():
            cursor.execute(f"DROP FUNCTION {name}")


@pytest.fixture(autouse=True)
def no_functions():
    """Each test starts and ends with no statement function (they outlive
    the flush between tests; other modules' fair claims make them too) and
    nothing remembered of them."""
    _drop_functions()
    yield
    _drop_functions()


@pytest.fixture
def pooled(settings):
    settings.DATABASE_POOL_MODE = "transaction"


def test_behind_the_pooler_the_claim_and_the_finish_run_through_functions_made_for_them(store, pooled):
    for n in range(3):
        store.enqueue(f"t{n}", f"k{n}")
    [first], _ = store.finish_and_claim("w1", [], limit=1)
    with CaptureQueriesContext(connection) as first_round:
        [second], lost = store.finish_and_claim("w1", [(first, {"ok": True})], limit=1)
    assert lost == []
    with CaptureQueriesContext(connection) as second_round:
        [third], lost = store.finish_and_claim("w1", [(second, {"ok": True})], limit=1)
    assert lost == []
    made = _functions()
    assert made, "no function was made"
    calls = [q["sql"] for q in [*first_round.captured_queries, *second_round.captured_queries]
             if q["sql"].startswith("SELECT * FROM jobs_stmt_")]
    assert len(calls) >= 2 and all(call.split("(")[0].split()[-1] in made for call in calls)
    # The second round made nothing: it called what the first made.
    assert not [q for q in second_round.captured_queries if q["sql"].startswith(("PREPARE", "CREATE FUNCTION"))]
    assert {j.state for j in Job.objects.filter(pk__in=[first.pk, second.pk])} == {State.DONE}
    assert Job.objects.get(pk=third.pk).state == State.LEASED
    assert store.finish_many("w1", [(third, None)]) == []
    assert Job.objects.get(pk=third.pk).state == State.DONE


def test_directly_every_claim_runs_through_a_function_that_keeps_its_generic_plan(store, settings):
    settings.DATABASE_POOL_MODE = "direct"
    store.enqueue("t1", "k1")
    claim_sql._last_seen.one_tenant = True  # the one-tenant claim
    [job], _ = store.finish_and_claim("w1", [], limit=1)
    [one_tenant] = _functions()
    store.finish_many("w1", [(job, None)])
    store.enqueue_many(JobSpec(tenant, "k2") for tenant in ("t1", "t2"))
    claim_sql._last_seen.one_tenant = False  # the fair claim
    with CaptureQueriesContext(connection) as claims:
        [job], _ = store.finish_and_claim("w1", [], limit=1)
    sent = [q["sql"] for q in claims.captured_queries]
    assert sent and not [sql for sql in sent if sql.startswith("WITH")], "a claim statement was sent as it is"
    assert [sql for sql in sent if sql.startswith("SELECT * FROM jobs_stmt_")]
    made = _functions()
    assert len(made) == 3 and one_tenant in made  # (+ the batch finish, the fair claim)
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT proconfig FROM pg_proc WHERE proname LIKE 'jobs_stmt_%%'")
        assert cursor.fetchall() == [(["plan_cache_mode=force_generic_plan", "enable_seqscan=off", "enable_bitmapscan=off"],)]
        # Each call is prepared from its first run (the fair claim ran once)
        # — where the connection binds on the server (not in the pooler
        # pass, whose connections bind on the client).
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE 'SELECT * FROM jobs_stmt_%%'")
        prepared = {text.split("(")[0].split()[-1] for (text,) in cursor.fetchall()}
    assert made <= prepared if settings.DATABASE_PREPARED_STATEMENTS else prepared == set(), (made, prepared)


def test_a_statement_a_function_cannot_hold_runs_as_it_is(pooled, caplog):
    with caplog.at_level(logging.WARNING, logger="jobs.pooling"), connection.cursor() as cursor:
        pooling.execute(cursor, "SHOW server_version_num", {})
        assert cursor.fetchone()[0].isdigit()
    assert "pooling.plain_statement" in caplog.text
    assert _functions() == set()


@pytest.mark.parametrize("mode", ["transaction", "direct"])
def test_a_function_dropped_meanwhile_fails_one_call_and_is_made_again(settings, mode):
    # (Directly, its call is a prepared statement, which names the function.)
    settings.DATABASE_POOL_MODE = mode
    prepared = settings.DATABASE_PREPARED_STATEMENTS and mode == "direct"  # (not in the pooler pass)
    settings.DATABASE_PREPARED_STATEMENTS = prepared
    sql = "SELECT count(*) FROM jobs_job WHERE tenant = %(tenant)s"
    with connection.cursor() as cursor:
        for _ in range(2):
            pooling.execute(cursor, sql, {"tenant": "t1"})
            assert cursor.fetchone() == (0,)
        [name] = _functions()
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [f"SELECT * FROM {name}(%"])
        assert cursor.fetchone()[0] == (1 if prepared else 0)
        cursor.execute(f"DROP FUNCTION {name}")
    with pytest.raises(ProgrammingError, match="does not exist"), connection.cursor() as cursor:
        pooling.execute(cursor, sql, {"tenant": "t1"})
    with connection.cursor() as cursor:
        pooling.execute(cursor, sql, {"tenant": "t1"})
        assert cursor.fetchone() == (0,)
    assert _functions() == {name}


def test_a_function_made_in_a_transaction_rolled_back_is_made_again(pooled):
    sql = "SELECT count(*) FROM jobs_job WHERE key = %(key)s"
    with pytest.raises(RuntimeError), transaction.atomic(), connection.cursor() as cursor:
        pooling.execute(cursor, sql, {"key": "k1"})
        raise RuntimeError("rolled back")
    assert _functions() == set() and pooling._calls == {}
    with connection.cursor() as cursor:
        pooling.execute(cursor, sql, {"key": "k1"})
        assert cursor.fetchone() == (0,)
    assert len(_functions()) == 1


def test_claims_share_one_cursor_per_connection_and_a_new_connection_gets_its_own(store):
    """The claim statements' cursor is kept from one claim to the next (a
    new one learns again how to read every column); a connection closed and
    opened again, or queries being captured, gets a new one, and claims go
    on as before."""
    for n in range(4):
        store.enqueue(f"t{n}", f"k{n}")
    [first], _ = store.finish_and_claim("w1", [], limit=1)
    kept = claim_sql._claim_cursor(connections[DEFAULT_DB_ALIAS])
    [second], _ = store.finish_and_claim("w1", [(first, None)], limit=1)
    assert claim_sql._claim_cursor(connections[DEFAULT_DB_ALIAS]) is kept
    connection.close()
    [third], lost = store.finish_and_claim("w1", [(second, None)], limit=1)
    assert lost == [] and claim_sql._claim_cursor(connections[DEFAULT_DB_ALIAS]) is not kept
    with CaptureQueriesContext(connection) as captured:
        [fourth], _ = store.finish_and_claim("w1", [(third, None)], limit=1)
    assert any("jobs_stmt_" in query["sql"] for query in captured.captured_queries)
    assert {first.key, second.key, third.key, fourth.key} == {f"k{n}" for n in range(4)}
    assert Job.objects.filter(state=State.DONE).count() == 3


def test_a_parameter_s_type_read_from_the_table_of_scalars_is_the_one_pg_type_gives():
    """`_key` looks plain scalars' types up by their exact type before
    asking `_pg_type`: both must name the same type, or a statement would be
    sent to a function made for other types."""
    import datetime

    values = ["text", None, True, False, 0, 2**40, 1.5, datetime.datetime.now(datetime.UTC), [1, 2], ["a"], [None, 2.5],
              (True,), []]
    for value in values:
        assert (pooling._SCALAR_TYPES.get(type(value)) or pooling._pg_type(value)) == pooling._pg_type(value), value
