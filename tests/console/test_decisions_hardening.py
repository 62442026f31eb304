"""Decisions that strand nothing and refuse bad input: ending a job goes
through its operation in doubt; every decision, job or operation, needs the
state the person saw; a number from a request is parsed strictly (a clear
refusal or a 400, never a 500); notes and evidence have a maximum length,
refused with a clear message and nothing written."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone

from jobs.access import DecisionRefused
from jobs.models import Job
from jobs.retention import retention_sweep
from operations.models import Operation
from operations.review import connector_pause_decide, operation_decide
from review import decisions
from tests.factories import ConnectorPauseFactory, OperationFactory

from .conftest import decide, make_job, newest_event

pytestmark = pytest.mark.django_db

EMAIL = {"to": "ada@example.com", "subject": "Your quote", "body": "Hello"}
IN_DOUBT = ["INTENDED", "UNKNOWN", "NEEDS_INVESTIGATION"]
SEVERAL_PAGES = "x" * 200_000


def job_in_doubt(state: str, *, job_state: str = "NEEDS_ATTENTION", key: str = "q-1"):
    job = make_job(key, job_state, action="connectors.send_email", payload=EMAIL)
    op = OperationFactory(job=job, provider="sim-bare", request=EMAIL, state=state)
    return job, op


def touched_by_olga(job) -> None:
    """Another operator's history row on the job, after the page was shown."""
    job.events.create(kind="note", from_state=job.state, to_state=job.state, actor="olga", created_at=timezone.now())


def decide_operation(client, op, **fields):
    return client.post(f"/admin/operations/operation/{op.pk}/decide/", fields)


# ---------------------------------------------------------------- ending a job around an operation in doubt


