"""The migrated schema holds the hand-made claim index on both databases.

SQLite rebuilds a table to add a column with a default, and a rebuilt table
loses indexes the models do not declare: the claim index must survive every
migration (else each claim scans the table)."""

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def index_sql(name: str) -> str | None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'jobs_job' AND indexname = %s", [name])
        else:
            cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = %s", [name])
        row = cursor.fetchone()
    return row[0] if row else None


def test_the_claim_index_exists_after_migrating_and_covers_ready_rows_only():
    definition = index_sql("job_claim_tenant")
    assert definition is not None, "job_claim_tenant is missing: claims would scan the whole table"
    assert "tenant" in definition and "priority" in definition
    assert "READY" in definition


def test_the_global_claim_index_is_gone_every_claim_is_tenant_first():
    assert index_sql("job_claim_ready") is None
