"""An operation's idempotency key and client reference become a column of
their own, `intent_key`, derived from the obligation for new operations
(tenant, job key, step, request digest) so that a send repeated after the
database lost a commit reaches the provider under the same key. Operations
recorded before keep the key they were sent with: their id."""

from django.db import migrations, models


def keep_sent_keys(apps, schema_editor):
    Operation = apps.get_model("operations", "Operation")
    batch = []
    for operation in Operation.objects.only("id").iterator(chunk_size=2000):
        operation.intent_key = str(operation.id)
        batch.append(operation)
        if len(batch) == 2000:
            Operation.objects.bulk_update(batch, ["intent_key"])
            batch = []
    Operation.objects.bulk_update(batch, ["intent_key"])


class Migration(migrations.Migration):

    dependencies = [
        ('operations', '0004_growing_tables_storage'),
    ]

    operations = [
        migrations.AddField(
            model_name='operation',
            name='intent_key',
            field=models.CharField(default='', help_text='Idempotency key and client reference sent to the provider, derived from the obligation.', max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(keep_sent_keys, migrations.RunPython.noop),
    ]
