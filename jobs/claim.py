"""The claim: which statements run, with which blocks and parameters. The
statements themselves, with the index that serves each, are in
`jobs/sql/claim.sql` (the batch's finishes and renewals in `writes.sql`).

Both back ends run the same semantics: pick eligible READY jobs (one, or up to
`limit` for a batch), move each to LEASED with its own `lease_epoch + 1`, the
worker's id, `lease_until = now + ttl` and `updated_at = now` (the claim's
time, `Job.claimed_at`), and count the attempt — in one transaction. A claim
writes no history row: the attempt's one row is written when it ends, with the
claim's time, worker and epoch taken from the job row
(`jobs.models.JobEvent`).

Which jobs: tenants are served **least-loaded first** (fewest LEASED jobs;
ties broken by lottery so no tenant is systematically first), and within a
tenant by `priority DESC, next_attempt_at (NULL = at once, first), id`. In a
batch a tenant's k-th job counts as if its k-1 earlier ones were already
running, so a batch is spread over tenants the way k single claims would be.
A tenant at `JOBS_TENANT_LEASE_CAP` concurrent leases is skipped; the others
are not held back by it.

PostgreSQL, default path: the fair claim, one statement (`_FAIR_PG`; of one
job, `_FAIR_ONE_PG`) over a sample of the tenants with READY work, which also
writes the previous work's finishes (`finish_and_claim`) and takes drained
tenants out of the sample. If nothing could be locked and the claim took
drained tenants out of the sample, a second fair claim samples again (with
many tenants of a job or two each, a sample can be all drained ones). If
nothing could be locked (every candidate was taken by concurrent claimers, or
the sample's work is all scheduled for later) the plain claim runs
(`_GLOBAL_PG`: the first eligible unlocked jobs in `job_claim_tenant` order),
so contention never makes a busy queue look empty.

One tenant: when a thread's last default claim saw at most one tenant with
READY work (the sample holds every tenant when there are few), its next
claim is the plain one for that tenant, named from `jobs_readytenant`, which
costs the server less than the fair statement. It takes nothing unless its
own snapshot still holds at most one such tenant, so it chooses exactly what
the fair claim would; otherwise (or when it finds nothing) the fair claim
runs in a second statement.

Every claim statement runs with its generic plan, made without sequential or
bitmap scans, through a function made for it (`pooling.execute`); the
statements are written so that plan is the right one at any statistics.

**Lease cap** (PostgreSQL): a statement counts leases in its own snapshot, so
two concurrent claims could each see the tenant under its cap. With a cap set
the claim runs in a short transaction that first takes a per-tenant advisory
lock (`pg_try_advisory_xact_lock`, so a claimer never waits for a tenant
another one is claiming — it moves on to the next), then claims for the
locked tenants in a NEW statement whose snapshot sees every lease committed
before the lock. Leases of a tenant are only ever granted under its lock;
other tenants are not held back. The tenants it tries are the sampled ones
under the cap with an eligible job; when there are none, the tenants with
READY work are walked from a random point until some are found, so a claim
comes back empty only when no tenant can be served.

SQLite has no row locks: the claim runs inside `BEGIN IMMEDIATE` (settings set
`transaction_mode`), which takes the database's write lock before reading, so
two claimers are serialised and never both see the same job as eligible; the
tenant is chosen by a small exact query first (one per job of a batch).
"""

import datetime
import threading
from dataclasses import dataclass

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from psycopg.types.datetime import TimestamptzLoader

from . import chance, database, fence, pooling
from .clock import Clock
from .models import Job
from .selectors import ELIGIBLE_SQL
from .sql import compact, fill, query

# Tenants looked at per claim: a random run of the sample table...
SAMPLE_TENANTS = 6
# ...plus up to this many of those that gained READY work in the last
# FRESH_SECONDS: a tenant that was idle is looked at on the next claim, and
# only briefly favoured (it is not "new" any more once it has had its turn).
NEWEST_TENANTS = 2
FRESH_SECONDS = 2.0
# Candidates fetched per tenant: with one tenant, the batch size plus enough
# that concurrent claimers rarely find all of them locked (then the global
# claim runs); with k tenants, the tenant's share of the batch plus a spare
# (the claim has other tenants to go to).
HEADS_ONE_TENANT = 12
HEADS_MANY_TENANTS = 2

