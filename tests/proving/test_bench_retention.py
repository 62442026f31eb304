"""`manage.py bench_retention` starts a real prune that deletes only what it
loaded, and redacts nothing: other tenants' finished jobs keep their payloads
(JOBS_REDACT_AFTER_DAYS would otherwise redact everything finished 7–399 days
ago)."""

import time
from io import StringIO

import pytest
from django.core.management import call_command

from jobs.models import Job, JobEvent
from proving.bench import retention as bench_retention

pytestmark = pytest.mark.django_db


def test_the_bench_prune_deletes_its_old_jobs_and_redacts_no_one_elses(store, monkeypatch):
    started = []
    monkeypatch.setattr(bench_retention.subprocess, "Popen", lambda args, **kwargs: started.append(args))
    bench_retention.start_prune(["--pause-ratio", "0"])
    args = started[0][started[0].index("prune") + 1:]

    at = time.time() - 100 * 86400  # another tenant's job, finished 100 days ago
    store.enqueue("someone", "kept", payload={"body": "theirs"}, now=at)
    store.finish("someone", "kept", "w1", store.claim("someone", "kept", "w1", now=at), result={}, now=at)
    old = time.time() - bench_retention.AGE_DAYS * 86400
    store.enqueue(bench_retention.TENANT, "ret-1", now=old)
    store.finish(bench_retention.TENANT, "ret-1", "w1", store.claim(bench_retention.TENANT, "ret-1", "w1", now=old),
                 result={}, now=old)

    call_command("prune", *args, stdout=StringIO(), stderr=StringIO())
    assert not Job.objects.filter(tenant=bench_retention.TENANT).exists()
    kept = Job.objects.get(tenant="someone")
    assert kept.payload == {"body": "theirs"} and kept.redacted_at is None


@pytest.mark.postgres
def test_the_jobs_loaded_to_keep_survive_the_bench_prune_and_the_old_ones_go(monkeypatch):
    """`--kept`: the prune works in a table that also holds jobs finished
    yesterday; it deletes the loaded old jobs and their history, and keeps
    every one of those with theirs."""
    started = []
    monkeypatch.setattr(bench_retention.subprocess, "Popen", lambda args, **kwargs: started.append(args))
    bench_retention.start_prune([])
    args = started[0][started[0].index("prune") + 1:]
    bench_retention.load(30, 2, partitioned_history=False, tenant=bench_retention.TENANT_KEPT,
                         age_days=bench_retention.KEPT_AGE_DAYS)
    bench_retention.load(20, 2, partitioned_history=False)

    call_command("prune", *args, stdout=StringIO(), stderr=StringIO())
    assert not Job.objects.filter(tenant=bench_retention.TENANT).exists()
    kept = Job.objects.filter(tenant=bench_retention.TENANT_KEPT)
    assert kept.count() == 30 and JobEvent.objects.filter(job__in=kept).count() == 60
    assert not kept.exclude(redacted_at=None).exists()
