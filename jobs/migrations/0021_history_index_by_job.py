"""The history's one index, `jobevent_job_id`, is keyed by the job alone
instead of (job, id).

Every lookup names one job and orders its few rows by id, which a sort of
those rows does as well as the index did. The entry is 8 bytes shorter, and
a job's rows share one key, so a full leaf page first merges them
(deduplication) before it splits: a finish's history row is inserted next to
the job's creation row, in the middle of pages the enqueue filled, where a
(job, id) key splits pages often (docs/internals/schema.md,
"`jobs_jobevent`").

Rebuilding the index reads the whole history and blocks its inserts (each
worker's finish) until it is built: on a long history, migrate while the
workers are stopped."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0020_claim_time_in_updated_at'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='jobevent',
            name='jobevent_job_id',
        ),
        migrations.AddIndex(
            model_name='jobevent',
            index=models.Index(fields=['job'], name='jobevent_job_id'),
        ),
    ]