# The statements a claim starts from (`_statement` fills them in).
_FAIR_PG = query("claim_fair_batch")
_FAIR_ONE_PG = query("claim_fair_one")
_GLOBAL_PG = query("claim_plain")
_CAP_TENANTS_PG = query("claim_cap_tenants")
_CAP_TENANTS_ALL_PG = query("claim_cap_tenants_all")
_SQLITE = query("claim_sqlite")
_SQLITE_TENANT = query("claim_sqlite_tenant")
_CAP_TRY_LOCKS = query("claim_cap_try_locks")
_CAP_WAIT = query("claim_cap_wait")
# What they are made of.
_LOAD = query("claim_load")
_FAIR_END = query("claim_fair_end")
_SET_LEASED = query("claim_set_leased")
_CLAIM_ORDER = query("claim_order")
_LEASED = query("tenant_leased")
_HAS_ELIGIBLE = query("tenant_has_eligible")
_TENANTS_SAMPLED = query("claim_tenants_sampled")
_TENANTS_LISTED = query("claim_tenants_listed")
# Which tenants each fair claim asks whether they have READY work at all.
_GONE = {template: fill(query(gone), no_ready=fill(query("tenant_has_no_ready"), tenant=tenant))
         for template, gone, tenant in ((_FAIR_PG, "claim_drained_of_heads", "l.tenant"),
                                        (_FAIR_ONE_PG, "claim_drained_of_ranked", "rk.tenant"))}
# The previous work's finishes (writes.sql), in a claim or alone, and a
# batch's lease renewals.
_FINISH = query("finish")
_FINISH_ALONE = query("finish_alone")
_RENEW_PG = query("renew_batch")


def _at(t: str, array: str, ids: str) -> str:
    """Row {t}'s element of the bound array `array` (with its cast): the
    one at its id's place in the bound ids `ids`, which are in id order
    (`_in_id_order`). No join: a binary search (`width_bucket` over a
    sorted array gives the place of a value it holds)."""
    return f"({array})[width_bucket({t}.id, %({ids})s::bigint[])]"


@dataclass(frozen=True)
class _FinishForm:
    """How a statement names the jobs it finishes (the `finish` block's
    fragments): `key` (the condition on jobs_job.id), `epoch` and `result`
    (a row's own, on jobs_job AS f), `load` (what comes off a tenant's lease
    count: in the same statement the jobs being finished still count as
    LEASED, one snapshot), `claims` (what is read of the jobs before the
    finish moves them) and `claimed_at` (a finished row d's claim time in
    it, c)."""

    key: str
    epoch: str
    result: str
    load: str
    claims: str
    claimed_at: str


# One job (the unbatched worker) as single values, several as arrays in id
# order (see the `finish` block).
_FINISH_FORMS = {
    "one": _FinishForm(
        key="= %(finish_id)s::bigint",
        epoch="%(finish_epoch)s::integer",
        result="%(finish_result)s::text",
        load="- (CASE WHEN t.tenant = %(finish_tenant)s THEN 1 ELSE 0 END)",
        # (Its row as it is: no ordered aggregates to set up for one row.)
        claims="updated_at AS claimed_at",
        claimed_at="c.claimed_at",
    ),
    "many": _FinishForm(
        key="= ANY(%(finish_ids)s::bigint[])",
        epoch=_at("f", "%(finish_epochs)s::integer[]", "finish_ids"),
        result=_at("f", "%(finish_results)s::text[]", "finish_ids"),
        load="- cardinality(array_positions(%(finish_tenants)s::varchar[], t.tenant))",
        # (Into arrays in id order, found by a binary search.)
        claims="array_agg(id ORDER BY id) AS ids, array_agg(updated_at ORDER BY id) AS claimed_at",
        claimed_at="c.claimed_at[width_bucket(d.id, c.ids)]",
    ),
}
# A batch of renewals' fence: by the ids, each with its epoch.
_RENEW_FENCE = fence.batch(t="j", key="= ANY(%(renew_ids)s::bigint[])",
                           epoch=_at("j", "%(renew_epochs)s::integer[]", "renew_ids"))

# Which claim a thread's next default claim starts with (see `_claim_pg`).
_last_seen = threading.local()


def _in_id_order(ids: list[int], *columns: list) -> tuple[list, ...]:
    """`ids` and the `columns` that go with them, in id order: what `_at`
    finds its rows' values by. The one place a batch's values are
    ordered."""
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return tuple([values[i] for i in order] for values in (ids, *columns))


