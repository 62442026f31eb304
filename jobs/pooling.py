"""Refusing to run behind a transaction-mode pooler configured as direct.

Behind a transaction-mode pooler (PgBouncer `pool_mode = transaction`) each
transaction of a client may run on another server connection. With the
direct configuration (`DATABASE_POOL_MODE=direct`, prepared statements on)
that half works: psycopg's prepared statements meet server connections that
never saw them or already hold one by that name, and LISTEN hears nothing.
A worker finds out in two ways and then stops with a message naming the
setting — never running at a fraction of the speed with errors:

- at start-up (`transaction_pooler_seen`): two connections open at the same
  time ask for their server process. Direct (or through a session-mode
  pooler) two open connections never share one; a transaction-mode pooler
  hands the second the server connection the first just gave back;
- on the first error a prepared statement's move between server
  connections causes (`prepared_statement_error`), whichever query meets it.
"""

import contextlib
import functools
import hashlib
import logging
import re
import secrets
import sys
from datetime import datetime

import psycopg
from django.conf import settings
from django.db import DatabaseError, IntegrityError, ProgrammingError, connection, connections, transaction

# What psycopg's prepared statements raise when the pooler moved them:
# "prepared statement … already exists" (42P05), "… does not exist" (26000),
# and a bind against another client's statement of the same name (08P01).
_MOVED_STATEMENT_STATES = {"42P05", "26000", "08P01"}

ADVICE = ("set DATABASE_POOL_MODE=transaction (no prepared statements, no session state) and "
          "DATABASE_LISTEN_URL to a direct connection for wake-ups, or connect directly")


def on_connection_created(sender, connection, **kwargs) -> None:
    """A new PostgreSQL connection of the application runs without JIT
    (`DATABASE_JIT`, settings): compiling a claim that is a millisecond's
    work costs far more than running it, and an ANALYZE of a busy queue can
    raise its estimate past jit_above_cost. Session state, so only where a
    session is the application's own: directly or through a session-mode
    pooler."""
    if (connection.vendor == "postgresql" and getattr(settings, "DATABASE_POOL_MODE", "direct") == "direct"
            and not getattr(settings, "DATABASE_JIT", False)):
        with connection.cursor() as cursor:
            cursor.execute("SET jit = off")


def transaction_pooler_seen(alias: str = "default") -> str | None:
    """Why the database at `alias` is behind a transaction-mode pooler, or
    None when nothing shows it (see the module). PostgreSQL only."""
    first = connections[alias]
    with first.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        first_pid = cursor.fetchone()[0]
    second = connections.create_connection(alias)
    try:
        with second.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            second_pid = cursor.fetchone()[0]
    finally:
        second.close()
    if first_pid != second_pid:
        return None
    return (f"DATABASE_URL leads to a transaction-mode pooler: two connections open at the same time were "
            f"served by the same PostgreSQL process (pid {first_pid}); {ADVICE}")


def prepared_statement_error(exc: BaseException) -> str | None:
    """When `exc` is a prepared statement that a transaction-mode pooler
    moved to another server connection: why to stop, naming the setting."""
    for error in (exc, exc.__cause__):
        state = getattr(error, "sqlstate", None)
        # psycopg names its statements _pg3_N; a handler's own EXECUTE is its business.
        if state in _MOVED_STATEMENT_STATES and '"_pg3_' in str(error):
            return _refused(str(error).strip().splitlines()[0][:200])
    return None


def _refused(statement_error: str) -> str:
    return (f"the database refused a prepared statement ({statement_error}): DATABASE_URL leads to a "
            f"transaction-mode pooler that moves a client between server connections; {ADVICE}")


# ---------------------------------------------------------------- the web app and the calendar

# Outside the worker (which stops) the first such error is reported naming the
# setting: the web app's request fails, the calendar's task fails, and the log
# says why (`jobs.apps` connects these to Django's and django-q2's signals).
_MOVED_TEXT = re.compile(r'prepared statement "_pg3_\w+" (?:already exists|does not exist)')


def on_request_exception(sender, request=None, **kwargs) -> None:
    """`got_request_exception`: a request that met a moved prepared statement."""
    exc = sys.exc_info()[1]
    why = prepared_statement_error(exc) if exc is not None else None
    if why:
        logger.error("web.misconfigured reason=%s", why)


def on_task_executed(sender, task=None, **kwargs) -> None:
    """django-q2's `post_execute_in_worker`: a calendar task that failed on a
    moved prepared statement (the task holds its error as text)."""
    if not task or task.get("success"):
        return
    match = _MOVED_TEXT.search(str(task.get("result", "")))
    if match:
        logger.error("qcluster.misconfigured task=%s reason=%s", task.get("name", ""), _refused(match.group(0)))


# ---------------------------------------------------------------- plans kept on the server

