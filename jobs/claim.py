"""Claim SQL: the hot path, written where it can be read.

Both back ends run the same semantics: pick the first eligible READY job in
`priority DESC, next_attempt_at (NULL = at once, first), id` order, move it to
LEASED with `lease_epoch + 1`, the worker's id and `lease_until = now + ttl`,
count the attempt, and append the claim to the job's history — in one
transaction.

PostgreSQL does it in ONE statement: a CTE picks the candidate with
`FOR UPDATE SKIP LOCKED` (concurrent claimers step over each other's row
instead of queueing behind it), updates it and inserts the event. The
candidate scan is served by the partial index `job_claim_ready`
(migration 0002: `(priority DESC, next_attempt_at NULLS FIRST, id) WHERE
state = 'READY'`), so DONE and WAITING rows are never visited.

SQLite has no row locks: the claim runs inside `BEGIN IMMEDIATE` (settings set
`transaction_mode`), which takes the database's write lock before reading, so
two claimers are serialised and never both see the same job as eligible.
"""

from django.db import connection

from .clock import Clock
from .models import Job

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


def _filters(tenants, actions, params) -> str:
    sql = ""
    if tenants:
        names = [f"%(tenant{i})s" for i in range(len(tenants))]
        params.update({f"tenant{i}": t for i, t in enumerate(tenants)})
        sql += f" AND tenant IN ({', '.join(names)})"
    if actions:
        names = [f"%(action{i})s" for i in range(len(actions))]
        params.update({f"action{i}": a for i, a in enumerate(actions)})
        sql += f" AND action IN ({', '.join(names)})"
    return sql


def _named(clock: Clock, plus: float, name: str, params: dict) -> str:
    """Bind a clock expression under a parameter name (the SQL below uses pyformat)."""
    expr, values = clock.sql(plus)
    for i, value in enumerate(values):
        key = f"{name}{i}"
        params[key] = value
        expr = expr.replace("%s", f"%({key})s", 1)
    return expr


def claim_next_sql(*, worker: str, clock: Clock, ttl: float, tenants=None, actions=None) -> tuple[str, dict]:
    params: dict = {"worker": worker}
    now = _named(clock, 0, "now", params)
    until = _named(clock, ttl, "until", params)
    where = _ELIGIBLE.format(now=now) + _filters(tenants, actions, params)
    order = "priority DESC, next_attempt_at ASC NULLS FIRST, id"
    if connection.vendor == "postgresql":
        sql = f"""
            WITH candidate AS (
                SELECT id FROM jobs_job
                WHERE {where}
                ORDER BY {order}
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            ), claimed AS (
                UPDATE jobs_job AS j SET {_SET_LEASED.format(now=now, until=until)}
                FROM candidate WHERE j.id = candidate.id
                RETURNING j.*
            ), logged AS (
                INSERT INTO jobs_jobevent
                    (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at)
                SELECT id, 'claim', 'READY', 'LEASED', lease_epoch, worker_id, worker_id, '', '{{}}', updated_at
                FROM claimed
            )
            SELECT * FROM claimed
        """
    else:
        # SQLite orders NULLs first on its own and has no NULLS FIRST in indexes.
        order = "priority DESC, next_attempt_at ASC, id"
        sql = f"""
            UPDATE jobs_job AS j SET {_SET_LEASED.format(now=now, until=until)}
            WHERE j.id = (SELECT id FROM jobs_job WHERE {where} ORDER BY {order} LIMIT 1)
            RETURNING *
        """
    return sql, params


def run_claim(sql: str, params: dict) -> Job | None:
    """Execute a claim statement and return the claimed job (or None)."""
    claimed = list(Job.objects.raw(sql, params))
    return claimed[0] if claimed else None