class _Params(dict):
    def bind(self, name: str, values) -> str:
        """`IN (…)` over named parameters."""
        names = []
        for i, value in enumerate(values):
            self[f"{name}{i}"] = value
            names.append(f"%({name}{i})s")
        return ", ".join(names)

    def clock(self, clock: Clock, plus: float, name: str) -> str:
        expr, values = clock.sql(plus)
        for i, value in enumerate(values):
            self[f"{name}{i}"] = value
            expr = expr.replace("%s", f"%({name}{i})s", 1)
        return expr


def lease_cap() -> int:
    return int(getattr(settings, "JOBS_TENANT_LEASE_CAP", 0) or 0)


@dataclass(frozen=True)
class Finishes:
    """Jobs to mark DONE (a worker's successes), each fenced by its own
    epoch; `results` are JSON text (already checked) or None."""

    ids: list[int]
    epochs: list[int]
    tenants: list[str]
    results: list[str | None]

    def __bool__(self) -> bool:
        return bool(self.ids)


def claim(*, worker: str, clock: Clock, ttl: float, tenants=None, actions=None, limit: int = 1) -> list[Job]:
    """Lease up to `limit` eligible jobs, each with its own epoch and claim
    event, fairly across tenants. The caller provides the transaction on
    SQLite (PostgreSQL manages its own)."""
    tenants = _checked(limit, tenants)
    if database.vendor() != "postgresql":
        return _claim_sqlite(worker, clock, ttl, tenants, actions, limit)
    if lease_cap():
        return _claim_capped_pg(worker, clock, ttl, tenants, actions, limit)[0]
    return _claim_pg(worker, clock, ttl, tenants, actions, limit)[0]


def pipelined() -> bool:
    """Whether `finish_and_claim` writes finishes with the claim of the next
    work (PostgreSQL; SQLite claims in its own immediate transaction)."""
    return database.vendor() == "postgresql"


def finish_and_claim(*, worker: str, clock: Clock, ttl: float, finish: Finishes, tenants=None, actions=None,
                     limit: int = 1) -> tuple[list[Job], set[int]]:
    """Mark `finish` DONE and lease the next jobs in ONE statement — one
    round trip and one commit for both (only where `pipelined()`; under a
    lease cap, the capped claim's second statement, in its transaction).
    Returns the claimed jobs and the ids of the finishes that were written
    (a job missing there had lost its fence; nothing was written for it).
    Both commit together or not at all."""
    tenants = _checked(limit, tenants)
    if not pipelined():
        raise RuntimeError("finish_and_claim needs PostgreSQL (see pipelined())")
    if lease_cap():
        return _claim_capped_pg(worker, clock, ttl, tenants, actions, limit, finish=finish)
    return _claim_pg(worker, clock, ttl, tenants, actions, limit, finish=finish)


def _checked(limit: int, tenants) -> list[str] | None:
    """The tenant filter in one order (one statement text per set of
    tenants); refuses a batch size below one."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    return sorted(set(tenants)) if tenants else None


def finish_pg(*, worker: str, clock: Clock, finish: Finishes) -> set[int]:
    """Mark `finish` DONE in one statement (PostgreSQL); returns the ids
    written (the others had lost their fence)."""
    with connection.cursor() as cursor:
        pooling.execute(cursor, *_finish_statement(worker, clock, finish))
        return {row[0] for row in cursor.fetchall()}


def _finish_statement(worker: str, clock: Clock, finish: Finishes) -> tuple[str, "_Params"]:
    """`finish_pg`'s statement and its parameters."""
    params = _Params(worker=worker)
    form = _bind_finishes(params, finish)
    return fill(_FINISH_ALONE, finish=_finish_sql(params.clock(clock, 0, "now"), form).rstrip(",")), params


def renew_pg(*, worker: str, clock: Clock, ttl: float, ids: list[int], epochs: list[int]) -> set[int]:
    """Extend the leases of the jobs `ids`, each fenced by its epoch in
    `epochs`, to now + ttl, in one statement (PostgreSQL); returns the ids
    renewed (the others had lost their fence, or are gone)."""
    with connection.cursor() as cursor:
        pooling.execute(cursor, *_renew_statement(worker, clock, ttl, ids, epochs))
        return {row[0] for row in cursor.fetchall()}


