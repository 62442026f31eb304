"""Claim SQL: the hot path, written where it can be read.

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

PostgreSQL, default path (the fair claim, one statement):
- **which tenants**: a sample from `jobs_readytenant` (tenants with READY
  work, kept by triggers, migration 0007): the `SAMPLE_TENANTS` that follow a
  random point in the table's random `slot` order, plus the `NEWEST_TENANTS`
  that gained READY work in the last `FRESH_SECONDS` (an idle tenant that
  gets a job is looked at on the very next claim). Two index probes, whatever the number of
  tenants; with up to `SAMPLE_TENANTS` tenants the sample is all of them and
  the choice is exact.
- **load**: each sampled tenant's LEASED jobs are counted (index
  `job_leased_expiry`, (tenant, lease_until)), never the whole table's.
- **one job** (`limit` 1, the default worker; `_FAIR_ONE_PG`): the tenants
  are ranked by load (ties by lottery) and asked in that order for their
  first eligible job no one else holds, from `job_claim_tenant` by the
  tenant's key, locked as it is found (`FOR UPDATE SKIP LOCKED`): the first
  tenant nearly always has one, so a claim reads one tenant's entries.
  The tenants asked before the one that gave a job (all, if none did) are
  the ones checked for having no READY job left (below).
- **a batch** (`_FAIR_PG`): **heads**, each tenant's first eligible jobs
  from `job_claim_tenant`; **lock**: the heads are ranked once (`ordered`,
  materialized) and fetched one by one **by primary key** in that order,
  `FOR UPDATE SKIP LOCKED`, until `limit` are locked — a nested loop over a
  handful of ids, the only plan a parameterised lateral primary-key lookup
  has, whatever the statistics say (a table loaded a second ago and one of
  ten million rows get the same plan).
  A row another claimer took meanwhile fails the state re-check or is skipped.
- the chosen rows are leased in the same statement. Sampled tenants that
  turned out to have no READY job left are removed from the sample table by
  the same statement, which calls the prune function of migration 0013 (it
  locks the rows no adder holds, then asks again in a fresh snapshot) — in
  the claim's transaction: no round trip or commit of its own.
If nothing could be locked and the claim took drained tenants out of the
sample, a second fair claim samples again (with many tenants of a job or two
each, a sample can be all drained ones). If nothing could be locked (every
candidate was taken by concurrent claimers, or the sample's work is all
scheduled for later) the plain claim runs
(`_GLOBAL_PG`: the first eligible unlocked jobs in `job_claim_tenant` order),
so contention never makes a busy queue look empty.

One tenant: when a thread's last default claim saw at most one tenant with
READY work (the sample holds every tenant when there are few), its next
claim is the plain one for that tenant, named from `jobs_readytenant` — a
fifth less server CPU than the fair statement. It takes nothing unless its
own snapshot still holds at most one such tenant, so it chooses exactly what
the fair claim would; otherwise (or when it finds nothing) the fair claim
runs in a second statement.

Plan stability: "READY jobs of tenant T in claim order" has exactly one index
that can answer it (`job_claim_tenant`; migration 0007 keeps READY rows out of
`job_state_tenant` and drops the old global-order index), and the locking
step names only the primary key. So the plan does not depend on statistics:
it is the same on a table loaded a second ago, on one analysed while the
queue was empty, and on ten million rows.
Which plan a kept statement runs with is another matter: PostgreSQL weighs
its generic plan against one made for each run's values, and the fair
claim's two estimates are close, so after some statistics changes every run
was planned anew; and a plan made while the table was vacuumed to no pages
reads the whole table, for free then, until the next ANALYZE; and one made
while statistics expected two READY jobs a tenant read all of a deep
tenant's by a bitmap scan and sorted them. Every claim statement therefore
runs with its generic plan, made without sequential or bitmap scans,
through a function made for it (`pooling.execute`).

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
import re
import threading
from dataclasses import dataclass

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from psycopg.types.datetime import TimestamptzLoader

from . import chance, database, pooling
from .clock import Clock
from .models import Job
from .selectors import ELIGIBLE_SQL

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
# Advisory-lock namespace of the lease cap (the first key of the two-key form).
_CAP_LOCK_NAMESPACE = 0x6A6F6273  # "jobs"

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


# Shared tail of the PostgreSQL statements: lease the candidates. A claim
# writes no history row: its time, worker and epoch stay on the job row
# until the row that ends the attempt records them (jobs.models.JobEvent).
_LEASE_PG = """
    claimed AS (
        -- The ids as a key condition, never a join: a join with the
        -- candidates could be planned as a hash join over the whole table
        -- by a generic plan made while statistics said it was empty. One
        -- id is compared with "=", which the primary key serves at any
        -- table size; a list with "= ANY", whose unknown length the
        -- planner takes for ten.
        UPDATE jobs_job AS j SET {set_leased}
        WHERE j.id {leased_ids}
        RETURNING {returning}
    )
