"""The job list's search reads each job's search row (`jobs.JobSearch`),
written with the job by every path that creates one and rewritten only by a
correction — never by a state change: a job is found by its text in every
state, by its corrected text, and its row goes with it when retention
deletes the job."""

import time

import pytest

from jobs import interventions
from jobs.actions import action
from jobs.models import Job, JobSearch
from jobs.retention import retention_sweep
from jobs.search import jobs_matching
from jobs.store import JobSpec
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

EMAIL = {"to": "Zoe@Example.org", "subject": "Your invoice INV-7", "body": "Hi"}
DAY = 86400.0


def by_enqueue_once(store, key):
    store.enqueue_once("studio", key, action="connectors.send_email", payload=EMAIL, subject_type="company.invoice",
                       subject_id="7")


def by_enqueue_many(store, key):
    store.enqueue_many([JobSpec("studio", "neighbour"),
                        JobSpec("studio", key, action="connectors.send_email", payload=EMAIL,
                                subject_type="company.invoice", subject_id="7")])


def by_the_factory(store, key):
    JobFactory(key=key, action="connectors.send_email", payload=EMAIL, subject_type="company.invoice",
               subject_id="7")


@action("test.searched_by_a_function", searchable=lambda job: [f"{job.tenant}/{job.payload['ref']}", job.subject_id])
def searched_by_a_function(ctx):
    return None


@action("test.searched_by_a_failing_function", searchable=lambda job: [job.payload["missing"]])
def searched_by_a_failing_function(ctx):
    return None


@pytest.mark.parametrize("name, payload, declared", [
    ("connectors.send_email", EMAIL, ["zoe@example.org", "your invoice inv-7"]),
    ("test.searched_by_a_function", {"ref": "R-9"}, ["studio/r-9", "7"]),
    ("test.searched_by_a_failing_function", {"ref": "R-9"}, []),
    ("jobs.noop", {"to": "nobody"}, []),
])
def test_a_bulk_enqueue_writes_the_search_text_a_single_enqueue_writes(store, name, payload, declared):
    """`enqueue_many` builds a job for its search text only for an action
    whose texts a function computes from it; the text is the same either way
    (a function that fails gives none, and the job is created)."""
    store.enqueue("studio", "one", action=name, payload=payload, subject_type="company.invoice", subject_id="7")
    store.enqueue_many([JobSpec("studio", "many", action=name, payload=payload, subject_type="company.invoice",
                                subject_id="7")], actor="agent:bulk")
    one, many = (Job.objects.get(key=key) for key in ("one", "many"))
    assert one.search_text.split("\n") == ["one", "company.invoice:7", *declared]
    assert many.search_text.split("\n") == ["many", "company.invoice:7", "agent:bulk", *declared]
    assert JobSearch.objects.get(job_id=many.id).search_text == many.search_text


def found(term):
    return sorted(jobs_matching(Job.objects.all(), term, every_state=True).values_list("key", flat=True))


@pytest.mark.parametrize("create", [by_enqueue_once, by_enqueue_many, by_the_factory])
def test_a_job_is_found_by_the_job_list_search_in_every_state_whatever_created_it(store, create):
    create(store, "Reminder-7")
    terms = ["minder-7", "ZOE@example", "your invoice inv-7", "company.invoice:7"]
    for state in ("READY", "LEASED", "DONE"):
        if state == "LEASED":
            epoch = store.claim("studio", "Reminder-7", "w1")
        elif state == "DONE":
            store.finish("studio", "Reminder-7", "w1", epoch)
        assert Job.objects.get(key="Reminder-7").state == state
        for term in terms:
            assert found(term) == ["Reminder-7"], (state, term)
    assert found("nowhere") == []


def test_the_job_lists_page_finds_a_running_job_by_its_text_and_by_the_start_of_its_key(admin_client, store):
    by_enqueue_once(store, "Reminder-7")
    store.enqueue("acme", "other-1")
    store.claim("studio", "Reminder-7", "w1")

    def listed(term):
        page = admin_client.get("/admin/jobs/job/", {"q": term})
        return [job.key for job in page.context["cl"].result_list]

    assert listed("zoe@EXAMPLE.org") == ["Reminder-7"]
    # Too short for a trigram: the start of the key.
    assert listed("Re") == ["Reminder-7"] and listed("ot") == ["other-1"] and listed("mi") == []


def test_a_corrected_job_is_found_by_its_new_text_and_still_by_the_old(store):
    store.enqueue_once("studio", "email-1", action="connectors.send_email", payload=EMAIL, review="check the address")
    interventions.job_correct(tenant="studio", key="email-1", payload={**EMAIL, "to": "yann@example.net"}, reason="typo", actor="rita")
    assert found("yann@example.net") == ["email-1"] and found("zoe@example.org") == ["email-1"]
    store.claim("studio", "email-1", "w1")  # READY, then LEASED: out of the queues' index, still found
    assert found("yann@example.net") == ["email-1"]
    assert JobSearch.objects.get(job__key="email-1").search_text == Job.objects.get(key="email-1").search_text


def test_a_job_written_without_its_search_row_is_still_found_by_its_queues_search(store):
    store.enqueue_once("studio", "email-1", action="connectors.send_email", payload=EMAIL, review="check")
    JobSearch.objects.all().delete()  # as a row inserted by hand, not through the Store, would be
    assert list(jobs_matching(Job.objects.filter(state="WAITING_REVIEW"), "zoe@example")
                .values_list("key", flat=True)) == ["email-1"]
    assert found("zoe@example") == []  # the job list's search reads the search rows only


def test_retention_deletes_the_search_rows_with_their_jobs(store):
    at = time.time() - 40 * DAY
    for key in ("old-1", "old-2"):
        store.enqueue("studio", key, now=at)
        store.finish("studio", key, "w1", store.claim("studio", key, "w1", now=at), now=at)
    store.enqueue("studio", "running")
    report = retention_sweep(retention_days=30)
    assert report.deleted["jobs.Job"] == 2 and report.deleted["jobs.JobSearch"] == 2
    assert sorted(JobSearch.objects.values_list("key", flat=True)) == ["running"]
    assert found("old-") == [] and found("running") == ["running"]