def _renew_statement(worker: str, clock: Clock, ttl: float, ids: list[int],
                     epochs: list[int]) -> tuple[str, "_Params"]:
    """`renew_pg`'s statement and its parameters."""
    ids, epochs = _in_id_order(ids, epochs)
    params = _Params(worker=worker, renew_ids=_int_array(ids), renew_epochs=_int_array(epochs))
    return fill(_RENEW_PG, until=params.clock(clock, ttl, "until"), fence=_RENEW_FENCE), params


def _bind_finishes(params: "_Params", finish: Finishes | None) -> str | None:
    """Bind `finish` in the form its size asks for; returns the form's name
    (None: nothing to finish)."""
    if not finish:
        return None
    if len(finish.ids) == 1:
        params.update(finish_id=finish.ids[0], finish_epoch=finish.epochs[0], finish_result=finish.results[0],
                      finish_tenant=finish.tenants[0])
        return "one"
    ids, epochs, results, tenants = _in_id_order(finish.ids, finish.epochs, finish.results, finish.tenants)
    params.update(finish_ids=_int_array(ids), finish_epochs=_int_array(epochs), finish_results=results,
                  finish_tenants=tenants)
    return "many"


def _int_array(values) -> str:
    """Integers as the text of a PostgreSQL array, for a parameter the
    statement casts (`::bigint[]`, `::integer[]`): psycopg adapts a list
    element by element, which costs several times more."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _finish_sql(now: str, form: str) -> str:
    """The finishes' CTEs (ending with a comma), in `form` ("one", "many")."""
    shape = _FINISH_FORMS[form]
    return fill(_FINISH, now=now, fence=fence.batch(t="f", key=shape.key, epoch=shape.epoch), ids=shape.key,
                result=shape.result, claims=shape.claims, claimed_at=shape.claimed_at)


def _claim_pg(worker, clock, ttl, tenants, actions, limit, *, cap=0, finish=None) -> tuple[list[Job], set[int]]:
    if tenants and len(tenants) == 1 and not cap:
        # One tenant: there is no one to be fair to, and the global claim
        # (index job_claim_tenant) costs less.
        return _run(*_statement(_GLOBAL_PG, worker, clock, ttl, tenants, actions, limit, finish=finish))[:2]
    finished: set[int] = set()
    if not tenants and not cap and getattr(_last_seen, "one_tenant", False):
        # The last claim saw one tenant with READY work at most (a queue
        # most of whose days hold one tenant's work, a bench): the global
        # claim, which costs the server less, but only if that is
        # still so in this statement's snapshot — then it chooses exactly
        # what the fair claim would. Else it claims nothing (its finishes
        # are written) and the fair claim runs; so it does when the one
        # tenant had nothing to claim (it prunes a drained tenant).
        jobs, finished, population, _ = _run(*_statement(_GLOBAL_PG, worker, clock, ttl, None, actions, limit,
                                                         finish=finish, one_tenant=True))
        if jobs or population == 0:
            return jobs, finished
        finish = None
    jobs, written, population, pruned = _run(*_statement(_FAIR_PG, worker, clock, ttl, tenants, actions, limit,
                                                         cap=cap, finish=finish))
    finished |= written
    if not tenants and not cap:
        # (The sample holds every tenant when there are few: one means one.)
        _last_seen.one_tenant = population <= 1
        if jobs and len(jobs) < limit and population > 1:
            # Short of the batch: each sampled tenant was given a share, and
            # some could take none (their READY jobs another action's than
            # this worker's, or retries not due). The tenants that gave
            # work are asked for the rest, sharing it as before (else a
            # worker for one action among several tenants takes a fraction
            # of its batch).
            given = sorted({job.tenant for job in jobs})
            jobs += _claim_pg(worker, clock, ttl, given, actions, limit - len(jobs))[0]
        if not jobs and pruned:
            # A sample of drained tenants (a queue emptying, many tenants
            # with a job or two): they are out of the table now, and a new
            # sample costs far less than the plain claim, which walks the
            # claim index past every entry the drained tenants left.
            jobs = _run(*_statement(_FAIR_PG, worker, clock, ttl, tenants, actions, limit))[0]
    if not jobs and not cap:
        # (The finishes were written by the first statement.)
        jobs = _run(*_statement(_GLOBAL_PG, worker, clock, ttl, tenants, actions, limit))[0]
    return jobs, finished