"""

# The previous work's finishes, written by the statement that claims the next
# (`claim(finish=…)`) or alone (`finish_many`): each row fenced by its own
# epoch and the worker, exactly like `Store.finish`. One job's finish is
# bound as single values, several as arrays (the text is the same for any
# number of them); see `_FINISH_FORMS`.
#
# No join anywhere: what a row needs from the arrays (its epoch, its result,
# its claim's time) it finds by its id's place among the ids, in id order,
# with a binary search (`width_bucket` over a sorted array gives the place
# of a value it holds). Joined, the arrays' rows to the table's, a batch's
# finish was planned — from statistics that took the table for nearly
# empty, as after a VACUUM of a drained queue that could not shorten it — as
# a nested loop going through all the batch's ids for each of its rows:
# 4.0 ms for a finish of 100 instead of 1.4.
_FINISH_PG = """
    claims AS MATERIALIZED (
        -- When each attempt was claimed: a LEASED row's updated_at, as this
        -- statement's snapshot sees it, before the finish below moves it;
        -- read once, by the ids ({claims}).
        SELECT {claims} FROM jobs_job WHERE id {finish_key}
    ), finished AS (
        UPDATE jobs_job AS f SET state = 'DONE', updated_at = {now}, finished_at = {now}, lease_until = NULL,
               result = {result}::jsonb
        {fenced}
        RETURNING f.id, f.lease_epoch, f.updated_at
    ), finish_logged AS (
        -- The attempt's one history row, with the claim it began with (the
        -- fence held, so the row is still that claim's: a renewal moves
        -- only lease_until). The worker is named once, in worker_id
        -- (JobEvent.by).
        INSERT INTO jobs_jobevent
            (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at, claimed_at)
        SELECT d.id, 'finish', 'LEASED', 'DONE', d.lease_epoch, %(worker)s, '', '', '{{}}', d.updated_at,
               {claimed_at}
        FROM finished AS d, claims AS c
    ),"""
# The fence of a batch of the worker's writes (its finishes, its lease
# renewals), for an UPDATE of jobs_job AS {t}: `key` the condition on
# {t}.id, `epoch` each job's epoch as claimed.
_FENCED = """
        -- The ids as a key condition of their own, which the primary key
        -- serves at any table size.
        WHERE {t}.id {key}
          -- The fence, tested on the row being updated, which takes no row
          -- lock of its own (a WAL record per job): if another transaction
          -- changed it meanwhile (a recovery, a takeover), PostgreSQL waits
          -- for it and tests this again on the newest version, and the
          -- write does nothing. 'LEASED' and the worker are subqueries,
          -- values no plan is made for: written in as constants, 'LEASED'
          -- would let a partial index on LEASED rows, which carries every
          -- lease since the last vacuum, serve the scan.
          AND {t}.state = (SELECT 'LEASED'::varchar)
          AND {t}.lease_epoch = {epoch}
          AND {t}.worker_id = (SELECT %(worker)s::varchar)"""


def _at(t: str, array: str, ids: str) -> str:
    """Row {t}'s element of the bound array `array` (with its cast): the
    one at its id's place in the bound ids `ids`, which are in id order
    (`_in_id_order`)."""
    return f"({array})[width_bucket({t}.id, %({ids})s::bigint[])]"


def _in_id_order(ids: list[int], *columns: list) -> tuple[list, ...]:
    """`ids` and the `columns` that go with them, in id order: what `_at`
    finds its rows' values by. The one place a batch's values are
    ordered."""
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return tuple([values[i] for i in order] for values in (ids, *columns))


# A batch of lease renewals (`Store.renew_many`): one text whatever the
# count (arrays, not a VALUES list per size: each size would be a statement
# and a function of its own).
_RENEW_PG = "UPDATE jobs_job AS j SET lease_until = {until} " + _FENCED.format(
    t="j", key="= ANY(%(renew_ids)s::bigint[])", epoch=_at("j", "%(renew_epochs)s::integer[]", "renew_ids")) + " RETURNING j.id"

# A tenant's LEASED jobs, counted through `job_leased_expiry` (tenant,
# lease_until), the one index that holds LEASED rows (migration 0017): that
# tenant's range of it, whatever the plan.
_LEASED = "SELECT count(*) FROM jobs_job AS c WHERE c.state = 'LEASED' AND c.tenant = t.tenant"


@dataclass(frozen=True)
class _FinishForm:
    """How a statement names the jobs it finishes: `key` (the condition on
    jobs_job.id), `epoch` and `result` (a row's own, on jobs_job AS f),
    `load` (what comes off a tenant's lease count: in the same statement the
    jobs being finished still count as LEASED, one snapshot), `claims` (what
    is read of the jobs before the finish moves them) and `claimed_at` (a
    finished row d's claim time in it, c)."""

    key: str
    epoch: str
    result: str
    load: str
    claims: str
    claimed_at: str


# One job (the unbatched worker): single values, so the generic plan knows
# it looks up exactly one key — "= ANY(array)" is planned for ten, which
# is dearer than reading a table of a few dozen pages.
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
        # (Into arrays in id order, found by a binary search: see above.)
        claims="array_agg(id ORDER BY id) AS ids, array_agg(updated_at ORDER BY id) AS claimed_at",
        claimed_at="c.claimed_at[width_bucket(d.id, c.ids)]",
    ),
}
_FINISHED_IDS = "ARRAY(SELECT id FROM finished)"
# The finished ids, on one row of the result (the first) and NULL on the
# others: written on every claimed row, a batch of 100 sent and parsed
# 10,000 ids — a fifth of a batch worker's CPU.
_FINISHED_ONCE = "CASE WHEN row_number() OVER () = 1 THEN g.finished END AS finished"
_NOT_FINISHING = "NULL::bigint[]"

