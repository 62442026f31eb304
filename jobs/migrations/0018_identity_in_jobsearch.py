"""A job's business identity, `(tenant, key)`, is unique in `jobs_jobsearch`
instead of jobs_job.

The worker's claim and finish cannot be HOT updates of jobs_job (both change
`state`, which the partial indexes name), so each writes an entry of
`job_unique_tenant_key` for a pair that never changes — and, being unique,
first reads the older versions of the row to check they are dead. The
search row is written once per job, with the job, and never by a state
change: its unique index costs one entry per job (docs/internals/schema.md,
"`jobs_jobsearch`").

Jobs without a search row (none are made so since 0015; a row planted by
hand could be) get theirs first, so every job keeps its key. SQLite rebuilds
jobs_job to drop the constraint, and the rebuilt table loses the hand-made
claim index: it is made again as migration 0010 does. From here on a job
deleted through the ORM takes its search row with it, so its key is free
again."""

import django.db.models.deletion
from django.db import migrations, models

from ._frozen import restore_claim_index

MISSING = """
INSERT INTO jobs_jobsearch (job_id, tenant, key, search_text)
SELECT j.id, j.tenant, j.key, j.search_text FROM jobs_job AS j
WHERE NOT EXISTS (SELECT 1 FROM jobs_jobsearch AS s WHERE s.job_id = j.id)
"""


def search_rows(apps, schema_editor):
    schema_editor.execute(MISSING)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0017_lean_job_indexes'),
    ]

    operations = [
        migrations.RunPython(search_rows, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='jobsearch',
            constraint=models.UniqueConstraint(fields=('tenant', 'key'), name='jobsearch_unique_tenant_key'),
        ),
        migrations.RemoveConstraint(
            model_name='job',
            name='job_unique_tenant_key',
        ),
        migrations.RunPython(restore_claim_index, migrations.RunPython.noop),
        # (Django's cascade, not the database's: there is no constraint.)
        migrations.AlterField(
            model_name='jobsearch',
            name='job',
            field=models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE,
                                       primary_key=True, related_name='search', serialize=False, to='jobs.job'),
        ),
    ]
