"""The job list's search and the key lookups without a tenant move to a side
table written once per job (`jobs.JobSearch`, see `jobs.search`).

The worker's claim (READY → LEASED) and finish (LEASED → DONE) cannot be
HOT updates of jobs_job, so each writes an entry into every index whose
predicate the new row meets. Two indexes served only the console's search
and key lookups, whose inputs never change with the state: the trigram
index over rows at rest (`job_search_rest_trgm`, written for every job
entering DONE, the more the longer its text) and the btree on `key`
(`job_key_prefix`, an entry per update). Both go;
`jobs_jobsearch` holds each job's key and search text once, with a btree on
the key and, on PostgreSQL, a trigram index over every row (so READY and
LEASED jobs are found by their text too). `job_search_queue_trgm` stays on
jobs_job: it serves the queues and holds no READY, LEASED or DONE row.

Existing jobs are copied in one statement before the indexes are built."""

from django.db import migrations, models

from ._frozen import INSERT_ONLY, table_storage

BACKFILL = """
INSERT INTO jobs_jobsearch (job_id, tenant, key, search_text)
SELECT id, tenant, key, search_text FROM jobs_job
"""


def backfill(apps, schema_editor):
    schema_editor.execute(BACKFILL)


def text_index(apps, schema_editor):
    # `search_text LIKE '%term%'` over every row; pg_trgm exists since 0010.
    # SQLite scans (small deployments and tests).
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE INDEX IF NOT EXISTS jobsearch_text_trgm ON jobs_jobsearch "
                          "USING gin (search_text gin_trgm_ops)")


def drop_text_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS jobsearch_text_trgm")


def drop_rest_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS job_search_rest_trgm")


def restore_rest_index(apps, schema_editor):
    # Exactly as migration 0010 creates it.
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE INDEX IF NOT EXISTS job_search_rest_trgm ON jobs_job "
                          "USING gin (search_text gin_trgm_ops) "
                          "WHERE state NOT IN ('READY', 'LEASED', 'WAITING_REVIEW', 'NEEDS_ATTENTION')")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0014_claim_on_the_job_row'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobSearch',
            fields=[
                ('job', models.OneToOneField(db_constraint=False, on_delete=models.deletion.DO_NOTHING, primary_key=True, related_name='search', serialize=False, to='jobs.job')),
                ('tenant', models.CharField(max_length=64)),
                ('key', models.CharField(max_length=200)),
                ('search_text', models.TextField(blank=True, default='')),
            ],
        ),
        # Rows first, indexes after: one build each instead of a million inserts into them.
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='jobsearch',
            index=models.Index(fields=['key'], name='jobsearch_key_prefix', opclasses=['varchar_pattern_ops']),
        ),
        migrations.RunPython(text_index, drop_text_index),
        # Inserted with its job, deleted with it by retention in bulk.
        table_storage({"jobs_jobsearch": INSERT_ONLY}),
        migrations.RunPython(drop_rest_index, restore_rest_index),
        migrations.RemoveIndex(
            model_name='job',
            name='job_key_prefix',
        ),
    ]
