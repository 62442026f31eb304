"""Taking drained tenants out of the fair claim's sample in one round trip:
the pruner's two statements (lock the sample rows no adder holds,
then delete those whose tenant has no READY job, in a snapshot taken after
the lock — migration 0007) move into a PL/pgSQL function. A volatile
function takes a fresh snapshot for each statement it runs, so the delete
still sees every job committed before its lock; the worker sends one
statement instead of BEGIN, two statements and COMMIT, and with many
tenants of a job or two the fair claim prunes on nearly every job."""

from django.db import migrations

CREATE = """
CREATE FUNCTION jobs_readytenant_prune(names varchar[]) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
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
END $$"""

DROP = "DROP FUNCTION IF EXISTS jobs_readytenant_prune(varchar[])"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0012_growing_tables_storage"),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