# Whether a tenant has no READY job: a subquery per tenant, with the tenant
# as a key condition (as an anti-join it could be planned as a filter over
# every READY row of the claim index — a generic plan did, and each prune
# read all the queue's READY entries) and in an order only the claim index
# gives (else statistics from a time when one tenant held all the work make
# a sequential scan look as cheap).
_NO_READY = ("(SELECT r.id FROM jobs_job AS r WHERE r.tenant = {tenant} AND r.state = 'READY' "
             "ORDER BY r.priority DESC LIMIT 1) IS NULL")

# The sample: SAMPLE_TENANTS tenants after a random point of the slot order
# (wrapping around to the start), plus the NEWEST_TENANTS.
# The random point is a subquery (_SLOT), a value no plan is made for. As a
# parameter of a prepared statement, each of a connection's first five
# plans (custom ones) was estimated from the point it drew — a low one made
# the wrap-around part look cheap — and a connection whose five drew low
# kept planning every claim anew (0.8 ms each, more than the claim), as
# PostgreSQL keeps the generic plan only when it looks no dearer than the
# custom ones did. The claims now run with their generic plans (through
# functions, `pooling.execute`); the subquery still serves a statement no
# function could be made for, which runs as it is.
_SLOT = "(SELECT %(slot)s::float8)"
_TENANTS_SAMPLED = """
    after AS MATERIALIZED (
        SELECT tenant FROM jobs_readytenant WHERE slot >= {slot} ORDER BY slot LIMIT {sample}
    ), tenants AS MATERIALIZED (
        SELECT tenant FROM after
        UNION
        (SELECT tenant FROM jobs_readytenant WHERE slot < {slot} ORDER BY slot
         LIMIT greatest(0, {sample} - (SELECT count(*) FROM after)))
        UNION
        (SELECT tenant FROM jobs_readytenant WHERE added > now() - make_interval(secs => %(fresh)s)
         ORDER BY added DESC LIMIT {newest})
    ),""".replace("{slot}", _SLOT)

