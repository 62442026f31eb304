"""Decisions in the console (DESIGN §14): each needs the permission, the role
in the job's tenant and the state; leaves a JobEvent and a LogEntry; two
people deciding at once — one wins."""

import pytest
from django.contrib.admin.models import LogEntry

from jobs.models import Job
from operations.models import Operation
from tests.factories import ConnectorPauseFactory, MembershipFactory, OperationFactory, UserFactory

from .conftest import decide, make_job, newest_event

pytestmark = pytest.mark.django_db

EMAIL = {"to": "bad-address", "subject": "Your quote", "body": "Hello"}
TARGET = {"approve": "READY", "reject": "CANCELLED", "correct": "READY", "retry": "READY", "resolve": "DONE",
          "cancel": "CANCELLED"}
ALLOWED = {("reviewer", d, "WAITING_REVIEW") for d in ("approve", "reject", "correct")} | {
    ("operator", d, "NEEDS_ATTENTION") for d in ("retry", "resolve", "cancel")}


@pytest.mark.parametrize("state", ["WAITING_REVIEW", "NEEDS_ATTENTION", "READY", "DONE"])
@pytest.mark.parametrize("decision", list(TARGET))
@pytest.mark.parametrize("role", ["reviewer", "operator", "viewer"])
def test_each_role_may_take_exactly_its_decisions_in_the_right_state(client, people, role, decision, state):
    job = make_job("q-1", state, action="connectors.send_email", payload=EMAIL)
    client.force_login(people[role])
    extra = {"correct": {"correct-to": "right@example.com", "correct-subject": "Your quote", "correct-body": "Hello"},
             "resolve": {"evidence": "ticket #1"}}

    response = decide(client, job, decision, **extra.get(decision, {}))

    job.refresh_from_db()
    # Taken: back to the queue; refused: the page again, saying why (never a 500).
    assert response.status_code == (302 if (role, decision, state) in ALLOWED else 400)
    if (role, decision, state) in ALLOWED:
        assert job.state == TARGET[decision]
        assert job.events.last().actor == people[role].username
    else:
        assert job.state == state, f"{role} must not {decision} a {state} job"
        assert not LogEntry.objects.exists()