def _claim_capped_pg(worker, clock, ttl, tenants, actions, limit, *,
                     finish: Finishes | None = None) -> tuple[list[Job], set[int]]:
    """The cap holds under concurrency: a tenant's leases are granted only
    under its advisory lock, by a statement that starts after the lock. The
    previous work's `finish` is written by that statement (its jobs, still
    LEASED in its snapshot, come off their tenants' counts as in the plain
    claim), or alone in the same transaction when nothing can be claimed."""
    cap = lease_cap()
    with transaction.atomic():
        # (The jobs being finished, LEASED in these snapshots, are not counted.)
        sql, params = _statement(_CAP_TENANTS_PG, worker, clock, ttl, tenants, actions, limit, cap=cap,
                                 finish=finish)
        tried = _try_locks(sql, params, limit)
        if not tried and not tenants:
            # (A worker's listed tenants were all looked at already.)
            sql, params = _statement(_CAP_TENANTS_ALL_PG, worker, clock, ttl, tenants, actions, limit, cap=cap,
                                     finish=finish)
            tried = _try_locks(sql, params, limit)
        locked = [tenant for tenant, got in tried if got]
        if not locked and tried:
            # Every candidate is being claimed by someone else right now:
            # wait for the first (its claim is one short statement).
            with connection.cursor() as cursor:
                cursor.execute(_CAP_WAIT, [tried[0][0]])
            locked = [tried[0][0]]
        if not locked:
            return [], finish_pg(worker=worker, clock=clock, finish=finish) if finish else set()
        return _claim_pg(worker, clock, ttl, locked, actions, limit, cap=cap, finish=finish)


def _try_locks(sql: str, params: dict, want: int) -> list[tuple[str, bool]]:
    # In psycopg's pipeline mode the transaction's BEGIN travels with the
    # statement: one round trip for both (its function is made before, and
    # the connection opened, as `sending` is entered).
    sql = _try_locks_sql(sql, want)
    with pooling.sending(sql, params) as sent, connection.connection.pipeline(), connection.cursor() as cursor:
        cursor.execute(sent, params)
        return [(row[0], row[1]) for row in cursor.fetchall()]


def _try_locks_sql(sql: str, want: int) -> str:
    """The statement that tries the locks of the tenants `sql` chooses."""
    return fill(_CAP_TRY_LOCKS, query=sql, want=int(want))


def _statement(template: str, worker, clock, ttl, tenants, actions, limit, *, cap=0,
               finish: Finishes | None = None, one_tenant: bool = False) -> tuple[str, dict]:
    params = _Params(worker=worker, cap=cap)
    finish_form = _bind_finishes(params, finish)
    now = params.clock(clock, 0, "now")
    until = params.clock(clock, ttl, "until")
    if template in (_FAIR_PG, _CAP_TENANTS_PG, _CAP_TENANTS_ALL_PG):
        if tenants:
            listed = ", ".join(f"({name}::varchar)" for name in params.bind("tenant", tenants).split(", "))
            tenants_cte = fill(_TENANTS_LISTED, listed=listed)
        else:
            # (A batch looks at as many tenants as it may take jobs, so it can
            # spread over them the way that many single claims would.)
            params.update(slot=chance.rng.random(), fresh=FRESH_SECONDS)
            tenants_cte = _TENANTS_SAMPLED
        # (Not secret, only fresh per claim: the secrets module's system
        # randomness costs more.)
        params["lottery"] = chance.rng.getrandbits(63)
    else:
        tenants_cte = ""
    tenant_filter = f"AND tenant IN ({params.bind('tenant', tenants)})" if tenants else ""
    action_filter = f"AND action IN ({params.bind('action', actions)})" if actions else ""
    # The text depends only on the statement's shape; a worker claims with
    # one shape all day, so it is formatted once, not on every claim.
    shape = (template, now, until, tenants_cte, tenant_filter, action_filter, bool(cap), int(limit), finish_form,
             one_tenant)
    sql = _SQL_TEXT.get(shape)
    if sql is None:
        if len(_SQL_TEXT) >= 256:
            _SQL_TEXT.clear()
        sql = _SQL_TEXT[shape] = _format(template, now, until, tenants_cte, tenant_filter, action_filter, cap,
                                         limit, finish_form, one_tenant)
    return sql, params


_SQL_TEXT: dict[tuple, str] = {}