# A worker restricted to some tenants (`--tenant`), or a capped claim for
# the tenants it locked, already knows them: one bound value each, so the
# prepared statement's generic plan knows how many (an array's length is
# unknown to it and planned as ten, dearer than the custom plan of a few —
# the capped claim was then planned anew on every call).
_TENANTS_LISTED = """
    tenants AS MATERIALIZED (
        SELECT DISTINCT tenant FROM (VALUES {listed}) AS v (tenant)
    ),"""

# A tenant's READY jobs in claim order: the order of job_claim_tenant, which
# "tenant" leads so that no other index can serve it (unqualified: each use
# reads one table).
_CLAIM_ORDER = "tenant, priority DESC, next_attempt_at ASC NULLS FIRST, id"

# The fair claims' end: lease the candidates; sampled tenants without a
# single READY job ({gone}: asked of the tenants the claim looked at) are
# taken out of the sample by the prune function, called from this statement
# (in its transaction, no round trip or commit of its own): a volatile
# function's statements each take a new snapshot, so it locks the rows no
# adder holds and asks again after the lock (migration 0013).
_FAIR_TAIL = """
    SELECT c.*, g.pruned, {finished_once}, (SELECT count(*) FROM load) AS population FROM (
        -- (g: pruned, finished. OFFSET 0 keeps d a subquery of its own:
        -- pulled up, each use of d.t asked the question again.)
        SELECT (SELECT CASE WHEN cardinality(d.t) > 0 THEN jobs_readytenant_prune(d.t) END
                FROM (SELECT ARRAY({gone}) AS t OFFSET 0) AS d) AS pruned, {finished} AS finished
    ) AS g LEFT JOIN claimed AS c ON true
"""

# The sampled (or listed) tenants, each with its lease count and lottery ticket.
_LOAD = """
    WITH {finish} {tenants} load AS MATERIALIZED (
        SELECT t.tenant, hashtextextended(t.tenant, %(lottery)s) AS lottery,
               CASE WHEN (SELECT count(*) FROM tenants) = 1 AND %(cap)s = 0 THEN 0
                    ELSE ({leased}) {finishing_load} END AS leased
        FROM tenants AS t
    ),"""

