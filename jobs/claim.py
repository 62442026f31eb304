"""Claim SQL: the hot path, written where it can be read.

Both back ends run the same semantics: pick an eligible READY job, move it to
LEASED with `lease_epoch + 1`, the worker's id and `lease_until = now + ttl`,
count the attempt, and append the claim to the job's history — in one
transaction.

Which job: tenants are served **least-loaded first** (fewest LEASED jobs right
now; ties broken by lottery so no tenant is systematically first), and within
a tenant by `priority DESC, next_attempt_at (NULL = at once, first), id`. A
tenant at `JOBS_TENANT_LEASE_CAP` concurrent leases is skipped; the others are
not held back by it. So one tenant's backlog of 10,000 cannot starve another
tenant's 10 jobs: those start within a claim or two of being enqueued.

PostgreSQL does it in ONE statement (`_FAIR_PG`): a recursive CTE walks the
distinct tenants with READY rows (a loose index scan, one probe per tenant,
on `job_claim_tenant`), takes each tenant's first few eligible jobs from the
same index, orders them by tenant load, then locks one with
`FOR UPDATE SKIP LOCKED` — concurrent claimers step over each other's rows
instead of queueing — updates it and inserts the event. DONE and WAITING rows
are never visited: both claim indexes are partial on `state = 'READY'`
(migration 0002). If every candidate was locked by concurrent claimers the
plain global claim (`_GLOBAL_PG`, index `job_claim_ready`) runs, so contention
never makes a busy queue look empty.

SQLite has no row locks: the claim runs inside `BEGIN IMMEDIATE` (settings set
`transaction_mode`), which takes the database's write lock before reading, so
two claimers are serialised and never both see the same job as eligible; the
tenant is chosen by a small query first.
"""

import secrets

from django.conf import settings
from django.db import connection

from .clock import Clock
from .models import Job

# Candidates looked at per tenant: enough that concurrent claimers on one
# tenant rarely find all of them locked (then the global claim runs).
HEADS_PER_TENANT = 8

_SET_LEASED = """
    state = 'LEASED',
    lease_epoch = j.lease_epoch + 1,
    worker_id = %(worker)s,
    lease_until = {until},
    attempts = j.attempts + 1,
    first_attempt_at = COALESCE(j.first_attempt_at, {now}),
    wait_reason = '',
    updated_at = {now}
"""

_ELIGIBLE = "state = 'READY' AND (next_attempt_at IS NULL OR next_attempt_at <= {now})"

# Shared tail of both PostgreSQL statements: lease the candidate, log the claim.
_LEASE_AND_LOG_PG = """
    claimed AS (
        UPDATE jobs_job AS j SET {set_leased}
        FROM candidate WHERE j.id = candidate.id
        RETURNING {returning}
    ), logged AS (
        INSERT INTO jobs_jobevent
            (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at)
        SELECT id, 'claim', 'READY', 'LEASED', lease_epoch, worker_id, worker_id, '', '{{}}', updated_at
        FROM claimed
    )
    SELECT * FROM claimed
"""

# The tenants with READY work: a loose index scan, one probe per tenant.
_TENANTS_WALK = """
    WITH RECURSIVE tenants AS (
        (SELECT tenant FROM jobs_job WHERE state = 'READY' ORDER BY tenant LIMIT 1)
        UNION ALL
        SELECT (SELECT n.tenant FROM jobs_job AS n
                WHERE n.state = 'READY' AND n.tenant > t.tenant
                ORDER BY n.tenant LIMIT 1)
        FROM tenants AS t WHERE t.tenant IS NOT NULL
    ),"""

# A worker restricted to some tenants (`--tenant`) already knows them: the
# heads below find which have READY work. Walking the index instead gives the
# planner probes like `tenant > 'a' AND tenant IN ('a')`, which it answers
# with sequential scans on a small or freshly loaded table.
_TENANTS_LISTED = """
    WITH tenants AS (
        SELECT DISTINCT tenant FROM unnest(%(tenant_list)s::varchar[]) AS tenant
    ),"""

_FAIR_PG = """
    {tenants} load AS (
        SELECT tenant, count(*) AS leased FROM jobs_job WHERE state = 'LEASED' GROUP BY tenant
    ), heads AS MATERIALIZED (
        SELECT h.id, t.tenant, COALESCE(l.leased, 0) AS leased,
               md5(t.tenant || %(lottery)s) AS lottery, h.priority, h.next_attempt_at
        FROM tenants AS t
        LEFT JOIN load AS l ON l.tenant = t.tenant
        CROSS JOIN LATERAL (
            SELECT id, priority, next_attempt_at FROM jobs_job
            WHERE tenant = t.tenant AND {eligible} {action_filter}
            -- "tenant" leads so only job_claim_tenant can serve this order.
            ORDER BY tenant, priority DESC, next_attempt_at ASC NULLS FIRST, id
            LIMIT {heads}
        ) AS h
        WHERE t.tenant IS NOT NULL {cap_filter}
    ), ordered AS (
        SELECT ARRAY(SELECT id FROM heads ORDER BY leased, lottery, priority DESC,
                                                   next_attempt_at ASC NULLS FIRST, id) AS ids
    ), candidate AS (
        -- At most HEADS_PER_TENANT rows per tenant, fetched and locked
        -- through the primary key in the order chosen above; a row another
        -- claimer took meanwhile fails the state re-check or is skipped.
        SELECT j.id FROM jobs_job AS j, ordered
        WHERE j.id = ANY(ordered.ids) AND j.state = 'READY'
        ORDER BY array_position(ordered.ids, j.id)
        LIMIT 1
        FOR UPDATE OF j SKIP LOCKED
    ),
""" + _LEASE_AND_LOG_PG

