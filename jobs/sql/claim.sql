-- The claim: pick eligible READY jobs (one, or up to {limit} for a batch),
-- move each to LEASED with its own lease_epoch + 1, the worker's id,
-- lease_until = now + ttl and updated_at = now (the claim's time), and count
-- the attempt, in one statement (jobs/claim.py composes it and says when
-- each form runs). Blocks are named `-- name --`; `{name}` is a block or a
-- fragment the Python puts in, `%(name)s` a bound parameter.
--
-- PostgreSQL, the fair claim (claim_fair_one, claim_fair_batch):
-- - which tenants: a sample of jobs_readytenant (the tenants with READY
--   work, kept by the triggers of schema.sql), the tenants that follow a
--   random point of its random `slot` order plus the newest ones; two index
--   probes whatever the number of tenants. With few tenants the sample is
--   all of them and the choice is exact.
-- - load: each sampled tenant's LEASED jobs, counted by job_leased_expiry.
-- - one job: the tenants ranked by load (ties by lottery) and asked in that
--   order for their first eligible job no one else holds, from
--   job_claim_tenant, locked as it is found: the first tenant nearly
--   always has one, so a claim reads one tenant's entries.
-- - a batch: each tenant's first eligible jobs (heads), ranked once and
--   locked one by one by primary key until {limit} are held.
-- - the chosen rows are leased by the same statement, which also takes
--   sampled tenants left without READY work out of the sample
--   (jobs_readytenant_prune, schema.sql), in the claim's transaction.
--
-- Plan stability: "READY jobs of tenant T in claim order" has exactly one
-- index that can answer it, job_claim_tenant (READY rows are kept out of
-- job_state_tenant, and there is no global claim-order index), and the
-- locking step names only the primary key. So the plan does not depend on
-- statistics: it is the same on a table loaded a second ago, on one
-- analysed while the queue was empty, and on a large one. Every claim
-- statement runs with its generic plan, made without sequential or bitmap
-- scans, through a function made for it (jobs/pooling.py): the statements
-- are written so that the generic plan is the right one at any statistics.
-- Sizes ({limit}, {sample}, …) are written into the text, not bound: with
-- them known, even a generic plan expects a handful of rows and keeps the
-- nested loops over primary keys.


-- claim_load --
-- The fair claims' start: the sampled (or listed) tenants, each with its
-- lease count and lottery ticket. {finish}: the previous work's finishes
-- (writes.sql, finish) when this statement writes them; their jobs, still
-- LEASED in this statement's snapshot, come off their tenants' counts
-- ({finishing_load}). With one tenant and no cap the count decides nothing
-- and is not read.
WITH {finish} {tenants} load AS MATERIALIZED (
    SELECT t.tenant, hashtextextended(t.tenant, %(lottery)s) AS lottery,
           CASE WHEN (SELECT count(*) FROM tenants) = 1 AND %(cap)s = 0 THEN 0
                ELSE ({leased}) {finishing_load} END AS leased
    FROM tenants AS t
),

-- claim_tenants_sampled --
-- The sample: {sample} tenants after a random point of the slot order
-- (wrapping around to the start; index readytenant_slot), plus the {newest}
-- that gained READY work in the last %(fresh)s seconds (index
-- readytenant_added): a tenant that was idle is looked at on the next
-- claim, and only briefly favoured. The random point is a subquery, a value
-- no plan is made for: as a parameter, a custom plan would be estimated
-- from the point it drew (a low one makes the wrap-around part look cheap)
-- and a statement sent as it is would keep being planned anew.
after AS MATERIALIZED (
    SELECT tenant FROM jobs_readytenant WHERE slot >= (SELECT %(slot)s::float8) ORDER BY slot LIMIT {sample}
), tenants AS MATERIALIZED (
    SELECT tenant FROM after
    UNION
    (SELECT tenant FROM jobs_readytenant WHERE slot < (SELECT %(slot)s::float8) ORDER BY slot
     LIMIT greatest(0, {sample} - (SELECT count(*) FROM after)))
    UNION
    (SELECT tenant FROM jobs_readytenant WHERE added > now() - make_interval(secs => %(fresh)s)
     ORDER BY added DESC LIMIT {newest})
),

-- claim_tenants_listed --
-- A worker restricted to some tenants (--tenant), or a capped claim for the
-- tenants it locked, already knows them: {listed} is one bound value each,
-- so the generic plan knows how many (an array's length is unknown to it
-- and planned as ten, dearer than the custom plan of a few).
tenants AS MATERIALIZED (
    SELECT DISTINCT tenant FROM (VALUES {listed}) AS v (tenant)
),

-- tenant_leased --
-- Tenant t's LEASED jobs, counted through job_leased_expiry (tenant,
-- lease_until), the one index that holds LEASED rows: that tenant's range
-- of it, whatever the plan.
SELECT count(*) FROM jobs_job AS c WHERE c.state = 'LEASED' AND c.tenant = t.tenant

