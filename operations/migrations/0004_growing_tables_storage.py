"""Autovacuum (and fillfactor where updates can be HOT) for the operations'
tables, which grow with the jobs (`jobs.tablestorage`); PostgreSQL only."""

from django.db import migrations

from jobs.migrations._frozen import DELETED_IN_BULK, INSERT_ONLY, table_storage


class Migration(migrations.Migration):

    dependencies = [
        ('operations', '0003_operation_action_effect_limits'),
    ]

    operations = [
        table_storage({
            # Redaction rewrites the request body and answers fill in fields
            # no index names: HOT with room in the page (state changes are
            # indexed and never HOT).
            "operations_operation": {**DELETED_IN_BULK, "fillfactor": "90"},
            "operations_operationevent": INSERT_ONLY,
            "operations_receipt": INSERT_ONLY,
        }),
    ]