@pytest.mark.parametrize("state", IN_DOUBT)
def test_cancelling_a_job_whose_operation_is_in_doubt_is_refused_and_nothing_changes(client, people, state):
    job, op = job_in_doubt(state)
    client.force_login(people["operator"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "/decide/cancel/" not in page and f"/admin/operations/operation/{op.pk}/decide/" in page

    refused = decide(client, job, "cancel", note="customer withdrew")

    assert refused.status_code == 400 and f"is {state}" in refused.content.decode()
    job.refresh_from_db()
    op.refresh_from_db()
    assert (job.state, op.state) == ("NEEDS_ATTENTION", state)
    assert not LogEntry.objects.exists()
    with pytest.raises(DecisionRefused, match=f"is {state}"):
        decisions.job_cancel(job_id=job.pk, user=people["operator"], note="customer withdrew",
                          seen_event=newest_event(job))


@pytest.mark.parametrize("state", IN_DOUBT)
def test_rejecting_a_job_whose_operation_is_in_doubt_is_refused(people, state):
    job, op = job_in_doubt(state, job_state="WAITING_REVIEW")
    with pytest.raises(DecisionRefused, match=f"is {state}"):
        decisions.job_reject(job_id=job.pk, user=people["reviewer"], note="no", seen_event=newest_event(job))
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"


@pytest.mark.parametrize("state", IN_DOUBT)
def test_a_job_is_cancelled_through_its_operations_decision_and_then_prunable(client, people, state):
    job, op = job_in_doubt(state)
    client.force_login(people["operator"])

    decided = decide_operation(client, op, decision="not_sent_cancel", reason="not in the provider's log",
                               seen_event=newest_event(job))

    assert decided.status_code == 302
    job.refresh_from_db()
    op.refresh_from_db()
    assert (job.state, op.state) == ("CANCELLED", "FAILED")
    assert job.events.last().actor == "otto"
    # Nothing refers to it any more: retention may delete it.
    # (A minute on: PostgreSQL's now() stands still inside the test's transaction.)
    report = retention_sweep(now=timezone.now() + timedelta(minutes=1), retention_days=0, redact_after_days=None)
    assert report.kept == 0 and not Job.objects.filter(pk=job.pk).exists()


# ---------------------------------------------------------------- the state the person saw


def test_a_crafted_operation_decision_without_the_seen_state_is_refused(client, people):
    job, op = job_in_doubt("NEEDS_INVESTIGATION")
    client.force_login(people["operator"])

    page = decide_operation(client, op, decision="not_sent", reason="not in the provider's log")

    assert page.status_code == 200 and "which state you saw" in page.content.decode()
    job.refresh_from_db()
    op.refresh_from_db()
    assert (job.state, op.state) == ("NEEDS_ATTENTION", "NEEDS_INVESTIGATION")
    assert not LogEntry.objects.exists()


def test_an_operation_decision_on_a_job_that_moved_since_is_refused(client, people):
    job, op = job_in_doubt("NEEDS_INVESTIGATION")
    client.force_login(people["operator"])
    seen = newest_event(job)
    touched_by_olga(job)

    page = decide_operation(client, op, decision="not_sent", reason="not there", seen_event=seen)

    assert "already decided by olga" in page.content.decode()
    op.refresh_from_db()
    assert op.state == "NEEDS_INVESTIGATION"


def test_every_decision_service_refuses_without_the_seen_state(people):
    job, op = job_in_doubt("NEEDS_INVESTIGATION")
    for service, extra in ((decisions.job_retry, {}), (decisions.job_cancel, {}),
                           (decisions.job_resolve, {"evidence": "ticket #1"})):
        with pytest.raises(DecisionRefused, match="which state you saw"):
            service(job_id=job.pk, user=people["operator"], note="x", seen_event=None, **extra)
    with pytest.raises(DecisionRefused, match="which state you saw"):
        operation_decide(operation_id=op.pk, user=people["operator"], decision="not_sent", note="x",
                         seen_event=None)
    review_job = make_job("q-2", "WAITING_REVIEW")
    for service in (decisions.job_approve, decisions.job_reject):
        with pytest.raises(DecisionRefused, match="which state you saw"):
            service(job_id=review_job.pk, user=people["reviewer"], note="x", seen_event=None)
    job.refresh_from_db()
    review_job.refresh_from_db()
    assert (job.state, review_job.state) == ("NEEDS_ATTENTION", "WAITING_REVIEW")


def test_clearing_a_pause_retries_only_the_held_jobs_as_the_operator_saw_them(people):
    seen_as_shown = make_job("q-1", "NEEDS_ATTENTION")
    moved_since = make_job("q-2", "NEEDS_ATTENTION")
    for job in (seen_as_shown, moved_since):
        Job.objects.filter(pk=job.pk).update(
            last_error="sim-bare refused the credentials of tenant studio while sending (HTTP 401)")
    pause = ConnectorPauseFactory(provider="sim-bare")
    shown = {seen_as_shown.pk: newest_event(seen_as_shown), moved_since.pk: newest_event(moved_since)}
    touched_by_olga(moved_since)

    _, retried = connector_pause_decide(pause_id=pause.pk, user=people["operator"], note="key rotated",
                                        retry=shown)

    assert [job.key for job in retried] == ["q-1"]
    moved_since.refresh_from_db()
    assert moved_since.state == "NEEDS_ATTENTION"


# ---------------------------------------------------------------- numbers from a request


@pytest.mark.parametrize("seen", ["²", "٣", "1_0", " 7", "-1", "9" * 5000, "", "0x10"])
def test_a_decision_with_a_seen_state_that_is_not_an_event_id_is_refused_never_a_500(client, people, seen):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["reviewer"])

    page = client.post(f"/admin/console/jobs/{job.pk}/decide/approve/", {"note": "fine", "seen_event": seen},
                       follow=True)

    assert page.status_code == 400 and "which state you saw" in page.content.decode()
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"


@pytest.mark.parametrize("seen", ["²", "9" * 5000, "1_0"])
def test_an_operation_decision_with_a_seen_state_that_is_not_an_event_id_is_refused(client, people, seen):
    job, op = job_in_doubt("NEEDS_INVESTIGATION")
    client.force_login(people["operator"])

    page = decide_operation(client, op, decision="not_sent", reason="not there", seen_event=seen)

    assert page.status_code == 200 and "which state you saw" in page.content.decode()
    op.refresh_from_db()
    assert op.state == "NEEDS_INVESTIGATION"


@pytest.mark.parametrize("before", ["²", "9" * 5000, "-3", "1e3"])
def test_a_timeline_page_before_something_that_is_not_an_event_id_answers_400(client, people, before):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["viewer"])

    page = client.get(f"/admin/console/jobs/{job.pk}/timeline/", {"before": before})

    assert page.status_code == 400 and b"before" in page.content