def _format(template, now, until, tenants_cte, tenant_filter, action_filter, cap, limit, finish, one_tenant) -> str:
    """`template` filled in for one shape of claim (claim.sql names each
    block and fragment)."""
    # Sizes are written into the statement, not bound (claim.sql).
    sizes = {"limit": int(limit), "sample": max(SAMPLE_TENANTS, int(limit)), "newest": NEWEST_TENANTS,
             "heads_one": int(limit) + HEADS_ONE_TENANT, "heads_many": HEADS_MANY_TENANTS}
    if template is _FAIR_PG and int(limit) == 1:
        template = _FAIR_ONE_PG
    eligible = ELIGIBLE_SQL.format(now=now)
    finishing = {
        "finish": _finish_sql(now, finish) if finish else "",
        "finishing_load": _FINISH_FORMS[finish].load if finish else "",
        "finished": query("claim_finished") if finish else query("claim_finished_none"),
        # (One row at most, or no finishes: nothing to number.)
        "finished_once": query("claim_finished_once" if finish and int(limit) > 1 else "claim_finished_as_is"),
    }
    load = fill(_LOAD, tenants=fill(tenants_cte, **sizes), leased=_LEASED, **finishing)
    lease = fill(query("claim_lease_one" if int(limit) == 1 else "claim_lease_batch"),
                 set_leased=fill(_SET_LEASED, now=now, until=until),
                 # (The updates that return a job join no other table: the names are the job's.)
                 returning=", ".join(JOB_COLUMNS))
    return compact(fill(
        template,
        load=load,
        lease=lease,
        end=fill(_FAIR_END, gone=_GONE.get(template, ""), **finishing),
        tenants=fill(tenants_cte, **sizes),
        set_leased=fill(_SET_LEASED, now=now, until=until),
        returning=", ".join(JOB_COLUMNS),
        eligible=eligible,
        tenant_filter=tenant_filter,
        action_filter=action_filter,
        cap_filter_batch=query("claim_cap_batch") if cap else "",
        cap_filter_one=query("claim_cap_one") if cap else "",
        leased=_LEASED,
        has_eligible=fill(_HAS_ELIGIBLE, eligible=eligible, action_filter=action_filter, claim_order=_CLAIM_ORDER),
        claim_order=_CLAIM_ORDER,
        one_tenant=query("claim_one_tenant") if one_tenant else "",
        single_gate=query("claim_one_tenant_gate") if one_tenant else "",
        population=query("claim_one_tenant_population" if one_tenant else "claim_no_population"),
        **finishing,
        **sizes,
    ))


def _run(sql: str, params: dict) -> tuple[list[Job], set[int], int | None, int]:
    """Run a claim statement: the jobs it leased, the ids of the finishes it
    wrote (with `finish`), how many tenants with READY work it saw (the
    fair claim: its sample's size; the one-tenant claim: up to two) and how
    many drained tenants it took out of the sample (the fair claim)."""
    # The thread's connection, looked up once (see `database.vendor`).
    db = connections[DEFAULT_DB_ALIAS]
    cursor = _claim_cursor(db)
    pooling.execute(cursor, sql, params)
    rows = cursor.fetchall()
    claimed, finished, population, pruned = [], set(), None, 0
    for row in rows:
        pruned = row[-3] or pruned
        finished = row[-2] or finished
        population = row[-1]
        if row[0] is not None:
            claimed.append(row[:-3])
    return jobs_from_rows(JOB_COLUMNS, claimed, db), set(finished), population, pruned


def _claim_cursor(db):
    """The claim statements' cursor on this thread's connection, kept from
    one claim to the next. A new cursor learns anew how to read each type of
    the row (psycopg caches its loaders per cursor) and takes its own copy of
    the adapters to read timestamps fast, for every column of every claim.
    A new one is made for a new connection, and while queries are logged (a
    test's capture, DEBUG) for a logging one. `db`: the thread's
    connection."""
    db.ensure_connection()
    made_for, logged, cursor = getattr(db, "_jobs_claim_cursor", (None, None, None))
    if made_for is not db.connection or logged != db.queries_logged:
        cursor = db.cursor()
        _fast_datetimes(cursor)
        db._jobs_claim_cursor = (db.connection, db.queries_logged, cursor)
    return cursor