# Every claim statement (the claims, a batch's finish, the lease renewals)
# runs through a PL/pgSQL function made for its text (`jobs_stmt_<digest>`,
# created on first use, by whichever worker needs it first), for the plan it
# runs with (`_FUNCTION_SETTINGS`, below) and for where that plan is kept:
# - behind a transaction-mode pooler nothing may be prepared on a connection
#   (the next transaction may run on another), so PostgreSQL would plan the
#   claim — a statement of a dozen subqueries — anew on every job, a large
#   part of a worker's server time. A function keeps the plans of its
#   statements in each server process that runs it, whichever client calls
#   it;
# - directly, psycopg's prepared statements would keep a plan too, but one
#   made with the session's settings: see `_FUNCTION_SETTINGS`.
# The digest covers the text, the parameters' types, the job table's columns
# and the function's settings, so a statement, schema or setting that
# changes gets a new function; old ones are inert, and any may be dropped at
# any time (it is made again on the next claim that needs it, after that
# claim failed once).

_PARAM = re.compile(r"%\((\w+)\)s")
# (names, text, parameter types) → what to send: the call of its function, or the
# text itself where PostgreSQL could not type the statement (it then runs as
# it is).
_calls: dict[tuple[tuple[str, ...], str, tuple[str, ...]], str] = {}
# text → its parameters' names, in order of first use.
_names: dict[str, tuple[str, ...]] = {}

# Every function runs its statement with its generic plan. PostgreSQL
# chooses between that plan and one made for each call's values by their
# estimates, and keeps the custom plans' average estimate across statistics
# changes: after an ANALYZE taken while one tenant held a deep backlog, it
# goes on planning the fair claim anew on most of its runs. Only a function
# can fix the choice for one statement (a session setting would also reach
# the application's ORM queries, whose partial indexes only a custom plan
# can use); the statements sent this way are written so that their generic
# plan is the right one at any statistics
# (tests/jobs/test_claim_scale_pg.py) — but one: a table vacuumed to no
# pages, whose sequential scan the planner takes for free. A worker idle
# over an empty queue would plan its claims so, and keep those plans after
# the queue fills, until the table's next ANALYZE: each of its claims would
# read the whole table. These statements are written for the claim indexes;
# none needs a sequential scan of a large table. Nor a bitmap scan: a
# question the claim index answers in its order, a bitmap scan answers by
# reading all the tenant's entries and sorting them — which the planner,
# expecting a couple of READY rows a tenant from an ANALYZE taken over many
# small tenants, takes for as cheap: each claim of a tenant with a deep
# backlog would then read and sort that whole backlog, for as long as the
# workers' connections keep the plan.
_FUNCTION_SETTINGS = "SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off"

logger = logging.getLogger("jobs.pooling")


def execute(cursor, sql: str, params: dict) -> None:
    """`cursor.execute(sql, params)`, through a server-side function made
    for `sql` (see above). `sql` names its parameters (`%(name)s`)."""
    with sending(sql, params, cursor.db) as sent:
        cursor.execute(sent, params)


def prepare_nothing_here() -> None:
    """This thread's connection prepares none of the ORM's statements (the
    claim statements' calls still are: `sending`): a worker's housekeeping,
    whose sweeps run every heartbeat while the worker idles over an empty
    queue. Prepared, their generic plans (chosen after five runs) would be
    made over a job table vacuumed to no pages and kept after a refill,
    until the table's next ANALYZE: a lease-recovery sweep would read the
    whole table. Planned on each run, a sweep pays its planning once a
    heartbeat, which is little."""
    if connection.vendor == "postgresql" and getattr(settings, "DATABASE_PREPARED_STATEMENTS", False):
        connection.ensure_connection()
        connection.connection.prepare_threshold = None


@contextlib.contextmanager
def sending(sql: str, params: dict, db=None):
    """What to send for `sql` with `params` (see `execute`): the call of its
    function, made first if missing — so this can be entered before
    psycopg's pipeline mode, in which nothing can be made — or `sql` itself
    where PostgreSQL could not type the statement. Where the application
    prepares statements (DATABASE_PREPARED_STATEMENTS, directly) a call is
    sent as one from its first run, whatever the connection's own threshold
    (`prepare_nothing_here`): its plan is the function's, which cannot go
    stale. A function dropped meanwhile fails this call, and is made again
    on the next. `db`: the connection the statement is sent on, if the
    caller has it at hand (else the thread's, through the proxy)."""
    sent = _call(sql, params)
    db = connection if db is None else db
    db.ensure_connection()
    raw = db.connection
    threshold = raw.prepare_threshold
    if sent is not sql and getattr(settings, "DATABASE_PREPARED_STATEMENTS", False):
        raw.prepare_threshold = 0  # (now, for this statement only: see DATABASE_PREPARED_STATEMENTS)
    try:
        yield sent
    except (DatabaseError, psycopg.Error) as exc:
        if "42883" in (getattr(exc, "sqlstate", None), getattr(exc.__cause__, "sqlstate", None)):
            _calls.pop(_key(sql, params), None)
        raise
    finally:
        raw.prepare_threshold = threshold


