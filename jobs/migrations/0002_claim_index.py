"""The claim index: partial, on READY rows only, in claim order.

It keeps a claim's cost flat however many DONE or WAITING rows exist
(DESIGN §5). PostgreSQL sorts NULLs last by default, so the index says NULLS
FIRST to match the claim's ORDER BY; SQLite sorts NULLs first already and has
no NULLS clause in CREATE INDEX.
"""

from django.db import migrations

POSTGRES = (
    "CREATE INDEX job_claim_ready ON jobs_job "
    "(priority DESC, next_attempt_at ASC NULLS FIRST, id) WHERE state = 'READY'"
)
SQLITE = "CREATE INDEX job_claim_ready ON jobs_job (priority DESC, next_attempt_at, id) WHERE state = 'READY'"


def create(apps, schema_editor):
    schema_editor.execute(POSTGRES if schema_editor.connection.vendor == "postgresql" else SQLITE)


def drop(apps, schema_editor):
    schema_editor.execute("DROP INDEX job_claim_ready")


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
