"""The finished-jobs indexes, `job_finished_unredacted` (the one a finish
writes) and `job_finished_redacted`, are keyed by `finished_at` alone
instead of (finished_at, id).

Retention's pages read a range of them and sort the ties of one instant by
id (`jobs.retention.rows_after`). Each finish's entry is 8 bytes shorter,
and a batch's jobs, finished at one instant, share a key that a full page
merges.

Rebuilding both indexes reads the finished jobs and blocks every update of
jobs_job (each claim and finish) until they are built: on a large table,
migrate while the workers are stopped."""

from django.db import migrations, models


def _finished(redacted: bool) -> models.Q:
    return models.Q(('redacted_at__isnull', not redacted), ('state__in', ['DONE', 'CANCELLED']))


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0021_history_index_by_job'),
    ]

    operations = [
        migrations.RemoveIndex(model_name='job', name='job_finished_unredacted'),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=_finished(False), fields=['finished_at'],
                               name='job_finished_unredacted'),
        ),
        migrations.RemoveIndex(model_name='job', name='job_finished_redacted'),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=_finished(True), fields=['finished_at'],
                               name='job_finished_redacted'),
        ),
    ]