-- claim_fair_one --
-- The fair claim of one job (the default worker): the tenants are ranked
-- once, least loaded first (ties by lottery), and asked in that order for
-- their first eligible job no one else holds, locked as it is found, in the
-- order of job_claim_tenant (a row another claimer leased meanwhile fails
-- the state test again, on its newest version). The first tenant nearly
-- always has one, so a claim reads one tenant's claim index entries and
-- ranks tenants, not jobs.
{load}
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
), {lease}
{end}

-- claim_cap_one --
-- With a lease cap: only the tenants under it are asked.
WHERE leased < %(cap)s

-- claim_drained_of_ranked --
-- The tenants the fair claim of one job asked before the one that gave a
-- job (all of them when none did): asked whether they have READY work at all.
SELECT rk.tenant FROM ranked AS rk
WHERE rk.position < coalesce((SELECT c.position FROM candidate AS c), (SELECT count(*) + 1 FROM ranked))
  AND {no_ready}

-- claim_fair_batch --
-- The fair claim of a batch. heads: each tenant's first eligible jobs from
-- job_claim_tenant, each counted as if the tenant's earlier heads ran too
-- (so a batch is spread over tenants the way that many single claims would
-- be); with one tenant, the batch plus enough spares that concurrent
-- claimers rarely find all of them locked, with several, the tenant's share
-- plus a spare. ordered: the heads ranked once. candidate: fetched one by
-- one by primary key in that order, FOR UPDATE SKIP LOCKED, until {limit}
-- are locked — a nested loop over a handful of ids, the only plan a
-- parameterised lateral primary-key lookup has. The lookup names nothing
-- but the primary key, so no other index can serve it (OFFSET 0 keeps the
-- planner from pushing the state test in, which would let a partial index
-- compete); the state is checked on the locked, current row.
{load}
heads AS MATERIALIZED (
    SELECT h.id, l.tenant, l.lottery, h.priority, h.next_attempt_at,
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
    FROM heads {cap_filter_batch}
), candidate AS (
    SELECT c.id FROM (SELECT id, position FROM ordered ORDER BY position) AS o
    CROSS JOIN LATERAL (
        SELECT j.id, j.state FROM jobs_job AS j WHERE j.id = o.id
        OFFSET 0
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE c.state = 'READY'
    ORDER BY o.position
    LIMIT {limit}
), {lease}
{end}

-- claim_cap_batch --
-- With a lease cap: only the heads that keep their tenant under it.
WHERE turn <= %(cap)s

-- claim_drained_of_heads --
-- The sampled tenants without heads, asked whether they have READY work at all.
SELECT l.tenant FROM load AS l
WHERE CASE WHEN EXISTS (SELECT FROM heads AS h WHERE h.tenant = l.tenant) THEN false ELSE {no_ready} END

-- tenant_has_no_ready --
-- Whether tenant {tenant} has no READY job: a subquery per tenant, with the
-- tenant as a key condition (as an anti-join it could be planned as a
-- filter over every READY row of the claim index) and in an order only
-- job_claim_tenant gives (else statistics from a time when one tenant held
-- all the work make a sequential scan look as cheap).
(SELECT r.id FROM jobs_job AS r WHERE r.tenant = {tenant} AND r.state = 'READY'
 ORDER BY r.priority DESC LIMIT 1) IS NULL

-- claim_order --
-- A tenant's READY jobs in claim order: the order of job_claim_tenant,
-- which "tenant" leads so that no other index can serve it (unqualified:
-- each use reads one table).
tenant, priority DESC, next_attempt_at ASC NULLS FIRST, id

-- claim_lease_one --
-- Every PostgreSQL claim's tail: lease the candidate. The id is a key
-- condition, never a join: a join with the candidates could be planned as
-- a hash join over the whole table by a generic plan made while statistics
-- said it was empty. One id is compared with "=", which the primary key
-- serves at any table size. A claim writes no history row: its time,
-- worker and epoch stay on the job row until the row that ends the attempt
-- records them.
claimed AS (
    UPDATE jobs_job AS j SET {set_leased}
    WHERE j.id = (SELECT id FROM candidate)
    RETURNING {returning}
)

-- claim_lease_batch --
-- The same for a batch: the ids with "= ANY", whose unknown length the
-- planner takes for ten.
claimed AS (
    UPDATE jobs_job AS j SET {set_leased}
    WHERE j.id = ANY(ARRAY(SELECT id FROM candidate))
    RETURNING {returning}
)

-- claim_set_leased --
-- What a claim writes on each job it leases ({until}: now + ttl).
-- updated_at is the claim's time (Job.claimed_at) until the attempt ends.
state = 'LEASED',
lease_epoch = j.lease_epoch + 1,
worker_id = %(worker)s,
lease_until = {until},
attempts = j.attempts + 1,
first_attempt_at = COALESCE(j.first_attempt_at, {now}),
wait_reason = '',
updated_at = {now}

-- claim_fair_end --
-- The fair claims' result: the leased jobs, with three columns on the first
-- row: how many tenants were drained and pruned, the ids finished by this
-- statement and the sample's size. Sampled tenants without a single READY
-- job ({gone}) are taken out of the sample by the prune function, called
-- from this statement (in its transaction, no round trip or commit of its
-- own): a volatile function's statements each take a new snapshot, so it
-- locks the rows no adder holds and asks again after the lock. OFFSET 0
-- keeps d a subquery of its own: pulled up, each use of d.t would ask the
-- question again.
SELECT c.*, g.pruned, {finished_once}, (SELECT count(*) FROM load) AS population FROM (
    SELECT (SELECT CASE WHEN cardinality(d.t) > 0 THEN jobs_readytenant_prune(d.t) END
            FROM (SELECT ARRAY({gone}) AS t OFFSET 0) AS d) AS pruned, {finished} AS finished
) AS g LEFT JOIN claimed AS c ON true

-- claim_finished --
-- {finished}: the ids this statement finished (the finish's CTE).
ARRAY(SELECT id FROM finished)

-- claim_finished_none --
-- {finished} of a statement that finishes nothing.
NULL::bigint[]

-- claim_finished_once --
-- {finished_once} of a batch: the finished ids on the first row only (NULL
-- on the others), not sent again with every claimed job.
CASE WHEN row_number() OVER () = 1 THEN g.finished END AS finished

-- claim_finished_as_is --
-- {finished_once} of a claim of one job (one row at most) or without finishes.
g.finished AS finished

-- claim_plain --
-- The plain claim: the first eligible unlocked jobs in job_claim_tenant
-- order. Tenant-first like every claim: with one tenant listed, "tenant"
-- is a constant and the order is the tenant's claim order; with none (the
-- fallback when a fair claim found nothing it could lock) the index is
-- walked tenant by tenant. It serves a worker for one tenant, the one-tenant
-- claim ({one_tenant}, {single_gate}) and the fallback. The LIMIT is a
-- subquery, a size the planner cannot read: it then plans for a tenth of
-- the rows it expects and so walks the claim index in order, stopping at
-- the batch. Written in as a constant, a batch from a tenant the statistics
-- gave a few READY rows would be planned as a bitmap scan and a sort of all
-- the tenant's READY rows: a deep backlog read whole on every claim.
WITH {finish} {one_tenant} candidate AS (
    SELECT id FROM jobs_job
    WHERE {eligible} {tenant_filter} {action_filter} {single_gate}
    ORDER BY {claim_order}
    LIMIT (SELECT {limit})
    FOR UPDATE SKIP LOCKED
), {lease}
SELECT c.*, NULL AS pruned, {finished_once}, {population} AS population
FROM (SELECT {finished} AS finished) AS g LEFT JOIN claimed AS c ON true

-- claim_one_tenant --
-- The one-tenant claim's question, asked once: how many tenants hold READY
-- work (counted up to two, from jobs_readytenant), and which, if only one.
ready_tenants AS MATERIALIZED (
    SELECT count(*) AS n, min(p.tenant) AS tenant FROM (SELECT tenant FROM jobs_readytenant LIMIT 2) AS p
),

-- claim_one_tenant_gate --
-- {single_gate}: the one-tenant claim takes nothing unless at most one
-- tenant holds READY work, and names it: a key for the claim index (an
-- ordered walk without one can be planned, from some statistics, over
-- another index of every job).
AND tenant = (SELECT r.tenant FROM ready_tenants AS r WHERE r.n <= 1)

-- claim_one_tenant_population --
-- {population} of the one-tenant claim: how many tenants it saw (up to two).
(SELECT r.n FROM ready_tenants AS r)

-- claim_no_population --
-- {population} of the other plain claims: not counted.
NULL::bigint


-- With a lease cap (PostgreSQL). A statement counts leases in its own
-- snapshot, so two concurrent claims could each see a tenant under its cap.
-- The claim runs in a short transaction that first takes a per-tenant
-- advisory lock (pg_try_advisory_xact_lock: a claimer never waits for a
-- tenant another one is claiming, it moves on), then claims for the locked
-- tenants in a NEW statement (claim_tenants_listed), whose snapshot sees
-- every lease committed before the lock.

-- claim_cap_tenants --
-- Which tenants to try to lock: the sampled (or listed) ones under the cap
-- with an eligible job, in the fair order (counts and jobs as this
-- statement's snapshot sees them: a pre-filter only; the claim counts again
-- under the lock).
WITH {tenants} load AS MATERIALIZED (
    SELECT t.tenant, hashtextextended(t.tenant, %(lottery)s) AS lottery, ({leased}) {finishing_load} AS leased
    FROM tenants AS t
)
SELECT tenant FROM load AS t WHERE leased < %(cap)s AND {has_eligible} ORDER BY leased, lottery

-- claim_cap_tenants_all --
-- The fallback when every sampled tenant is at its cap (or has only work
-- for later): the tenants with READY work, walked from a random point of
-- the slot order (wrapping around) until {sample} are found under the cap
-- with an eligible job. It reads past the tenants at their cap, so a claim
-- comes back empty only when no tenant could be served.
SELECT t.tenant FROM (
    (SELECT tenant FROM jobs_readytenant WHERE slot >= (SELECT %(slot)s::float8) ORDER BY slot)
    UNION ALL
    (SELECT tenant FROM jobs_readytenant WHERE slot < (SELECT %(slot)s::float8) ORDER BY slot)
) AS t
WHERE ({leased}) {finishing_load} < %(cap)s AND {has_eligible}
LIMIT {sample}

-- tenant_has_eligible --
-- Whether tenant t has an eligible job: asked per tenant, as a subquery in
-- the claim index's order (as EXISTS it is pulled up into a semi-join that
-- reads every READY entry of the index, whatever the tenant).
(SELECT e.id FROM jobs_job AS e WHERE e.tenant = t.tenant AND {eligible} {action_filter}
 ORDER BY {claim_order} LIMIT 1) IS NOT NULL