_FAIR_PG = _LOAD + """
    heads AS MATERIALIZED (
        SELECT h.id, l.tenant, l.lottery, h.priority, h.next_attempt_at,
               -- The load this tenant would have if its earlier heads ran too.
               l.leased + row_number() OVER (PARTITION BY l.tenant ORDER BY h.priority DESC,
                   h.next_attempt_at ASC NULLS FIRST, h.id) AS turn
        FROM load AS l
        CROSS JOIN LATERAL (
            SELECT id, priority, next_attempt_at FROM jobs_job
            WHERE tenant = l.tenant AND {eligible} {action_filter}
            ORDER BY {claim_order}
            LIMIT (SELECT CASE WHEN count(*) > 1 THEN {limit} / count(*) + {heads_many} ELSE {heads_one} END
                   FROM load)
        ) AS h
    ), ordered AS MATERIALIZED (
        SELECT id, row_number() OVER (ORDER BY turn, lottery, priority DESC, next_attempt_at ASC NULLS FIRST, id)
               AS position
        FROM heads {cap_filter}
    ), candidate AS (
        -- The lookup names nothing but the primary key, so no other index
        -- can serve it (OFFSET 0 keeps the planner from pushing the state
        -- test in, which would let a partial index compete); the state is
        -- checked on the locked, current row.
        SELECT c.id FROM (SELECT id, position FROM ordered ORDER BY position) AS o
        CROSS JOIN LATERAL (
            SELECT j.id, j.state FROM jobs_job AS j WHERE j.id = o.id
            OFFSET 0
            FOR UPDATE SKIP LOCKED
        ) AS c
        WHERE c.state = 'READY'
        ORDER BY o.position
        LIMIT {limit}
    ),
""" + _LEASE_PG + _FAIR_TAIL
# (Each sampled tenant without heads is asked whether it has READY work at all.)
_GONE_OF_HEADS = ("SELECT l.tenant FROM load AS l WHERE CASE WHEN EXISTS (SELECT FROM heads AS h "
                  "WHERE h.tenant = l.tenant) THEN false ELSE " + _NO_READY.format(tenant="l.tenant") + " END")

# One job (the default worker, `limit` 1): the tenants are ranked once, least
# loaded first (ties by lottery), and asked in that order for their first
# eligible job no one else holds, locked as it is found (FOR UPDATE SKIP
# LOCKED, in the claim index's order: a row another claimer leased meanwhile
# fails the state test again, on its newest version) — the first tenant
# nearly always has one, so a claim reads one tenant's claim index entries,
# not the heads of every sampled tenant, and ranks tenants, not jobs.
_FAIR_ONE_PG = _LOAD + """
    ranked AS MATERIALIZED (
        SELECT tenant, row_number() OVER (ORDER BY leased, lottery) AS position FROM load {cap_filter_one}
    ), candidate AS (
        SELECT h.id, r.position FROM (SELECT tenant, position FROM ranked ORDER BY position OFFSET 0) AS r
        CROSS JOIN LATERAL (
            SELECT id FROM jobs_job
            WHERE tenant = r.tenant AND {eligible} {action_filter}
            ORDER BY {claim_order}
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) AS h
        LIMIT 1
    ),
""" + _LEASE_PG + _FAIR_TAIL
# (The tenants asked before the one that gave a job — all of them when none
# did — are asked whether they have READY work at all.)
_GONE_OF_RANKED = ("SELECT rk.tenant FROM ranked AS rk WHERE rk.position < coalesce((SELECT c.position FROM "
                   "candidate AS c), (SELECT count(*) + 1 FROM ranked)) AND " + _NO_READY.format(tenant="rk.tenant"))
# Which tenants each fair claim asks whether they have READY work at all.
_GONE = {_FAIR_PG: _GONE_OF_HEADS, _FAIR_ONE_PG: _GONE_OF_RANKED}


# Tenant-first like every claim: job_claim_tenant serves it (with one tenant
# listed, "tenant" is a constant and the order is the tenant's claim order).
# The LIMIT is a subquery, a size the planner cannot read: it then plans for
# a tenth of the rows it expects and so walks the claim index in order,
# stopping at the batch. Written in as a constant, a batch of 100 from a
# tenant the statistics gave a few dozen READY rows (taken while many
# tenants each held a few) was planned as a bitmap scan and a sort of all
# the tenant's READY rows: a deep backlog read whole on every claim.
_GLOBAL_PG = """
    WITH {finish} {one_tenant_cte} candidate AS (
        SELECT id FROM jobs_job
        WHERE {eligible} {tenant_filter} {action_filter} {single_gate}
        ORDER BY {claim_order}
        LIMIT (SELECT {limit})
        FOR UPDATE SKIP LOCKED
    ),
""" + _LEASE_PG + """
    SELECT c.*, NULL AS pruned, {finished_once}, {population} AS population
    FROM (SELECT {finished} AS finished) AS g LEFT JOIN claimed AS c ON true
"""

