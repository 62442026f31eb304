-- The schema's functions and triggers as they are now (PostgreSQL), as the
-- migrations leave them: each as PostgreSQL prints it (pg_get_functiondef,
-- pg_get_triggerdef), so this file reads as the database holds it.
-- tests/jobs/test_schema_sql_pg.py compares it with a migrated database: a
-- migration that adds, changes or drops one changes this file too.
--
-- Not here: the extensions' functions (pg_trgm), and the claim statements'
-- functions (jobs_stmt_<digest>) that jobs/pooling.py makes at run time, one
-- per statement text, which any worker may make again and any may drop.
--
-- The tenant sample (jobs_readytenant, one row per tenant with READY work)
-- that the fair claim samples from (claim.sql) is kept by the database:
-- triggers on jobs_job add a tenant whenever one of its jobs is inserted
-- READY (statement-level: a bulk enqueue costs one call) or moves to READY
-- from another state (row-level; the WHEN clause is checked without calling
-- the function, so claims, renewals and finishes never call it). Every path
-- that makes work READY (enqueue, retries, recovery, resumes, timers,
-- inbound events, operator decisions, raw SQL) is covered without any of
-- them knowing. The claim removes a tenant it found without READY jobs
-- (jobs_readytenant_prune); that removal never wins against a transaction
-- adding READY work for the same tenant: the adders share-lock the tenant's
-- row until they end, and the pruner skips the rows they hold.


-- Adds the tenants `names` to the sample if missing and share-locks their
-- rows (FOR KEY SHARE) until the transaction ends, so no prune can take
-- them out meanwhile. Locks in tenant order (no deadlock between adders).
CREATE OR REPLACE FUNCTION public.jobs_readytenant_keep(names character varying[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    locked varchar[];
    missing varchar[];
BEGIN
    LOOP
        SELECT coalesce(array_agg(tenant), '{}') INTO locked FROM (
            SELECT tenant FROM jobs_readytenant WHERE tenant = ANY(names) ORDER BY tenant FOR KEY SHARE
        ) AS r;
        missing := ARRAY(SELECT unnest(names) EXCEPT SELECT unnest(locked));
        EXIT WHEN cardinality(missing) = 0;
        -- Rows another transaction inserted meanwhile are locked on the next turn.
        INSERT INTO jobs_readytenant (tenant) SELECT unnest(missing) ORDER BY 1 ON CONFLICT DO NOTHING;
    END LOOP;
END $function$;

-- The statement-level trigger's function: the tenants of the READY jobs a
-- statement inserted.
CREATE OR REPLACE FUNCTION public.jobs_readytenant_on_insert()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM jobs_readytenant_keep(ARRAY(SELECT DISTINCT tenant FROM inserted_jobs WHERE state = 'READY'));
    RETURN NULL;
END $function$;

-- The row-level trigger's function: the tenant of a job that became READY.
CREATE OR REPLACE FUNCTION public.jobs_readytenant_on_ready()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM jobs_readytenant_keep(ARRAY[NEW.tenant]);
    RETURN NULL;
END $function$;

-- Jobs inserted READY (enqueue, bulk enqueue, raw inserts): one call a statement.
CREATE TRIGGER jobs_readytenant_inserted AFTER INSERT ON jobs_job REFERENCING NEW TABLE AS inserted_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobs_readytenant_on_insert();

-- A job that moves to READY from another state (a retry, a recovery, a
-- resume, a decision).
CREATE TRIGGER jobs_readytenant_became_ready AFTER UPDATE OF state ON jobs_job FOR EACH ROW WHEN (new.state::text = 'READY'::text AND old.state::text <> 'READY'::text) EXECUTE FUNCTION jobs_readytenant_on_ready();

-- Takes the tenants `names` that have no READY job out of the sample, and
-- returns how many it took; called by the fair claim (claim.sql,
-- claim_fair_end) from inside its statement. It locks the rows no adder
-- holds (FOR UPDATE SKIP LOCKED: never waits), then deletes, in a NEW
-- statement — a volatile function takes a fresh snapshot for each, which
-- sees every job committed before the lock — only the rows whose tenant has
-- no READY job. An adder arriving after the lock waits for it, finds the
-- row gone and inserts it again. Each tenant's emptiness is asked by key,
-- in the claim index's order (claim.sql, tenant_has_no_ready). It runs its
-- statements with their generic plans (plan_cache_mode): the tenants come
-- as an array, whose length a generic plan takes for ten while a call's own
-- holds one or two, so a custom plan would always look cheaper and each
-- call be planned anew; the generic plans read each tenant's READY jobs by
-- the claim index at any table size.
CREATE OR REPLACE FUNCTION public.jobs_readytenant_prune(names character varying[])
 RETURNS integer
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    locked varchar[];
    removed integer;
BEGIN
    -- Rows an adder holds (FOR KEY SHARE, migration 0007) are skipped, never waited for.
    SELECT coalesce(array_agg(tenant), '{}') INTO locked FROM (
        SELECT tenant FROM jobs_readytenant WHERE tenant = ANY(names) ORDER BY tenant FOR UPDATE SKIP LOCKED
    ) AS r;
    IF cardinality(locked) = 0 THEN
        RETURN 0;
    END IF;
    -- A new statement, so a new snapshot: it sees every job committed before the lock.
    -- Each tenant's emptiness is asked by key, in the claim index's order (claim.py _NO_READY).
    DELETE FROM jobs_readytenant AS t WHERE t.tenant = ANY(locked) AND (
        SELECT r.id FROM jobs_job AS r WHERE r.tenant = t.tenant AND r.state = 'READY'
        ORDER BY r.priority DESC LIMIT 1) IS NULL;
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END $function$;
