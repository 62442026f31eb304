"""A review policy on `company.send_quote` covers the quote approval that
causes the send: the quote's approver is the first approval of its email,
and under a two-approver policy the email waits in the review queue until
another reviewer approves it. Under one approval it goes out at once."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group

from company.names import SEND_QUOTE
from company.review import quote_approve_by
from company.review_policy import review_policy_set
from company.services import customer_ensure, quote_create, quote_submit, tenant_ensure
from jobs.access import DecisionRefused
from jobs.models import Job
from jobs.outbox import outbox_relay
from review.decisions import approvals_so_far, job_approve
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def reviewer(name: str):
    return MembershipFactory(user__username=name, user__groups=[Group.objects.get(name="reviewers")],
                             tenant=tenant_ensure(slug="studio"), role="reviewer").user


def pending_quote(number="Q-1"):
    tenant = tenant_ensure(slug="studio")
    customer = customer_ensure(tenant=tenant, email="ada@example.com", name="Ada")
    return quote_submit(quote=quote_create(tenant=tenant, number=number, customer=customer, amount=Decimal("10")),
                        actor="sales")


def approve(job, user, note="the email is right"):
    newest = job.events.order_by("-id").values_list("id", flat=True).first()
    return job_approve(job_id=job.pk, user=user, note=note, seen_event=newest)


def send_of(quote) -> Job:
    outbox_relay()
    return Job.objects.get(tenant="studio", key=f"send-quote-{quote.number}")


def test_under_two_approvers_the_quote_approval_is_the_first_and_the_email_waits_for_a_second(client):
    rita, rosa = reviewer("rita"), reviewer("rosa")
    review_policy_set(tenant=tenant_ensure(slug="studio"), action=SEND_QUOTE, approvals=2)
    quote = pending_quote()

    client.force_login(rita)
    page = client.post("/admin/company/quote/", {"action": "approve", "_selected_action": [quote.pk]},
                       follow=True).content.decode()
    assert "waits for a second reviewer" in page

    send = send_of(quote)
    assert send.state == "WAITING_REVIEW", "one person's quote approval does not release its email"
    assert [e.actor for e in approvals_so_far(send)] == ["rita"]
    assert "approved by rita" in send.wait_reason
    with pytest.raises(DecisionRefused, match="you approved this item already"):
        approve(send, rita)

    released = approve(send, rosa)
    assert released.state == "READY"
    assert released.events.order_by("-id").first().detail["approvals"] == ["rita", "rosa"]
    # The console's decision page says whose approval came first, and from where.
    client.force_login(rosa)
    assert "approved quote Q-1" in client.get(f"/admin/console/jobs/{send.pk}/").content.decode()


def test_a_quote_approved_by_a_script_needs_two_reviewers_for_its_email():
    rita, rosa = reviewer("rita"), reviewer("rosa")
    review_policy_set(tenant=tenant_ensure(slug="studio"), action=SEND_QUOTE, approvals=2)
    from company.services import quote_approve

    quote = quote_approve(quote=pending_quote(), actor="import-script")
    send = send_of(quote)
    assert send.state == "WAITING_REVIEW" and approvals_so_far(send) == [], "a script is not a reviewer"
    assert approve(approve(send, rita), rosa).state == "READY"


def test_under_one_approval_the_quote_approval_releases_the_email():
    rita = reviewer("rita")
    quote = quote_approve_by(quote_id=pending_quote().pk, user=rita)
    assert send_of(quote).state == "READY"
