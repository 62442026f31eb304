"""The claim indexes: partial, on READY rows only, in claim order.

They keep a claim's cost flat however many DONE or WAITING rows exist
(DESIGN §5); claim.py says which statement each serves.
- `job_claim_ready`: the global order (priority, due time, id).
- `job_claim_tenant`: the same order per tenant; its leading `tenant` column
  also serves the loose index scan over tenants with READY work.
PostgreSQL sorts NULLs last by default, so the indexes say NULLS FIRST to
match the claim's ORDER BY; SQLite sorts NULLs first already and has no NULLS
clause in CREATE INDEX.
"""

from django.db import migrations

from ._frozen import ORDER_PG, ORDER_SQLITE


def create(apps, schema_editor):
    order = ORDER_PG if schema_editor.connection.vendor == "postgresql" else ORDER_SQLITE
    schema_editor.execute(f"CREATE INDEX job_claim_ready ON jobs_job ({order}) WHERE state = 'READY'")
    schema_editor.execute(f"CREATE INDEX job_claim_tenant ON jobs_job (tenant, {order}) WHERE state = 'READY'")


def drop(apps, schema_editor):
    schema_editor.execute("DROP INDEX job_claim_tenant")
    schema_editor.execute("DROP INDEX job_claim_ready")


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
