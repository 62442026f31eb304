"""Jobs in the admin: read-only evidence; operator actions go through the Store."""

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db


def test_job_page_shows_its_history(admin_client, store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w1")
    store.fail("studio", "q-1", "w1", epoch, error="recipient has no @", failure="permanent")
    job = Job.objects.get(key="q-1")
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "recipient has no @" in html and "WAITING_REVIEW" in html
    listing = admin_client.get("/admin/jobs/job/?state__exact=WAITING_REVIEW")
    assert "q-1" in listing.content.decode()


def test_operator_retry_action_is_a_store_transition_with_the_operator_as_actor(admin_client, admin_user, store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w1")
    store.fail("studio", "q-1", "w1", epoch, error="401", failure="auth")
    job = Job.objects.get(key="q-1")
    admin_client.post("/admin/jobs/job/", {"action": "operator_retry", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.state == "READY"
    assert job.events.last().actor == admin_user.username


def test_an_illegal_operator_action_is_refused_with_a_message_and_changes_nothing(admin_client, store):
    store.enqueue("studio", "q-1")
    job = Job.objects.get(key="q-1")
    page = admin_client.post("/admin/jobs/job/", {"action": "operator_resolve", "_selected_action": [job.pk]},
                             follow=True)
    assert "cannot move to DONE" in page.content.decode()
    job.refresh_from_db()
    assert job.state == "READY"
