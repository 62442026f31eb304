"""`manage.py bench` smoke test: every section is printed and the bench
leaves nothing behind. Speed is never asserted here (DESIGN §12)."""

import pytest
from django.db import connection

from jobs.bench import BENCH_TENANTS, REFERENCE_TABLE
from jobs.models import Job
from jobs.store import Store

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def test_bench_prints_every_section_and_removes_only_its_own_rows(manage):
    store = Store()
    # A user's work, including a tenant that merely looks like the bench's.
    store.enqueue("studio", "send-quote-017")
    store.enqueue("bench-press-gym", "invoice-reminder-3")
    # A leftover of an interrupted bench run.
    store.enqueue("bench-e2e", "e2e-leftover")

    result = manage.run("bench", "--quick", "--processes", "1", "--rows", "2000", "--jobs", "200",
                        "--latency-jobs", "10", "--claims", "50", timeout=170)

    out = result.stdout
    for section in ("ENQUEUE", "END TO END", "INSERT → START LATENCY", "CLAIM TIME VS TABLE SIZE",
                    "PEAK RSS PER WORKER PROCESS", "JOBS CHANGELIST"):
        assert section in out, out
    assert "1 process" in out
    assert "+ 2,000 DONE" in out and "+ 2,000 WAITING_EXTERNAL" in out
    if connection.vendor == "postgresql":
        assert "NOTIFY (workers poll every 1 s)" in out
    else:
        assert "n/a" in out  # no reference loop on SQLite

    assert not Job.objects.filter(tenant__in=BENCH_TENANTS).exists()
    assert REFERENCE_TABLE not in connection.introspection.table_names()
    # The user's jobs are untouched: still there, still READY (bench workers
    # only claim the bench's tenants).
    assert set(Job.objects.values_list("tenant", "key", "state")) == {
        ("studio", "send-quote-017", "READY"),
        ("bench-press-gym", "invoice-reminder-3", "READY"),
    }
