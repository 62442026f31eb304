"""Jobs in the admin: read-only evidence. Decisions are console pages (tests/console/)."""

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