-- claim_cap_try_locks --
-- The candidate tenants ({query}: claim_cap_tenants or
-- claim_cap_tenants_all), each with whether this transaction got its
-- advisory lock, chosen and tried in ONE statement. Locks are tried in the
-- candidates' fair order until {want} (the batch size) are held, no more: a
-- claimer that held every candidate it could lock would make the others find
-- them taken, and wait. The lock call is a volatile function in the filter over
-- the sorted candidates (OFFSET 0: never pushed below the sort), so rows
-- are tried one by one in order and the LIMIT stops the trying.
-- 1785684595 (0x6A6F6273, "jobs") is the lease cap's advisory-lock namespace.
WITH candidates AS MATERIALIZED (
    {query}
), ordered AS MATERIALIZED (
    SELECT tenant, row_number() OVER () AS position FROM candidates
), locked AS MATERIALIZED (
    SELECT o.tenant FROM (SELECT tenant, position FROM ordered ORDER BY position OFFSET 0) AS o
    WHERE pg_try_advisory_xact_lock(1785684595, hashtext(o.tenant))
    LIMIT {want}
)
SELECT o.tenant, o.tenant IN (SELECT tenant FROM locked) AS got FROM ordered AS o ORDER BY o.position

-- claim_cap_wait --
-- Every candidate is being claimed by someone else right now: wait for the
-- first one's lock (its claim is one short statement).
SELECT pg_advisory_xact_lock(1785684595, hashtext(%s))


