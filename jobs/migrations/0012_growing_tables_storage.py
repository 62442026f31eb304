"""Autovacuum (and fillfactor where updates can be HOT) for the engine's
tables that grow with the jobs (`jobs.tablestorage`); PostgreSQL only. The
job table and the tenant sample get theirs in 0016; the history's day
partitions theirs when created (`jobs.partitions`)."""

from django.db import migrations

from ._frozen import DELETED_IN_BULK, table_storage


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0011_history_partitioned_by_day'),
    ]

    operations = [
        table_storage({
            # Timers and inbound events change state, a column their partial
            # indexes name: never HOT, so no fillfactor.
            "jobs_timer": DELETED_IN_BULK,
            "jobs_inboundevent": DELETED_IN_BULK,
            # A failed delivery updates attempts and the next try, no indexed
            # column: HOT with room in the page.
            "jobs_outboxevent": {**DELETED_IN_BULK, "fillfactor": "90"},
        }),
    ]