@pytest.mark.parametrize("page_number", ["²", "9" * 5000])
def test_a_queue_page_number_that_is_not_a_number_shows_the_first_page(client, people, page_number):
    make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["reviewer"])
    page = client.get("/admin/console/review/", {"page": page_number})
    assert page.status_code == 200 and "q-1" in page.content.decode()


def test_a_pause_clear_with_a_seen_state_that_is_not_an_event_id_retries_nothing(client, people):
    job = make_job("q-1", "NEEDS_ATTENTION")
    Job.objects.filter(pk=job.pk).update(
        last_error="sim-bare refused the credentials of tenant studio while sending (HTTP 401)")
    pause = ConnectorPauseFactory(provider="sim-bare")
    client.force_login(people["operator"])

    page = client.post(f"/admin/operations/connectorpause/{pause.pk}/clear/",
                       {"note": "key rotated", "retry": [str(job.pk)], f"seen_{job.pk}": "²"})

    assert page.status_code in (200, 302)
    job.refresh_from_db()
    assert job.state == "NEEDS_ATTENTION"


# ---------------------------------------------------------------- notes and evidence have a maximum


def test_a_note_of_several_pages_is_refused_and_nothing_is_stored(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["reviewer"])

    page = client.post(f"/admin/console/jobs/{job.pk}/decide/approve/",
                       {"note": SEVERAL_PAGES, "seen_event": newest_event(job)}, follow=True).content.decode()

    assert f"at most {decisions.NOTE_MAX_CHARS} characters" in page
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW" and not job.events.filter(reason=SEVERAL_PAGES).exists()
    assert not LogEntry.objects.exists()
    assert f'maxlength="{decisions.NOTE_MAX_CHARS}"' in page  # the form says so before anyone types
    with pytest.raises(DecisionRefused, match=f"at most {decisions.NOTE_MAX_CHARS}"):
        decisions.job_approve(job_id=job.pk, user=people["reviewer"], note=SEVERAL_PAGES, seen_event=newest_event(job))


def test_evidence_of_several_pages_is_refused_on_every_decision_that_takes_it(client, people):
    job = make_job("q-1", "NEEDS_ATTENTION")
    with pytest.raises(DecisionRefused, match="evidence"):
        decisions.job_resolve(job_id=job.pk, user=people["operator"], note="paid by hand", evidence=SEVERAL_PAGES,
                           seen_event=newest_event(job))
    in_doubt, op = job_in_doubt("NEEDS_INVESTIGATION", key="q-2")
    client.force_login(people["operator"])
    form = client.get(f"/admin/operations/operation/{op.pk}/decide/").content.decode()
    assert f'maxlength="{decisions.NOTE_MAX_CHARS}"' in form
    page = decide_operation(client, op, decision="sent", provider_reference="msg-1", reason="seen it",
                            evidence=SEVERAL_PAGES, seen_event=newest_event(in_doubt))
    assert page.status_code == 200 and "at most" in page.content.decode()
    with pytest.raises(DecisionRefused, match="evidence"):
        operation_decide(operation_id=op.pk, user=people["operator"], decision="sent", note="seen it",
                         provider_reference="msg-1", evidence=SEVERAL_PAGES, seen_event=newest_event(in_doubt))
    with pytest.raises(DecisionRefused, match="reference"):
        operation_decide(operation_id=op.pk, user=people["operator"], decision="sent", note="seen it",
                         provider_reference="m" * 201, seen_event=newest_event(in_doubt))
    job.refresh_from_db()
    op.refresh_from_db()
    assert (job.state, op.state) == ("NEEDS_ATTENTION", "NEEDS_INVESTIGATION")
    assert not Operation.objects.filter(state="ACCEPTED").exists()


def test_a_pause_clear_note_of_several_pages_is_refused(people):
    pause = ConnectorPauseFactory(provider="sim-bare")
    with pytest.raises(DecisionRefused, match="at most"):
        connector_pause_decide(pause_id=pause.pk, user=people["operator"], note=SEVERAL_PAGES)
    pause.refresh_from_db()
    assert pause.active


@pytest.mark.parametrize("page_number", ["²", "9" * 5000])
def test_an_admin_list_page_number_that_is_not_a_number_is_not_a_500(client, people, page_number):
    make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["viewer"])
    for url in ("/admin/jobs/job/", "/admin/operations/operation/", "/admin/jobs/timer/"):
        response = client.get(url, {"p": page_number})
        assert response.status_code == 200, (url, response.status_code)
