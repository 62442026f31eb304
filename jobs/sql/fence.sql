-- The fence: which rows a worker's write may touch. A worker writes on a job
-- (renew, finish, wait, fail, release) only while the job is LEASED, to it,
-- under the epoch it claimed the job with; a write whose fence moved
-- (another worker took the job over, or recovery took it back) touches
-- nothing and raises Conflict. jobs/fence.py holds the rule's Python side
-- (the check on a job in hand, and the Conflict's message).


-- fence_of_key --
-- A single write's fence, for the job named by its business key (bound:
-- tenant, key, epoch, worker). The job is found by its key in the search
-- row (unique index jobsearch_unique_tenant_key), then by primary key:
-- jobs_job has no index on (tenant, key).
id = (SELECT s.job_id FROM jobs_jobsearch AS s WHERE s.tenant = %s AND s.key = %s)
AND lease_epoch = %s AND worker_id = %s AND state = 'LEASED'

-- fence_of_batch --
-- A batch's fence (its finishes, its lease renewals), the WHERE of an UPDATE
-- of jobs_job AS {t}: {key} the condition on {t}.id, {epoch} each job's
-- epoch as claimed. The ids are a key condition of their own, which the
-- primary key serves at any table size. The fence is tested on the row
-- being updated, which takes no row lock of its own: if another transaction
-- changed it meanwhile (a recovery, a takeover), PostgreSQL waits for it
-- and tests this again on the newest version, and the write does nothing.
-- 'LEASED' and the worker are subqueries, values no plan is made for:
-- written in as constants, 'LEASED' would let a partial index on LEASED
-- rows, which carries every lease since the last vacuum, serve the scan.
WHERE {t}.id {key}
  AND {t}.state = (SELECT 'LEASED'::varchar)
  AND {t}.lease_epoch = {epoch}
  AND {t}.worker_id = (SELECT %(worker)s::varchar)
