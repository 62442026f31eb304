"""Fewer index entries per job. A worker's claim and finish each write a new
version of the job row (not HOT: both change `state`, which the partial
indexes name) and an entry in every index whose condition the new row
meets; the history row an entry in each of its indexes. Each entry is WAL
written on the worker's path.

- `job_state_tenant` keeps only the waiting states: LEASED rows are counted
  per tenant through `job_leased_expiry`, made (tenant, lease_until); DONE and
  CANCELLED rows are retention's.
- `job_finished` (every finished row) becomes `job_finished_redacted`,
  written by the redaction pass: a finish writes `job_finished_unredacted`
  only, and deletion reads the two halves.
- The history's primary key constraint goes (PostgreSQL): every lookup names
  the job and reads `jobevent_job_id`; ids stay unique by their sequence.
"""

from django.conf import settings
from django.db import migrations, models


def _drop_history_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_jobevent DROP CONSTRAINT IF EXISTS jobs_jobevent_pkey")


def _restore_history_key(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'jobs_jobevent'")
        partitioned = cursor.fetchone()[0] == "p"
    # A partitioned table's key must hold its partition key (migration 0011).
    schema_editor.execute(f"ALTER TABLE jobs_jobevent ADD PRIMARY KEY ({'id, created_at' if partitioned else 'id'})")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0016_job_table_storage'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='job',
            name='job_leased_expiry',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_finished',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_state_tenant',
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'LEASED')), fields=['tenant', 'lease_until'], name='job_leased_expiry'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state__in', ['READY', 'LEASED', 'DONE', 'CANCELLED']), _negated=True), fields=['state', 'tenant'], name='job_state_tenant'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('redacted_at__isnull', False), ('state__in', ['DONE', 'CANCELLED'])), fields=['finished_at', 'id'], name='job_finished_redacted'),
        ),
        migrations.RunPython(_drop_history_key, _restore_history_key, elidable=False),
    ]