def _call(sql: str, params: dict) -> str:
    """The text to send for `sql` with `params` (see `sending`)."""
    key = _key(sql, params)
    sent = _calls.get(key)
    if sent is None:
        function = _function_for(sql, key[0], key[2])
        if function is None:
            sent = sql
        else:
            name, types = function
            sent = f"SELECT * FROM {name}({', '.join(f'%({p})s::{k}' for p, k in zip(key[0], types))})"
        # Known from now on once it is committed: made inside a transaction
        # that is rolled back, it is gone again.
        transaction.on_commit(lambda: _calls.__setitem__(key, sent))
    return sent


def _key(sql: str, params: dict) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """`sql`'s parameters' names in order of first use, the text, and the
    parameters' types."""
    names = _names.get(sql)
    if names is None:
        if len(_names) >= 256:
            _names.clear()
        names = _names[sql] = tuple(dict.fromkeys(_PARAM.findall(sql)))
    return names, sql, tuple([_SCALAR_TYPES.get(type(value)) or _pg_type(value)
                              for value in map(params.__getitem__, names)])


def _function_for(sql: str, names: tuple[str, ...], kinds: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """The function that runs `sql` (made if missing), and its argument
    types as PostgreSQL resolved them."""
    body = _PARAM.sub(lambda match: f"${names.index(match.group(1)) + 1}", sql).replace("%%", "%")
    digest = hashlib.sha256(repr((body, kinds, _job_columns(), _FUNCTION_SETTINGS)).encode()).hexdigest()[:24]
    name = f"jobs_stmt_{digest}"
    probe = f"jobs_stmt_probe_{secrets.token_hex(6)}"
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # The statement's types, as PostgreSQL resolves them: prepared,
            # described and dropped in this one transaction (one server
            # connection, even behind the pooler).
            cursor.execute(f"PREPARE {probe} ({', '.join(kinds)}) AS {body}" if kinds
                           else f"PREPARE {probe} AS {body}")
            try:
                described = connection.connection.pgconn.describe_prepared(probe.encode())
                oids = ([described.param_type(i) for i in range(described.nparams)],
                        [described.ftype(i) for i in range(described.nfields)])
            finally:
                cursor.execute(f"DEALLOCATE {probe}")
            # (regtype's text is the type's name: "character varying".)
            cursor.execute("SELECT %s::oid[]::regtype[]::text[], %s::oid[]::regtype[]::text[], "
                           "EXISTS (SELECT 1 FROM pg_proc WHERE proname = %s)", [*oids, name])
            types, results, made = cursor.fetchone()
            if not made:
                columns = ", ".join(f"jobs_r{i} {kind}" for i, kind in enumerate(results))
                try:
                    with transaction.atomic():
                        cursor.execute(
                            f"CREATE FUNCTION {name}({', '.join(types)}) RETURNS TABLE ({columns}) "
                            f"LANGUAGE plpgsql VOLATILE {_FUNCTION_SETTINGS} "
                            f"AS $jobs_stmt$ #variable_conflict use_column\n"
                            f"BEGIN RETURN QUERY {body}; END $jobs_stmt$")
                except (IntegrityError, ProgrammingError) as exc:
                    # Another worker made it at the same moment (42723: it
                    # committed first; 23505: while this one waited).
                    if getattr(exc.__cause__, "sqlstate", None) not in ("42723", "23505"):
                        raise
    except DatabaseError as exc:
        logger.warning("pooling.plain_statement reason=%s", str(exc).splitlines()[0][:200])
        return None
    return name, types


def _pg_type(value) -> str:
    """The PostgreSQL type a parameter is bound as ("unknown": let the
    statement decide, as for a NULL)."""
    if isinstance(value, list | tuple):
        first = next((v for v in value if v is not None), "")
        return _pg_type(first).replace("unknown", "text") + "[]"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double precision"
    if isinstance(value, datetime):
        return "timestamptz"
    # A string too, as psycopg binds it: its type is the one the statement
    # casts it to. Bound as typed text, `%(ids)s::bigint[]` would be a cast
    # the function runs on every row that reads it: a batch's finish would
    # parse its arrays of ids and epochs once per job.
    return "unknown"


# `_pg_type` of the plain scalars, looked up by their exact type: a claim
# binds a dozen parameters on every call, and one lookup costs less than
# the checks above, one by one.
_SCALAR_TYPES = {str: "unknown", type(None): "unknown", bool: "boolean", int: "bigint", float: "double precision"}


@functools.cache
def _job_columns() -> str:
    """The job table's columns and their types: a function made for
    another schema is never reused."""
    from .models import Job

    return repr([(f.column, f.db_type(connection)) for f in Job._meta.concrete_fields])
