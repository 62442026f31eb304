"""A viewer reads the queues' reasons and errors with the sensitive values
masked, as on the decision page; the job list's assignee filter takes a user
id as the queues do; the decision page shows no empty "Time and approvals"
section when the review has no due time."""

import pytest

from jobs.models import Job
from jobs.store import Store
from review import assignment
from review.masking import MASK
from tests.factories import OperationFactory

from .conftest import make_job

pytestmark = pytest.mark.django_db

ADDRESS = "ana-secret@example.com"
EMAIL = {"to": ADDRESS, "subject": "Your quote 17", "body": "Hi"}


def test_a_viewer_reads_the_queues_reasons_and_errors_masked_and_who_decides_in_clear(client, people):
    Store().enqueue("studio", "r-1", action="connectors.send_email", payload=EMAIL,
                    review=f"proposed by agent:ada: remind {ADDRESS} of the quote")
    job = make_job("a-1", "NEEDS_ATTENTION", action="connectors.send_email", payload=EMAIL)
    Job.objects.filter(pk=job.pk).update(last_error=f"550 {ADDRESS}: no such mailbox")
    OperationFactory(job=job, request=EMAIL, state="REJECTED", last_error=f"rejected {ADDRESS}")
    pages = {}
    for role in ("viewer", "reviewer", "operator"):
        client.force_login(people[role])
        pages[role] = (client.get("/admin/console/review/").content.decode()
                       + client.get("/admin/console/attention/").content.decode())
    assert ADDRESS not in pages["viewer"]
    assert f"remind {MASK} of the quote" in pages["viewer"] and f"550 {MASK}: no such mailbox" in pages["viewer"]
    assert f"rejected {MASK}" in pages["viewer"]
    assert ADDRESS in pages["reviewer"] and ADDRESS in pages["operator"]


def test_the_job_list_filters_by_a_given_assignee_as_the_queues_do(client, people):
    mine, nobodys = (make_job(key, "WAITING_REVIEW") for key in ("mine", "nobodys"))
    assignment.job_assign(job_id=mine.pk, user=people["reviewer"])
    client.force_login(people["operator"])

    def listed(**query):
        return sorted(job.key for job in client.get("/admin/jobs/job/", query).context["cl"].result_list)

    assert listed(assignee=str(people["reviewer"].pk)) == ["mine"]
    assert listed(assignee="me") == []
    assert listed(assignee="none") == ["nobodys"]
    assert listed(assignee="x1") == ["mine", "nobodys"]  # not an id: no filter, never a 500


def test_a_review_without_due_time_or_four_eyes_shows_no_empty_time_section(client, people):
    job = make_job("plain", "WAITING_REVIEW")
    client.force_login(people["reviewer"])
    assert "Time and approvals" not in client.get(f"/admin/console/jobs/{job.pk}/").content.decode()


def test_a_viewer_cannot_find_a_job_by_a_value_they_read_masked(client, people):
    """The search text holds the recipient in clear; a viewer's search must not
    say which job holds an address they only ever see masked. The key still
    finds it; reviewers and operators search everything."""
    Store().enqueue("studio", "remind-ana", action="connectors.send_email", payload=EMAIL,
                    review=f"proposed by agent:ada: remind {ADDRESS}")
    make_job("attn-ana", "NEEDS_ATTENTION", action="connectors.send_email", payload=EMAIL)
    Job.objects.filter(key="attn-ana").update(last_error=f"550 {ADDRESS}: no such mailbox")

    def found(role, url, **query):
        client.force_login(people[role])
        page = client.get(url, query)
        assert page.status_code == 200
        return ("remind-ana" in page.content.decode(), "attn-ana" in page.content.decode())

    for url in ("/admin/console/review/", "/admin/console/attention/", "/admin/jobs/job/"):
        assert found("viewer", url, q="ana-secret") == (False, False), url
        assert found("viewer", url, q="remind-an" if "attention" not in url else "attn-an") != (False, False), url
    assert found("reviewer", "/admin/console/review/", q="ana-secret") == (True, False)
    assert found("operator", "/admin/console/attention/", q="ana-secret") == (False, True)
    assert found("operator", "/admin/jobs/job/", q="ana-secret") == (True, True)
    # The queues' reason filter reads the same text: a viewer's finds nothing masked.
    assert found("viewer", "/admin/console/review/", reason="ana-secret") == (False, False)
    assert found("viewer", "/admin/console/attention/", reason="ana-secret") == (False, False)
    assert found("reviewer", "/admin/console/review/", reason="ana-secret") == (True, False)
