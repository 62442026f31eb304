-- A worker's writes on the jobs it holds, each under its fence (fence.sql),
-- and the writes that change a job's state from outside a lease (recovery,
-- a takeover, timers, decisions), with the history row each leaves.
-- Blocks are named `-- name --`; `{name}` is a block or a fragment the
-- Python puts in (jobs/store.py, jobs/claim.py), `%s`/`%(name)s` bound.


-- A batch's writes (PostgreSQL): a worker's finishes, written by the
-- statement that claims its next work (claim.sql, {finish}) or alone
-- (finish_alone), and its lease renewals. Each row is fenced by its own
-- epoch and the worker, exactly like a single write. No join anywhere:
-- what a row needs from the bound arrays (its epoch, its result, its
-- claim's time) it finds by its id's place among the ids, in id order,
-- with a binary search (width_bucket over a sorted array gives the place of
-- a value it holds). Joined, the arrays' rows to the table's, the generic
-- plan made from statistics that take the table for nearly empty (as after
-- a VACUUM of a drained queue that could not shorten it) is a nested loop
-- going through all the batch's ids for each of its rows.

-- finish --
-- The finishes' CTEs, bound in one of two forms (jobs/claim.py
-- _FINISH_FORMS): one job's as single values, so the generic plan knows it
-- looks up exactly one key ("= ANY(array)" is planned for ten, dearer than
-- reading a table of a few dozen pages); several as arrays in id order (the
-- text is the same for any number of them). {ids}: the condition on the
-- ids; {result}: a row's result; {fence}: fence_of_batch.
-- claims: when each attempt was claimed, a LEASED row's updated_at as this
-- statement's snapshot sees it, before the finish moves it, read once by
-- the ids ({claims}; a row's, {claimed_at}).
-- finish_logged: the attempt's one history row, with the claim it began
-- with (the fence held, so the row is still that claim's: a renewal moves
-- only lease_until); the worker is named once, in worker_id (JobEvent.by).
claims AS MATERIALIZED (
    SELECT {claims} FROM jobs_job WHERE id {ids}
), finished AS (
    UPDATE jobs_job AS f SET state = 'DONE', updated_at = {now}, finished_at = {now}, lease_until = NULL,
           result = {result}::jsonb
    {fence}
    RETURNING f.id, f.lease_epoch, f.updated_at
), finish_logged AS (
    INSERT INTO jobs_jobevent
        (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at, claimed_at)
    SELECT d.id, 'finish', 'LEASED', 'DONE', d.lease_epoch, %(worker)s, '', '', '{}', d.updated_at, {claimed_at}
    FROM finished AS d, claims AS c
),

-- finish_alone --
-- The finishes without a claim ({finish}: the finish block without its
-- last comma): the ids written (the others had lost their fence).
WITH {finish} SELECT id FROM finished

-- renew_batch --
-- A batch of lease renewals: one text whatever the count (arrays, not a
-- VALUES list per size: each size would be a statement and a function of
-- its own). {fence}: fence_of_batch, by the ids and each one's epoch.
UPDATE jobs_job AS j SET lease_until = {until}
{fence}
RETURNING j.id


-- A worker's single writes (jobs/store.py Store._fenced): one conditional
-- UPDATE under the fence plus its history row. Zero rows updated means the
-- fence moved. A renewal (LEASED -> LEASED) moves the lease only: a LEASED
-- row's updated_at is its claim's time, which the write that ends the
-- attempt copies into its history row.

-- fenced_update --
-- The write: {sets} the columns it changes, {fence} fence_of_key.
UPDATE jobs_job SET {sets} WHERE {fence} RETURNING id, lease_epoch

-- fenced_update_logged --
-- PostgreSQL: the write ({update}: fenced_update) and its history row in a
-- single statement. claim reads the row as the statement's snapshot sees
-- it, before the write moves its updated_at. The worker writes about its
-- own attempt: named once, in worker_id (JobEvent.by).
WITH claim AS MATERIALIZED (SELECT id, updated_at FROM jobs_job WHERE {fence}), changed AS ({update})
INSERT INTO jobs_jobevent (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at, claimed_at)
SELECT d.id, %s, %s, %s, d.lease_epoch, %s, %s, %s, %s, {now}, c.updated_at
FROM changed AS d JOIN claim AS c ON c.id = d.id RETURNING job_id

-- fenced_claim_time --
-- SQLite: the attempt's claim time, read before the write (in the same
-- immediate transaction), for its history row (history_append).
SELECT updated_at FROM jobs_job WHERE {fence}


-- Transitions of a row the caller has locked (recovery, a takeover or a
-- claim by name, timers, decisions) and the history row of every change.

-- transition_write --
-- The state in WHERE makes the database refuse a change the row's current
-- state does not allow, even if the caller's lock was lost.
UPDATE jobs_job SET {sets} WHERE id = %s AND state = %s AND lease_epoch = %s

-- history_append --
-- A job's history row for one transition; a row that ends an attempt also
-- records when the attempt was claimed.
INSERT INTO jobs_jobevent (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at, claimed_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, {now}, %s)