def test_a_viewer_sees_no_decision_controls_and_a_reviewer_sees_only_review_ones(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["viewer"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "the provider rejected the address" in page
    assert "/decide/" not in page and "Note (required)" not in page

    client.force_login(people["reviewer"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "/decide/approve/" in page and "/decide/reject/" in page
    assert "/decide/retry/" not in page and "/decide/resolve/" not in page


def test_another_tenants_job_answers_404_everywhere(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["other"])  # a reviewer of acme; the job is studio's
    for url in (f"/admin/console/jobs/{job.pk}/", f"/admin/console/jobs/{job.pk}/timeline/",
                f"/admin/console/jobs/{job.pk}/history.json", f"/admin/jobs/job/{job.pk}/change/",
                f"/admin/jobs/job/{job.pk}/history/"):
        assert client.get(url).status_code == 404, url
    assert decide(client, job, "approve").status_code == 404
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"
    listing = client.get("/admin/jobs/job/").content.decode()
    assert "q-1" not in listing
    assert "q-1" not in client.get("/admin/console/review/").content.decode()


def test_every_decision_writes_a_job_event_and_a_log_entry(client, people):
    approve = make_job("a-1", "WAITING_REVIEW")
    retry = make_job("r-1", "NEEDS_ATTENTION")
    client.force_login(people["reviewer"])
    decide(client, approve, "approve", note="the address is right after all")
    client.force_login(people["operator"])
    decide(client, retry, "retry", note="credentials rotated")

    for job, kind, note, actor in [(approve, "approve", "the address is right after all", "rita"),
                                   (retry, "retry", "credentials rotated", "otto")]:
        event = job.events.last()
        assert (event.kind, event.actor, event.reason) == (kind, actor, note)
        assert (event.from_state, event.to_state) == (job.state, "READY")
        entry = LogEntry.objects.get(object_id=str(job.pk))
        assert entry.user.username == actor and note in entry.get_change_message()


def test_a_decision_needs_a_note(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["reviewer"])
    page = client.post(f"/admin/console/jobs/{job.pk}/decide/approve/",
                       {"note": "  ", "seen_event": newest_event(job)}, follow=True)
    assert "a note is required" in page.content.decode()
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"


def test_decisions_are_post_only(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["reviewer"])
    assert client.get(f"/admin/console/jobs/{job.pk}/decide/approve/?note=x").status_code == 405
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"


def test_the_second_of_two_decisions_on_the_same_page_is_told_who_decided(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    seen = newest_event(job)
    client.force_login(people["reviewer"])
    client.post(f"/admin/console/jobs/{job.pk}/decide/approve/", {"note": "fine", "seen_event": seen})

    second = UserFactory(username="ruth", staff=True, groups=people["reviewer"].groups.all())
    MembershipFactory(user=second, tenant=people["reviewer"].memberships.get().tenant, role="reviewer")
    client.force_login(second)
    page = client.post(f"/admin/console/jobs/{job.pk}/decide/reject/", {"note": "no", "seen_event": seen},
                       follow=True).content.decode()

    assert "already decided by rita at" in page
    job.refresh_from_db()
    assert job.state == "READY" and job.events.filter(kind="reject").count() == 0


def test_correct_and_approve_records_before_and_after_and_raises_the_revision(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    client.force_login(people["reviewer"])
    response = decide(client, job, "correct", note="typo in the address", **{
        "correct-to": "ana@example.com", "correct-subject": "Your quote", "correct-body": "Hello"})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == "READY"
    assert job.payload == {**EMAIL, "to": "ana@example.com", "revision": 2}
    event = job.events.last()
    assert event.kind == "correct"
    assert event.detail["correction"] == {"to": {"before": "bad-address", "after": "ana@example.com"}}


def test_an_invalid_correction_is_refused_and_changes_nothing(client, people):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    client.force_login(people["reviewer"])
    page = client.post(f"/admin/console/jobs/{job.pk}/decide/correct/", {
        "note": "x", "seen_event": newest_event(job), "correct-to": "still-bad", "correct-subject": "s",
        "correct-body": "b"}, follow=True).content.decode()
    assert "Enter a valid email address" in page
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW" and job.payload == EMAIL


@pytest.mark.parametrize("op_state", ["INTENDED", "UNKNOWN", "ACCEPTED", "NEEDS_INVESTIGATION"])
def test_correction_is_refused_while_an_operation_may_have_reached_the_provider(client, people, op_state):
    job = make_job("q-1", "WAITING_REVIEW", action="connectors.send_email", payload=EMAIL)
    OperationFactory(job=job, provider="sim-idempotent", request=EMAIL, state=op_state)
    client.force_login(people["reviewer"])
    page = client.post(f"/admin/console/jobs/{job.pk}/decide/correct/", {
        "note": "x", "seen_event": newest_event(job), "correct-to": "ana@example.com", "correct-subject": "s",
        "correct-body": "b"}, follow=True).content.decode()
    assert "may have reached the provider" in page
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW" and job.payload == EMAIL


def test_resolving_a_job_with_an_operation_in_doubt_goes_through_the_operation(client, people):
    job = make_job("q-1", "NEEDS_ATTENTION", action="connectors.send_email", payload=EMAIL)
    op = OperationFactory(job=job, provider="sim-bare", request=EMAIL, state="NEEDS_INVESTIGATION")
    client.force_login(people["operator"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert f"/admin/operations/operation/{op.pk}/decide/" in page and "/decide/resolve/" not in page

    refused = client.post(f"/admin/console/jobs/{job.pk}/decide/resolve/",
                          {"note": "done", "seen_event": newest_event(job)}, follow=True).content.decode()
    assert "is NEEDS_INVESTIGATION" in refused
    job.refresh_from_db()
    assert job.state == "NEEDS_ATTENTION"

    decided = client.post(f"/admin/operations/operation/{op.pk}/decide/", {
        "decision": "sent", "provider_reference": "msg-77", "reason": "in the provider's dashboard",
        "seen_event": newest_event(job)})
    assert decided.status_code == 302
    job.refresh_from_db()
    op.refresh_from_db()
    assert (job.state, op.state, op.receipt.provider_reference) == ("DONE", "ACCEPTED", "msg-77")
    assert not Operation.objects.filter(job=job, state__in=["INTENDED", "UNKNOWN", "NEEDS_INVESTIGATION"]).exists()
    assert LogEntry.objects.filter(object_id=str(job.pk)).exists()


def test_a_reviewer_cannot_decide_operations_nor_clear_pauses(client, people):
    job = make_job("q-1", "NEEDS_ATTENTION", action="connectors.send_email", payload=EMAIL)
    op = OperationFactory(job=job, provider="sim-bare", request=EMAIL, state="NEEDS_INVESTIGATION")
    pause = ConnectorPauseFactory(provider="sim-bare")
    client.force_login(people["reviewer"])
    assert "Decide what became of it" not in client.get(f"/admin/operations/operation/{op.pk}/change/").content.decode()
    assert client.post(f"/admin/operations/operation/{op.pk}/decide/", {
        "decision": "not_sent", "reason": "x"}).status_code == 403
    assert client.post(f"/admin/operations/connectorpause/{pause.pk}/clear/", {"note": "x"}).status_code == 403
    op.refresh_from_db()
    pause.refresh_from_db()
    assert op.state == "NEEDS_INVESTIGATION" and pause.active


def test_clearing_a_pause_retries_the_jobs_it_held_back(client, people):
    store_job = make_job("q-1", "NEEDS_ATTENTION")
    Job.objects.filter(pk=store_job.pk).update(
        last_error="sim-bare refused the credentials of tenant studio while sending (HTTP 401)")
    other = make_job("q-2", "NEEDS_ATTENTION")
    pause = ConnectorPauseFactory(provider="sim-bare")
    client.force_login(people["operator"])
    page = client.get(f"/admin/operations/connectorpause/{pause.pk}/clear/").content.decode()
    assert "q-1" in page and "q-2" not in page
    assert f'name="seen_{store_job.pk}" value="{newest_event(store_job)}"' in page  # the state it showed

    client.post(f"/admin/operations/connectorpause/{pause.pk}/clear/",
                {"note": "key rotated", "retry": [str(store_job.pk)], f"seen_{store_job.pk}": newest_event(store_job)})

    pause.refresh_from_db()
    store_job.refresh_from_db()
    other.refresh_from_db()
    assert not pause.active and pause.cleared_by == "otto"
    assert store_job.state == "READY" and other.state == "NEEDS_ATTENTION"


def test_correction_is_offered_only_for_actions_that_declare_a_review_form(client, people):
    job = make_job("q-1", "WAITING_REVIEW")  # jobs.noop declares none
    client.force_login(people["reviewer"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "/decide/approve/" in page and "/decide/correct/" not in page
    refused = client.post(f"/admin/console/jobs/{job.pk}/decide/correct/",
                          {"note": "x", "seen_event": newest_event(job), "correct-to": "a@example.com"},
                          follow=True).content.decode()
    assert "declares no correctable fields" in refused
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW" and job.payload == {}


def test_a_crafted_post_without_the_seen_state_is_refused(client, people):
    job = make_job("q-1", "WAITING_REVIEW")
    client.force_login(people["reviewer"])
    page = client.post(f"/admin/console/jobs/{job.pk}/decide/approve/", {"note": "x"}, follow=True)
    assert "reload it" in page.content.decode()
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"


NO_ROLE = "your role in tenant studio is {}; {} needs {}"
NO_PERMISSION = "you do not have the permission to {} ({})"


@pytest.mark.parametrize("decision, state, group, role, reason", [
    # The permission without the role: a member of the group whose role in this tenant is another.
    ("approve", "WAITING_REVIEW", "reviewers", "viewer", NO_ROLE.format("viewer", "approve", "reviewer")),
    ("retry", "NEEDS_ATTENTION", "operators", "reviewer", NO_ROLE.format("reviewer", "retry now", "operator")),
    # The role without the permission: the tenant's reviewer (operator) whose account lacks the permission.
    ("approve", "WAITING_REVIEW", "viewers", "reviewer", NO_PERMISSION.format("approve", "jobs.review_job")),
    ("retry", "NEEDS_ATTENTION", "viewers", "operator", NO_PERMISSION.format("retry now", "jobs.operate_job")),
], ids=["permission-without-role", "operate-permission-without-role", "role-without-permission",
        "operator-role-without-permission"])
def test_a_decision_needs_both_the_permission_and_the_role_and_either_alone_is_refused(
        client, tenants, decision, state, group, role, reason):
    from django.contrib.auth.models import Group

    from jobs import access

    studio, _ = tenants
    user = MembershipFactory(user__username="half", user__groups=[Group.objects.get(name=group)], tenant=studio,
                             role=role).user
    job = make_job("q-1", state)
    assert access.refusal(user, decision, tenant="studio", state=state) == reason
    assert decision not in [d.name for d in access.allowed_decisions(user, job)]

    client.force_login(user)
    response = decide(client, job, decision)
    job.refresh_from_db()
    assert job.state == state
    assert not LogEntry.objects.exists()
    assert response.status_code == 400 and reason in response.content.decode()


@pytest.mark.parametrize("target", ["https://evil.example/phish", "//evil.example/phish", "http://evil.example",
                                    "https:///evil.example/"])
def test_a_decision_follows_next_on_this_site_and_never_off_it(client, people, target):
    from django.urls import reverse

    client.force_login(people["reviewer"])
    offsite = decide(client, make_job("q-1", "WAITING_REVIEW"), "approve", next=target)
    assert offsite.status_code == 302 and offsite["Location"] == reverse("console:review")

    onsite = decide(client, make_job("q-2", "WAITING_REVIEW"), "approve", next="/admin/console/review/?q=quote")
    assert onsite.status_code == 302 and onsite["Location"] == "/admin/console/review/?q=quote"