# The one-tenant claim's question, asked once: how many tenants hold READY
# work (counted up to two, from `jobs_readytenant`), and which, if only one.
_ONE_TENANT_CTE = """
    ready_tenants AS MATERIALIZED (
        SELECT count(*) AS n, min(p.tenant) AS tenant FROM (SELECT tenant FROM jobs_readytenant LIMIT 2) AS p
    ),"""

# Which claim a thread's next default claim starts with (see `_claim_pg`).
_last_seen = threading.local()

# With a lease cap: which tenants to try to lock — under the cap and with
# an eligible job — in the fair order (counts and jobs as this statement's
# snapshot sees them: a pre-filter only; the claim counts again under the lock).
# Asked per tenant, as a subquery in the claim index's order (as EXISTS it
# was pulled up into a semi-join that read every READY entry of the index,
# whatever the tenant, on every capped claim).
_HAS_ELIGIBLE = ("(SELECT e.id FROM jobs_job AS e WHERE e.tenant = {tenant} AND {eligible} {action_filter} "
                 "ORDER BY {claim_order} LIMIT 1) IS NOT NULL")
_CAP_TENANTS_PG = """
    WITH {tenants} load AS MATERIALIZED (
        SELECT t.tenant, hashtextextended(t.tenant, %(lottery)s) AS lottery, ({leased}) {finishing_load} AS leased
        FROM tenants AS t
    )
    SELECT tenant FROM load AS t WHERE leased < %(cap)s AND {has_eligible} ORDER BY leased, lottery
"""

# The cap path's fallback when every sampled tenant is at its cap (or has
# only work for later): the tenants with READY work, walked from a random
# point of the slot order (wrapping around) until {sample} are found under
# the cap with an eligible job. It reads past the tenants at their cap, so
# a claim comes back empty only when no tenant could be served.
_CAP_TENANTS_ALL_PG = """
    SELECT t.tenant FROM (
        (SELECT tenant FROM jobs_readytenant WHERE slot >= {slot} ORDER BY slot)
        UNION ALL
        (SELECT tenant FROM jobs_readytenant WHERE slot < {slot} ORDER BY slot)
    ) AS t
    WHERE ({leased}) {finishing_load} < %(cap)s AND {has_eligible}
    LIMIT {sample}
""".replace("{slot}", _SLOT)

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
    sql = "WITH " + _finish_sql(params.clock(clock, 0, "now"), form).rstrip().rstrip(",")
    return sql + " SELECT id FROM finished", params


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
    return _compact(_RENEW_PG.replace("{until}", params.clock(clock, ttl, "until"))), params


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
    statement casts (`::bigint[]`, `::integer[]`). psycopg adapts a list
    element by element: a batch of 100's ids and epochs took 0.1 ms, about
    a twentieth of a batch worker's CPU; this text costs a quarter of that."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _finish_sql(now: str, form: str) -> str:
    shape = _FINISH_FORMS[form]
    fenced = _FENCED.format(t="f", key=shape.key, epoch=shape.epoch)
    return _FINISH_PG.format(now=now, fenced=fenced, finish_key=shape.key, result=shape.result, claims=shape.claims,
                             claimed_at=shape.claimed_at)


