"""Redaction takes the payload's copies in the search text with it: a
redacted job is found by its key, subject and proposer, never by the
recipient or the subject line it no longer holds (on the job, for the
queues, and on its search row, for the job list)."""

import time

import pytest

from jobs.models import Job, JobSearch
from jobs.retention import retention_sweep
from jobs.search import jobs_matching

DAY = 86400.0
EMAIL = {"to": "Zoe@Example.org", "subject": "Your invoice INV-7", "body": "Hi"}


def redacted_job(store):
    at = time.time() - 10 * DAY
    store.enqueue("studio", "remind-zoe", action="connectors.send_email", payload=EMAIL, subject_type="company.invoice",
                  subject_id="7", now=at)
    Job.objects.filter(key="remind-zoe").update(proposed_by="agent:ada")
    epoch = store.claim("studio", "remind-zoe", "w1", now=at)
    store.finish("studio", "remind-zoe", "w1", epoch, now=at)
    store.enqueue("studio", "keep-zoe", action="connectors.send_email", payload=EMAIL)
    assert retention_sweep(retention_days=30, redact_after_days=7).redacted["jobs.Job.payload"] == 1
    return Job.objects.get(key="remind-zoe")


def found(term) -> list[str]:
    every_state = sorted(jobs_matching(Job.objects.all(), term, every_state=True).values_list("key", flat=True))
    queued = sorted(jobs_matching(Job.objects.all(), term).values_list("key", flat=True))
    return [every_state, queued]


@pytest.mark.django_db
def test_a_redacted_job_is_no_longer_found_by_its_recipient_or_subject(store):
    job = redacted_job(store)
    for term in ("zoe@example", "inv-7", "your invoice"):
        assert found(term) == [["keep-zoe"], ["keep-zoe"]], term
        assert term not in job.search_text and term not in JobSearch.objects.get(job=job).search_text
    assert found("remind-zo") == [["remind-zoe"], ["remind-zoe"]]
    assert found("company.invoice:7") == [["remind-zoe"], ["remind-zoe"]]
    assert found("agent:ada") == [["remind-zoe"], ["remind-zoe"]]


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_redacted_job_is_no_longer_found_through_the_trigram_indexes(store):
    test_a_redacted_job_is_no_longer_found_by_its_recipient_or_subject(store)