_GLOBAL_PG = """
    WITH candidate AS (
        SELECT id FROM jobs_job
        WHERE {eligible} {tenant_filter} {action_filter}
        ORDER BY priority DESC, next_attempt_at ASC NULLS FIRST, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ),
""" + _LEASE_AND_LOG_PG

# SQLite sorts NULLs first on its own (and has no NULLS FIRST in indexes).
_SQLITE = """
    UPDATE jobs_job AS j SET {set_leased}
    WHERE j.id = (SELECT id FROM jobs_job WHERE {eligible} {tenant_filter} {action_filter}
                  ORDER BY priority DESC, next_attempt_at ASC, id LIMIT 1)
    RETURNING {returning}
"""


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


def claim_next(*, worker: str, clock: Clock, ttl: float, tenants=None, actions=None) -> Job | None:
    """Lease the next eligible job; the caller provides the transaction on
    SQLite (PostgreSQL statements are atomic on their own)."""
    if connection.vendor == "postgresql":
        if tenants and len(set(tenants)) == 1:
            # One tenant: there is no one to be fair to, and the global claim
            # (index job_claim_ready, lease cap included) costs half as much.
            return _run(*_statement(_GLOBAL_PG, worker, clock, ttl, tenants, actions))
        job = _run(*_statement(_FAIR_PG, worker, clock, ttl, tenants, actions))
        if job is None:
            job = _run(*_statement(_GLOBAL_PG, worker, clock, ttl, tenants, actions))
        return job
    tenant = _least_loaded_tenant_sqlite(clock, tenants, actions)
    if tenant is None:
        return None
    return _run(*_statement(_SQLITE, worker, clock, ttl, [tenant], actions))


def _statement(template: str, worker, clock, ttl, tenants, actions) -> tuple[str, dict]:
    params = _Params(worker=worker, lottery=secrets.token_hex(4))
    now = params.clock(clock, 0, "now")
    until = params.clock(clock, ttl, "until")
    cap = lease_cap()
    if cap and template is _GLOBAL_PG:
        # The fallback must respect the cap too.
        params["cap"] = cap
        tenant_cap = (
            " AND (SELECT count(*) FROM jobs_job AS c WHERE c.state = 'LEASED' "
            "AND c.tenant = jobs_job.tenant) < %(cap)s"
        )
    else:
        tenant_cap = ""
    if template is _FAIR_PG:
        if tenants:
            params["tenant_list"] = list(tenants)
        tenants_cte = _TENANTS_LISTED if tenants else _TENANTS_WALK
    else:
        tenants_cte = ""
    sql = template.format(
        returning=", ".join(f"j.{c}" for c in JOB_COLUMNS) if template is not _SQLITE else ", ".join(JOB_COLUMNS),
        tenants=tenants_cte,
        set_leased=_SET_LEASED.format(now=now, until=until),
        eligible=_ELIGIBLE.format(now=now),
        tenant_filter=(f"AND tenant IN ({params.bind('tenant', tenants)})" if tenants else "") + tenant_cap,
        action_filter=f"AND action IN ({params.bind('action', actions)})" if actions else "",
        cap_filter="AND COALESCE(l.leased, 0) < %(cap)s" if cap else "",
        heads=HEADS_PER_TENANT,
    )
    if cap:
        params["cap"] = cap
    return sql, params


def _run(sql: str, params: dict) -> Job | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else job_from_row(JOB_COLUMNS, row)


# Every column of a job, in the order the claim statements return them
# (naming them spares reading the cursor's description on every claim).
JOB_COLUMNS = tuple(f.column for f in Job._meta.concrete_fields)


def job_from_row(columns: tuple[str, ...], row) -> Job:
    """A Job from a claim's returned row, converted as the ORM would (JSON,
    datetimes on SQLite). `Job.objects.raw` does the same but re-resolves
    fields and converters for every row — a millisecond on the hot path."""
    converters = _converters(connection.vendor, columns)
    values = [value if not convert else _apply(convert, value) for convert, value in zip(converters, row)]
    return Job.from_db(connection.alias, list(columns), values)


def _apply(converters, value):
    for convert, expression in converters:
        value = convert(value, expression, connection)
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
        cursor.execute(
            f"""
            SELECT e.tenant FROM (SELECT DISTINCT tenant FROM jobs_job
                                  WHERE {_ELIGIBLE.format(now=now)} {tenant_filter} {action_filter}) AS e
            LEFT JOIN (SELECT tenant, count(*) AS leased FROM jobs_job WHERE state = 'LEASED'
                       GROUP BY tenant) AS l ON l.tenant = e.tenant
            WHERE %(cap)s = 0 OR COALESCE(l.leased, 0) < %(cap)s
            ORDER BY COALESCE(l.leased, 0), random()
            LIMIT 1
            """,
            params,
        )
        row = cursor.fetchone()
    return row[0] if row else None