def _claim_pg(worker, clock, ttl, tenants, actions, limit, *, cap=0, finish=None) -> tuple[list[Job], set[int]]:
    if tenants and len(tenants) == 1 and not cap:
        # One tenant: there is no one to be fair to, and the global claim
        # (index job_claim_tenant) costs less.
        return _run(*_statement(_GLOBAL_PG, worker, clock, ttl, tenants, actions, limit, finish=finish))[:2]
    finished: set[int] = set()
    if not tenants and not cap and getattr(_last_seen, "one_tenant", False):
        # The last claim saw one tenant with READY work at most (a queue
        # most of whose days hold one tenant's work, a bench): the global
        # claim, which costs a fifth less server CPU, but only if that is
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
            # work are asked for the rest, sharing it as before (a worker
            # for one action among three tenants took a third of its batch).
            given = sorted({job.tenant for job in jobs})
            jobs += _claim_pg(worker, clock, ttl, given, actions, limit - len(jobs))[0]
        if not jobs and pruned:
            # A sample of drained tenants (a queue emptying, many tenants
            # with a job or two): they are out of the table now, and a new
            # sample costs a tenth of the plain claim, which walks the claim
            # index past every entry the drained tenants left.
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


# The candidate tenants, each with whether this transaction got its advisory
# lock — chosen and tried in ONE statement (a round trip per tenant made
# the capped claim several times dearer than the plain one). Locks are
# tried in the candidates' fair order until `want` (the batch size) are
# held, no more: a claimer that held every candidate it could lock (six,
# for one job) made the others find them taken, and wait. The lock call is
# a volatile function in the filter over the sorted candidates (OFFSET 0:
# never pushed below the sort), so rows are tried one by one in order and
# the LIMIT stops the trying.
_CAP_TRY_LOCKS = (
    "WITH candidates AS MATERIALIZED ({query}), "
    "ordered AS MATERIALIZED (SELECT tenant, row_number() OVER () AS position FROM candidates), "
    "locked AS MATERIALIZED ("
    "SELECT o.tenant FROM (SELECT tenant, position FROM ordered ORDER BY position OFFSET 0) AS o "
    f"WHERE pg_try_advisory_xact_lock({_CAP_LOCK_NAMESPACE}, hashtext(o.tenant)) LIMIT {{want}}) "
    "SELECT o.tenant, o.tenant IN (SELECT tenant FROM locked) AS got FROM ordered AS o ORDER BY o.position"
)
_CAP_WAIT = f"SELECT pg_advisory_xact_lock({_CAP_LOCK_NAMESPACE}, hashtext(%s))"


def _try_locks(sql: str, params: dict, want: int) -> list[tuple[str, bool]]:
    # In psycopg's pipeline mode the transaction's BEGIN travels with the
    # statement: one round trip for both (its function is made before, and
    # the connection opened, as `sending` is entered).
    sql = _CAP_TRY_LOCKS.format(query=sql, want=int(want))
    with pooling.sending(sql, params) as sent, connection.connection.pipeline(), connection.cursor() as cursor:
        cursor.execute(sent, params)
        return [(row[0], row[1]) for row in cursor.fetchall()]


