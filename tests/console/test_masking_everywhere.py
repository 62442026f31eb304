"""A viewer never reads a sensitive value, on any page of a job, its
operations or its proposal: one masker (`review.masking.job_masker`) knows
every value the field held (a correction's replaced address too) and hides
it in any letter case and inside a longer value; the business records show
a viewer a customer's name, never the address the jobs mask. Reviewers and
operators read everything in clear."""

import pytest
from django.contrib.admin.models import LogEntry

from company.models import Customer, Tenant
from company.services import customer_ensure, proposal_submit
from jobs.models import Job
from jobs.store import Store
from operations.models import OperationEvent
from review.masking import MASK
from tests.factories import OperationFactory

from .conftest import decide, make_job

pytestmark = pytest.mark.django_db

ADDRESS = "ana-secret@example.com"
EMAIL = {"to": ADDRESS, "subject": "Your quote 17", "body": "Hi"}


def pages(client, person, *urls):
    client.force_login(person)
    text = ""
    for url in urls:
        page = client.get(url)
        assert page.status_code == 200, (url, page.status_code)
        text += page.content.decode()
    return text


def test_a_corrected_address_quoted_by_the_provider_is_masked_on_every_page(client, people):
    """The reviewer corrects the address; the provider's error about the
    old one (sent before the correction) is read by a viewer masked on the
    queues, the job's and the operation's pages."""
    old = "ana-old@example.com"
    Store().enqueue("studio", "fix-ana", action="connectors.send_email", payload={**EMAIL, "to": old},
                    review="check the address")
    job = Job.objects.get(key="fix-ana")
    client.force_login(people["reviewer"])
    assert decide(client, job, "correct", note="typo", **{"correct-to": ADDRESS, "correct-subject": EMAIL["subject"],
                                                          "correct-body": EMAIL["body"]}).status_code == 302
    job.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(state="NEEDS_ATTENTION", last_error=f"550 {old}: no such mailbox")
    operation = OperationFactory(job=job, request={**EMAIL, "to": ADDRESS}, state="REJECTED",
                                 last_error=f"550 {old.upper()}: bounced earlier")
    urls = ("/admin/console/attention/", f"/admin/console/jobs/{job.pk}/", f"/admin/jobs/job/{job.pk}/change/",
            f"/admin/operations/operation/{operation.pk}/change/",
            f"/admin/operations/operation/{operation.pk}/decide/")
    seen = pages(client, people["viewer"], *urls).lower()
    assert "ana-old" not in seen and "ana-secret" not in seen
    assert f"550 {MASK}: no such mailbox".lower() in seen
    assert old in pages(client, people["operator"], "/admin/console/attention/")


def test_an_address_in_another_letter_case_or_inside_a_longer_value_is_masked(client, people):
    payload = {**EMAIL, "to": f"Ana Secret <{ADDRESS}>"}
    job = make_job("case-ana", "NEEDS_ATTENTION", action="connectors.send_email", payload=payload)
    Job.objects.filter(pk=job.pk).update(last_error=f"550 {ADDRESS.upper()}; also {ADDRESS}x and <{ADDRESS}>")
    seen = pages(client, people["viewer"], "/admin/console/attention/", f"/admin/jobs/job/{job.pk}/change/")
    assert "ana-secret" not in seen.lower()
    assert ADDRESS in pages(client, people["operator"], "/admin/console/attention/")


def test_a_viewer_reads_an_operations_events_and_the_jobs_history_masked(client, people):
    job = make_job("hist-ana", "NEEDS_ATTENTION", action="connectors.send_email", payload=EMAIL)
    operation = OperationFactory(job=job, request=EMAIL, state="REJECTED")
    OperationEvent.objects.create(operation=operation, kind="reject", from_state="INTENDED", to_state="REJECTED",
                                  actor="worker", epoch=1, reason=f"provider refused {ADDRESS}",
                                  detail={"to": ADDRESS, "why": f"{ADDRESS} bounced"})
    LogEntry.objects.log_actions(people["operator"].pk, [job], 2, change_message=f"Retried: wrote to {ADDRESS}",
                                 single_object=True)
    LogEntry.objects.log_actions(people["operator"].pk, [operation], 2,
                                 change_message=f"Decided: {ADDRESS} got it", single_object=True)
    urls = (f"/admin/operations/operation/{operation.pk}/change/", f"/admin/jobs/job/{job.pk}/history/",
            f"/admin/operations/operation/{operation.pk}/history/")
    seen = pages(client, people["viewer"], *urls)
    assert ADDRESS not in seen
    assert f"provider refused {MASK}" in seen and f"Retried: wrote to {MASK}" in seen
    assert f"Decided: {MASK} got it" in seen
    clear = pages(client, people["operator"], *urls)
    assert f"provider refused {ADDRESS}" in clear and f"Retried: wrote to {ADDRESS}" in clear


def test_a_viewer_reads_a_proposal_masked_and_cannot_find_it_by_its_rationale(client, people):
    proposal_submit(tenant=Tenant.objects.get(slug="studio"), proposed_by="agent:ada", action="connectors.send_email",
                    job_key="proposed-ana", rationale=f"remind {ADDRESS} of the quote", payload=EMAIL)
    proposal = Job.objects.get(key="proposed-ana")
    from company.models import Proposal

    proposal = Proposal.objects.get(job_key="proposed-ana")
    url = f"/admin/company/proposal/{proposal.pk}/change/"
    seen = pages(client, people["viewer"], url)
    assert ADDRESS not in seen and f"remind {MASK} of the quote" in seen and "Your quote 17" in seen
    assert ADDRESS in pages(client, people["reviewer"], url)

    def found(person, term):
        client.force_login(person)
        return "proposed-ana" in client.get("/admin/company/proposal/", {"q": term}).content.decode()

    assert not found(people["viewer"], "ana-secret") and found(people["viewer"], "proposed-an")
    assert found(people["reviewer"], "ana-secret")


def test_a_viewer_sees_customers_by_name_never_their_address(client, people):
    studio = Tenant.objects.get(slug="studio")
    customer = customer_ensure(tenant=studio, email=ADDRESS, name="Ana Smith")
    from company.services import quote_create

    quote_create(tenant=studio, number="Q-17", customer=customer, amount="100.00")
    urls = ("/admin/company/customer/", f"/admin/company/customer/{customer.pk}/change/", "/admin/company/quote/",
            f"/admin/company/quote/{customer.quotes.get().pk}/change/")
    seen = pages(client, people["viewer"], *urls)
    assert ADDRESS not in seen and "Ana Smith" in seen
    assert ADDRESS in pages(client, people["reviewer"], *urls)

    def found(person, url, term):
        client.force_login(person)
        return client.get(url, {"q": term}).context["cl"].result_count

    for url in ("/admin/company/customer/", "/admin/company/quote/", "/admin/company/invoice/"):
        assert found(people["viewer"], url, "ana-secret") == 0, url
    assert found(people["viewer"], "/admin/company/customer/", "Ana Smi") == 1
    assert found(people["reviewer"], "/admin/company/customer/", "ana-secret") == 1
    assert found(people["reviewer"], "/admin/company/quote/", "ana-secret") == 1
    assert Customer.objects.count() == 1
