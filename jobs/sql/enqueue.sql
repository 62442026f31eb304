-- Many jobs at once (jobs/store.py Store.enqueue_many): each new key
-- becomes a job with its search row, which holds the key's uniqueness
-- (unique index jobsearch_unique_tenant_key), and its creation event; a key
-- that exists, or came earlier in the chunk, is left alone. Ids follow the
-- chunk's order, so a tenant's jobs of equal priority are claimed in the
-- order given. The given values come in this order, on PostgreSQL and on
-- SQLite: tenant, key, action, subject_type, subject_id, subject_version,
-- payload, priority, next_attempt_at, max_attempts, search_text.


-- enqueue_given_table --
-- PostgreSQL: where a chunk is copied before it is inserted, this
-- session's own (a temporary table, emptied at every commit). Made when
-- the session has none: behind a transaction pooler the next chunk may run
-- on another server session.
CREATE TEMPORARY TABLE IF NOT EXISTS jobs_enqueue_given (
    n integer, tenant varchar, key varchar, action varchar, subject_type varchar, subject_id varchar,
    subject_version integer, payload jsonb, priority smallint, next_attempt_at timestamptz, max_attempts integer,
    search_text text
) ON COMMIT DELETE ROWS

-- enqueue_given_copy --
-- PostgreSQL: the chunk, a row per job (its position n first), by COPY: a
-- row of parameters per job, or an array per column, makes a statement
-- psycopg takes longer to build than the server takes to run.
COPY jobs_enqueue_given (n, tenant, key, action, subject_type, subject_id, subject_version, payload, priority,
                         next_attempt_at, max_attempts, search_text) FROM STDIN

-- enqueue_many --
-- PostgreSQL, one statement per chunk, taking the copied chunk out of
-- jobs_enqueue_given (so a next chunk of the same transaction starts from
-- an empty table): each new key's search row first (its id drawn from the
-- jobs' sequence, in the chunk's order; a key that exists is skipped by the
-- unique index, waiting for a concurrent insert of it to commit or roll
-- back), then the jobs of the keys that got one, and their creation events.
-- Lock order, as enqueue_job_id's caller keeps it: the search rows in
-- (tenant, key) order, whatever the chunk's order, then the jobs (and,
-- through their trigger, the tenants' ready rows); two enqueues of the same
-- keys wait for each other and never deadlock. The sequence is looked up
-- once per statement (a scalar subquery), not once per job. Bound: the
-- proposer, the actor. {new_jobs}: enqueue_new_jobs, from the numbered keys
-- that got a search row.
WITH given AS (
    DELETE FROM jobs_enqueue_given
    RETURNING n, tenant, key, action, subject_type, subject_id, subject_version, payload, priority,
              next_attempt_at, max_attempts, search_text, {now}::timestamptz AS created_at,
              %s::varchar AS proposed_by
), firsts AS (
    SELECT DISTINCT ON (tenant, key) * FROM given ORDER BY tenant, key, n
), numbered AS (
    SELECT nextval((SELECT pg_get_serial_sequence('jobs_job', 'id'))) AS id, f.*
    FROM (SELECT * FROM firsts ORDER BY n OFFSET 0) AS f
), searchable AS (
    INSERT INTO jobs_jobsearch (job_id, tenant, key, search_text)
    SELECT id, tenant, key, search_text FROM numbered ORDER BY tenant, key
    ON CONFLICT (tenant, key) DO NOTHING RETURNING job_id
), inserted AS (
    {new_jobs}
    RETURNING id, created_at
)
INSERT INTO jobs_jobevent (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at)
SELECT id, 'enqueue', '', 'READY', 0, '', %s, '', '{}', created_at FROM inserted

-- enqueue_job_id --
-- PostgreSQL: a new job's id, drawn before its search row is inserted, so
-- a single enqueue locks in enqueue_many's order: the key's search row
-- (which decides a race for the key), then the job and its tenant's ready
-- row (the insert trigger).
SELECT nextval(pg_get_serial_sequence('jobs_job', 'id'))

-- enqueue_new_jobs --
-- The new jobs' rows, READY with no attempt made: {id} (the job's id, or
-- NULL where the table draws it) and the given values, from {source}.
INSERT INTO jobs_job (id, tenant, key, action, subject_type, subject_id, subject_version, payload, state,
                      priority, next_attempt_at, attempts, max_attempts, recoveries, lease_epoch, worker_id,
                      wait_reason, last_error, created_at, updated_at, proposed_by, search_text)
SELECT {id}, tenant, key, action, subject_type, subject_id, subject_version, payload, 'READY',
       priority, next_attempt_at, 0, max_attempts, 0, 0, '',
       '', '', created_at, created_at, proposed_by, search_text
FROM {source}

-- enqueue_taken_sqlite --
-- SQLite: which of the chunk's keys ({keys}: a parameter each) exist. The
-- immediate transaction holds the database's write lock, so the keys found
-- absent stay absent until it ends.
SELECT tenant, key FROM jobs_jobsearch WHERE key IN ({keys})

-- enqueue_many_sqlite --
-- SQLite: the new keys' jobs, in the chunk's order ({rows}: each one's
-- position n, its values, {now} and the proposer). {new_jobs}:
-- enqueue_new_jobs, from the given rows in order, ids from the table.
WITH given (n, tenant, key, action, subject_type, subject_id, subject_version, payload, priority, next_attempt_at,
            max_attempts, search_text, created_at, proposed_by) AS (VALUES {rows})
{new_jobs}
RETURNING id, created_at, tenant, key, search_text

-- enqueue_events_sqlite --
-- SQLite: a new job's creation event (bound: the job, the actor, its time).
INSERT INTO jobs_jobevent (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason, detail, created_at)
VALUES (%s, 'enqueue', '', 'READY', 0, '', %s, '', '{}', %s)

-- enqueue_search_sqlite --
-- SQLite: a new job's search row.
INSERT INTO jobs_jobsearch (job_id, tenant, key, search_text) VALUES (%s, %s, %s, %s)