def _statement(template: str, worker, clock, ttl, tenants, actions, limit, *, cap=0,
               finish: Finishes | None = None, one_tenant: bool = False) -> tuple[str, dict]:
    params = _Params(worker=worker, cap=cap)
    finish_form = _bind_finishes(params, finish)
    now = params.clock(clock, 0, "now")
    until = params.clock(clock, ttl, "until")
    if template in (_FAIR_PG, _CAP_TENANTS_PG, _CAP_TENANTS_ALL_PG):
        if tenants:
            listed = ", ".join(f"({name}::varchar)" for name in params.bind("tenant", tenants).split(", "))
            tenants_cte = _TENANTS_LISTED.replace("{listed}", listed)
        else:
            # (A batch looks at as many tenants as it may take jobs, so it can
            # spread over them the way that many single claims would.)
            params.update(slot=chance.rng.random(), fresh=FRESH_SECONDS)
            tenants_cte = _TENANTS_SAMPLED
        # (Not secret, only fresh per claim: the secrets module's system
        # randomness cost a twentieth of a worker's CPU.)
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
    # Sizes are written into the statement, not bound: with them known, even
    # a generic (prepared) plan expects a handful of rows and keeps the
    # nested loops over primary keys.
    sizes = {"limit": int(limit), "sample": max(SAMPLE_TENANTS, int(limit)), "newest": NEWEST_TENANTS,
             "heads_one": int(limit) + HEADS_ONE_TENANT, "heads_many": HEADS_MANY_TENANTS}
    # (The updates that return a job join no other table: the names are the job's.)
    returning = ", ".join(JOB_COLUMNS)
    if template is _FAIR_PG and int(limit) == 1:
        template = _FAIR_ONE_PG
    return _compact(template.format(
        returning=returning,
        tenants=tenants_cte.format(**sizes),
        set_leased=_SET_LEASED.format(now=now, until=until),
        eligible=ELIGIBLE_SQL.format(now=now),
        tenant_filter=tenant_filter,
        action_filter=action_filter,
        cap_filter="WHERE turn <= %(cap)s" if cap else "",
        cap_filter_one="WHERE leased < %(cap)s" if cap else "",
        gone=_GONE.get(template, ""),
        finish=_finish_sql(now, finish) if finish else "",
        finishing_load=_FINISH_FORMS[finish].load if finish else "",
        leased=_LEASED,
        has_eligible=_HAS_ELIGIBLE.format(tenant="t.tenant", eligible=ELIGIBLE_SQL.format(now=now),
                                          action_filter=action_filter, claim_order=_CLAIM_ORDER),
        claim_order=_CLAIM_ORDER,
        leased_ids="= (SELECT id FROM candidate)" if int(limit) == 1 else "= ANY(ARRAY(SELECT id FROM candidate))",
        finished=_FINISHED_IDS if finish else _NOT_FINISHING,
        # (One row at most, or no finishes: nothing to number.)
        finished_once=_FINISHED_ONCE if finish and int(limit) > 1 else "g.finished AS finished",
        # The one-tenant claim takes nothing unless at most one tenant holds
        # READY work, and names it: a key for the claim index (an ordered
        # walk without one was planned, from some statistics, over another
        # index of every job).
        one_tenant_cte=_ONE_TENANT_CTE if one_tenant else "",
        single_gate="AND tenant = (SELECT r.tenant FROM ready_tenants AS r WHERE r.n <= 1)" if one_tenant else "",
        population="(SELECT r.n FROM ready_tenants AS r)" if one_tenant else "NULL::bigint",
        **sizes,
    ))


def _compact(sql: str) -> str:
    """The statement without its comments and indentation. Shorter than
    4 KiB, psycopg keeps its conversion of the query (named parameters to
    $n) in a cache instead of redoing it on every claim — a tenth of a
    millisecond of the worker's CPU per job. (The templates hold no string
    literal with "--" or significant whitespace.)"""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split()).replace("( ", "(").replace(" )", ")")


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
    the adapters to read timestamps fast: with a claim's 33 columns, 30 µs
    of a worker's CPU a claim. A new one is made for a new connection, and
    while queries are logged (a test's capture, DEBUG) for a logging one.
    `db`: the thread's connection."""
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
    instead of Django's, which is pure Python (a fifth of a batch worker's
    CPU went into it) — where both give the same datetime: PostgreSQL with
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
    fields and converters for every row — a millisecond on the hot path.
    `db`: the thread's connection, if the caller has it at hand."""
    # The connection itself, not the thread-local proxy, for what follows.
    db = connections[DEFAULT_DB_ALIAS] if db is None else db
    # Only the columns that have converters (on PostgreSQL: the two JSON
    # columns) are touched; the others are taken as psycopg loaded them.
    converted = [(i, convert) for i, convert in enumerate(_converters(db.vendor, columns)) if convert]
    # What `Model.from_db` makes of a full row, without `Model.__init__`
    # walking every field to set what is already known (a third of a batch
    # worker's CPU went into building jobs) — unless an init signal has a
    # receiver: then each job is built the usual way.
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
        cursor.execute(
            f"""
            SELECT e.tenant FROM (SELECT DISTINCT tenant FROM jobs_job
                                  WHERE {ELIGIBLE_SQL.format(now=now)} {tenant_filter} {action_filter}) AS e
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