# Every column of a job, in the order the claim statements return them
# (naming them spares reading the cursor's description on every claim).
JOB_COLUMNS = tuple(f.column for f in Job._meta.concrete_fields)


# Every field's attribute name, in JOB_COLUMNS order.
_JOB_ATTNAMES = tuple(f.attname for f in Job._meta.concrete_fields)


def _fast_datetimes(cursor) -> None:
    """Let this cursor read timestamps with psycopg's own loader, compiled,
    instead of Django's, which is pure Python and runs for every timestamp
    of every claimed row — where both give the same datetime: PostgreSQL with
    USE_TZ and the connection in UTC (Django's default), where psycopg's
    loader returns `datetime.timezone.utc` datetimes as Django's does."""
    if connection.vendor == "postgresql" and connection.timezone is datetime.timezone.utc:
        cursor.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)


def job_from_row(columns: tuple[str, ...], row) -> Job:
    """A Job from a claim's returned row (see `jobs_from_rows`)."""
    return jobs_from_rows(columns, [row])[0]


def jobs_from_rows(columns: tuple[str, ...], rows, db=None) -> list[Job]:
    """Jobs from a claim's returned rows, converted as the ORM would (JSON,
    datetimes on SQLite). `Job.objects.raw` does the same but re-resolves
    fields and converters for every row, on the hot path.
    `db`: the thread's connection, if the caller has it at hand."""
    # The connection itself, not the thread-local proxy, for what follows.
    db = connections[DEFAULT_DB_ALIAS] if db is None else db
    # Only the columns that have converters (on PostgreSQL: the two JSON
    # columns) are touched; the others are taken as psycopg loaded them.
    converted = [(i, convert) for i, convert in enumerate(_converters(db.vendor, columns)) if convert]
    # What `Model.from_db` makes of a full row, without `Model.__init__`
    # walking every field to set what is already known (a batch worker
    # builds every job it claims) — unless an init signal has a receiver:
    # then each job is built the usual way.
    plain = columns is JOB_COLUMNS and not (pre_init.has_listeners(Job) or post_init.has_listeners(Job))
    jobs = []
    for row in rows:
        values = list(row)
        for i, convert in converted:
            values[i] = _apply(convert, values[i], db)
        if not plain:
            jobs.append(Job.from_db(db.alias, list(columns), values))
            continue
        job = Job.__new__(Job)
        job.__dict__.update(zip(_JOB_ATTNAMES, values))
        job._state = ModelState()
        job._state.adding = False
        job._state.db = db.alias
        jobs.append(job)
    return jobs


def _apply(converters, value, db):
    for convert, expression in converters:
        value = convert(value, expression, db)
    return value


_CONVERTERS: dict = {}


def _converters(vendor: str, columns: tuple[str, ...]) -> list:
    key = (vendor, columns)
    if key not in _CONVERTERS:
        fields = {f.column: f for f in Job._meta.concrete_fields}
        resolved = []
        for column in columns:
            field = fields[column]
            col = field.get_col(Job._meta.db_table)
            found = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
            resolved.append([(convert, col) for convert in found])
        _CONVERTERS[key] = resolved
    return _CONVERTERS[key]


def _least_loaded_tenant_sqlite(clock: Clock, tenants, actions) -> str | None:
    params = _Params()
    now = params.clock(clock, 0, "now")
    tenant_filter = f"AND tenant IN ({params.bind('tenant', tenants)})" if tenants else ""
    action_filter = f"AND action IN ({params.bind('action', actions)})" if actions else ""
    cap = lease_cap()
    params["cap"] = cap
    with connection.cursor() as cursor:
        cursor.execute(fill(_SQLITE_TENANT, eligible=ELIGIBLE_SQL.format(now=now), tenant_filter=tenant_filter,
                            action_filter=action_filter), params)
        row = cursor.fetchone()
    return row[0] if row else None


def _claim_sqlite(worker, clock, ttl, tenants, actions, limit) -> list[Job]:
    """One job at a time inside the caller's immediate transaction: each
    choice sees the leases the previous ones made, so a batch is as fair as
    `limit` single claims."""
    jobs = []
    for _ in range(limit):
        tenant = _least_loaded_tenant_sqlite(clock, tenants, actions)
        if tenant is None:
            break
        sql, params = _statement(_SQLITE, worker, clock, ttl, [tenant], actions, 1)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            break
        jobs.append(job_from_row(JOB_COLUMNS, row))
    return jobs