-- SQLite has no row locks: the claim runs inside BEGIN IMMEDIATE, which
-- takes the database's write lock before reading, so two claimers are
-- serialised and never both see the same job as eligible. The tenant is
-- chosen first by a small exact query (once per job of a batch).

-- claim_sqlite_tenant --
-- The least-loaded tenant with an eligible job and under the cap (0: none),
-- ties broken at random.
SELECT e.tenant FROM (SELECT DISTINCT tenant FROM jobs_job
                      WHERE {eligible} {tenant_filter} {action_filter}) AS e
LEFT JOIN (SELECT tenant, count(*) AS leased FROM jobs_job WHERE state = 'LEASED'
           GROUP BY tenant) AS l ON l.tenant = e.tenant
WHERE %(cap)s = 0 OR COALESCE(l.leased, 0) < %(cap)s
ORDER BY COALESCE(l.leased, 0), random()
LIMIT 1

-- claim_sqlite --
-- One job of that tenant, leased. SQLite sorts NULLs first on its own (and
-- has no NULLS FIRST in indexes).
UPDATE jobs_job AS j SET {set_leased}
WHERE j.id = (SELECT id FROM jobs_job WHERE {eligible} {tenant_filter} {action_filter}
              ORDER BY priority DESC, next_attempt_at ASC, id LIMIT 1)
RETURNING {returning}
