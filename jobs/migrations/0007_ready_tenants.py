"""Claims whose cost does not grow with the tenants: the ready-tenant table
the fair claim samples from (jobs/claim.py), kept right by the database
(PostgreSQL).

Triggers on jobs_job add a tenant whenever one of its jobs is inserted READY
(statement-level: a bulk enqueue costs one call) or moves to READY from
another state (row-level, and the `WHEN` clause is checked in C, so claims,
renewals and finishes never call it). Every path that makes work
READY — enqueue, retries, recovery, resumes, timers, inbound events, operator
decisions, raw SQL — is covered without any of them knowing.

The claim removes a tenant it found without READY jobs. That removal must
never win against a transaction that is adding READY work for the same
tenant, or the tenant would drop out of the sample while it has work:
- `jobs_readytenant_keep` (the triggers) share-locks the tenant's row
  (`FOR KEY SHARE`) until its transaction ends, inserting the row first if
  it is missing;
- the pruner (the fair claim; `jobs_readytenant_prune` from migration 0013
  on) locks rows `FOR UPDATE SKIP LOCKED` — so a row an adder holds is
  skipped — and then deletes, in a NEW statement (a fresh snapshot that sees
  every committed job), only rows whose tenant has no READY job. An adder
  arriving after the pruner's lock waits for it, finds the row gone and
  inserts it again.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

from ._frozen import ORDER_PG, ORDER_SQLITE

CREATE = [
    """
CREATE FUNCTION jobs_readytenant_keep(names varchar[]) RETURNS void LANGUAGE plpgsql AS $$
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
END $$""",
    """
CREATE FUNCTION jobs_readytenant_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM jobs_readytenant_keep(ARRAY(SELECT DISTINCT tenant FROM inserted_jobs WHERE state = 'READY'));
    RETURN NULL;
END $$""",
    """
CREATE FUNCTION jobs_readytenant_on_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM jobs_readytenant_keep(ARRAY[NEW.tenant]);
    RETURN NULL;
END $$""",
    """
CREATE TRIGGER jobs_readytenant_inserted AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS inserted_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobs_readytenant_on_insert()""",
    """
CREATE TRIGGER jobs_readytenant_became_ready AFTER UPDATE OF state ON jobs_job
    FOR EACH ROW WHEN (NEW.state = 'READY' AND OLD.state <> 'READY')
    EXECUTE FUNCTION jobs_readytenant_on_ready()""",
    "INSERT INTO jobs_readytenant (tenant) SELECT DISTINCT tenant FROM jobs_job WHERE state = 'READY'",
]

DROP = [
    "DROP TRIGGER IF EXISTS jobs_readytenant_became_ready ON jobs_job",
    "DROP TRIGGER IF EXISTS jobs_readytenant_inserted ON jobs_job",
    "DROP FUNCTION IF EXISTS jobs_readytenant_on_ready()",
    "DROP FUNCTION IF EXISTS jobs_readytenant_on_insert()",
    "DROP FUNCTION IF EXISTS jobs_readytenant_keep(varchar[])",
]


def _claim_order(schema_editor) -> str:
    return ORDER_PG if schema_editor.connection.vendor == "postgresql" else ORDER_SQLITE


def reshape_claim_indexes(apps, schema_editor):
    # IF EXISTS: on SQLite an earlier migration that rebuilt jobs_job (adding
    # a column with a default does) dropped these hand-made indexes with the
    # old table; job_claim_tenant is created again here in either case.
    schema_editor.execute("DROP INDEX IF EXISTS job_claim_ready")
    schema_editor.execute("DROP INDEX IF EXISTS job_claim_tenant")
    if schema_editor.connection.vendor == "postgresql":
        # `action` carried in the index: a worker's `--action` filter is
        # checked on the index entry, so the claim stays an index-only scan
        # (and the planner has no reason to prefer reading the table).
        schema_editor.execute(f"CREATE INDEX job_claim_tenant ON jobs_job (tenant, {_claim_order(schema_editor)}) "
                              "INCLUDE (action) WHERE state = 'READY'")
    else:
        schema_editor.execute(f"CREATE INDEX job_claim_tenant ON jobs_job (tenant, {_claim_order(schema_editor)}) "
                              "WHERE state = 'READY'")


def restore_claim_indexes(apps, schema_editor):
    order = _claim_order(schema_editor)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX job_claim_tenant")
        schema_editor.execute(f"CREATE INDEX job_claim_tenant ON jobs_job (tenant, {order}) WHERE state = 'READY'")
    schema_editor.execute(f"CREATE INDEX job_claim_ready ON jobs_job ({order}) WHERE state = 'READY'")


def create_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in CREATE:
            schema_editor.execute(statement)


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0006_retention"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReadyTenant",
            fields=[
                ("tenant", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("slot", models.FloatField(db_default=models.Func(function="RANDOM"))),
                ("added", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "indexes": [
                    models.Index(fields=["slot"], name="readytenant_slot"),
                    models.Index(fields=["added"], name="readytenant_added"),
                ],
            },
        ),
        migrations.RunPython(create_triggers, drop_triggers),
        # "READY jobs of tenant T in claim order" gets exactly one index that
        # can answer it, job_claim_tenant — the same plan on a table loaded a
        # second ago (no statistics yet), on one whose statistics say READY
        # rows are rare (analysed while the queue was empty) and on a large
        # one. So READY rows leave job_state_tenant, and the global claim
        # order's index goes: every claim is tenant-first (claim.py).
        migrations.RunPython(reshape_claim_indexes, restore_claim_indexes),
        migrations.RemoveIndex(model_name="job", name="job_state_tenant"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(condition=~models.Q(state="READY"), fields=["state", "tenant"], name="job_state_tenant"),
        ),
    ]
