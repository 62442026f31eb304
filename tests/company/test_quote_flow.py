"""The quote loop in this process against a real simulator: approve → one
email → wait for the reply or the follow-up timer, whichever comes first."""

from datetime import timedelta

import pytest

from company.models import Proposal, Quote
from company.services import QuoteStateError, quote_accept, quote_approve, quote_expire, quote_submit
from jobs.models import OutboxEvent
from jobs.models import InboundEvent, Job, Timer
from operations.models import Operation

from . import support
from .support import inbound_settings, post_reply, settle

pytestmark = pytest.mark.django_db
TENANT = "acme"


@pytest.fixture
def sim(start_sim, settings):
    simulator = start_sim("idempotent")
    settings.PROVIDER_URL = simulator.url
    settings.OPERATIONS_DEFAULT_EMAIL_PROVIDER = "sim-idempotent"
    inbound_settings(settings)
    return simulator


def approved_quote(number="Q-1", *, follow_up_after=timedelta(days=7)) -> Quote:
    return support.approved_quote(TENANT, number, follow_up_after=follow_up_after)


def job(key: str) -> Job:
    return Job.objects.get(tenant=TENANT, key=key)


def test_approved_quote_is_sent_once_and_the_customers_reply_accepts_it(sim):
    quote = approved_quote()
    settle(TENANT)
    quote.refresh_from_db()
    assert quote.status == "SENT"
    assert job("send-quote-Q-1").state == "WAITING_EXTERNAL"
    assert [m["subject"] for m in sim.messages()] == ["Your quote Q-1"]
    timer = Timer.objects.get(job=job("send-quote-Q-1"))
    assert (timer.reason, timer.subject_version, timer.state) == ("quote follow-up", quote.version, "PENDING")

    response = post_reply(TENANT, "Q-1", "accept", event_id="evt-1")
    assert response.status_code == 202, response.content
    settle(TENANT)

    quote.refresh_from_db()
    assert quote.status == "ACCEPTED"
    assert job("send-quote-Q-1").state == "DONE"
    timer.refresh_from_db()
    assert timer.state == "CANCELLED"
    assert len(sim.messages()) == 1
    assert not Proposal.objects.exists()


def test_a_reply_declines_the_quote(sim):
    quote = approved_quote()
    settle(TENANT)
    post_reply(TENANT, "Q-1", "decline", event_id="evt-1")
    settle(TENANT)
    quote.refresh_from_db()
    assert quote.status == "DECLINED"


def test_a_reply_the_machine_cannot_read_goes_to_a_reviewer(sim):
    quote = approved_quote()
    settle(TENANT)
    post_reply(TENANT, "Q-1", "maybe next year?", event_id="evt-1")
    settle(TENANT)
    # Free text the machine cannot classify goes to a person.
    assert job("send-quote-Q-1").state == "WAITING_REVIEW"
    quote.refresh_from_db()
    assert quote.status == "SENT"


def test_follow_up_timer_firing_first_proposes_a_follow_up_that_waits_for_review(sim):
    quote = approved_quote(follow_up_after=timedelta(0))
    settle(TENANT)

    quote.refresh_from_db()
    assert job("send-quote-Q-1").state == "DONE"
    follow_up = job("quote-follow-up-Q-1")
    assert follow_up.state == "WAITING_REVIEW"
    created = follow_up.events.get(kind="enqueue")
    assert created.actor == "timer:quote-follow-up" and "no reply to quote Q-1" in created.reason
    assert created.detail["proposal"]["subject_version"] == quote.version
    assert len(sim.messages()) == 1  # nothing more goes out before a reviewer decides

    # The reply arriving after the timer won is kept for an operator, not applied.
    post_reply(TENANT, "Q-1", "accept", event_id="evt-late")
    assert InboundEvent.objects.get(event_id="evt-late").state == "UNMATCHED"

    from jobs.store import Store

    Store().resume(TENANT, "quote-follow-up-Q-1", reason="approved", actor="reviewer")
    settle(TENANT)
    assert [m["subject"] for m in sim.messages()] == ["Your quote Q-1", "Following up on quote Q-1"]
    assert job("quote-follow-up-Q-1").state == "WAITING_EXTERNAL"
    post_reply(TENANT, "Q-1", "accept", event_id="evt-2", job_key="quote-follow-up-Q-1")
    settle(TENANT)
    quote.refresh_from_db()
    assert quote.status == "ACCEPTED"


def test_a_quote_accepted_in_the_office_ends_the_wait_and_cancels_the_follow_up(sim):
    quote = approved_quote()
    settle(TENANT)
    quote_accept(quote=quote, actor="bob (phone call)")
    settle(TENANT)
    assert job("send-quote-Q-1").state == "DONE"
    assert Timer.objects.get(job=job("send-quote-Q-1")).state == "CANCELLED"
    assert not Job.objects.filter(key="quote-follow-up-Q-1").exists()


def test_a_quote_expired_in_the_office_ends_the_wait_without_another_email(sim):
    quote = approved_quote()
    settle(TENANT)
    quote = quote_expire(quote=quote, actor="bob (offer lapsed)")
    assert quote.status == "EXPIRED"
    settle(TENANT)
    assert job("send-quote-Q-1").state == "DONE"
    assert job("send-quote-Q-1").result["status"] == "EXPIRED"
    assert Timer.objects.get(job=job("send-quote-Q-1")).state == "CANCELLED"
    assert [m["subject"] for m in sim.messages()] == ["Your quote Q-1"]
    with pytest.raises(QuoteStateError):
        quote_accept(quote=quote, actor="customer, too late")


def test_a_submitted_quote_waits_for_approval_before_anything_is_sent(sim):
    from company.services import customer_ensure, quote_create, tenant_ensure

    tenant = tenant_ensure(slug=TENANT)
    customer = customer_ensure(tenant=tenant, email="ada@example.com", name="Ada")
    quote = quote_submit(quote=quote_create(tenant=tenant, number="Q-9", customer=customer, amount=1),
                         actor="carol")
    assert quote.status == "PENDING_APPROVAL"
    assert OutboxEvent.objects.filter(event_type="quote.submitted", aggregate_id=str(quote.pk)).exists()
    with pytest.raises(QuoteStateError):
        quote_submit(quote=quote, actor="carol")  # only a draft is submitted
    with pytest.raises(QuoteStateError):
        quote_expire(quote=quote, actor="carol")  # only a sent quote expires
    settle(TENANT)
    assert sim.messages() == [] and not Job.objects.filter(key="send-quote-Q-9").exists()
    quote_approve(quote=quote, actor="alice")
    settle(TENANT)
    assert [m["subject"] for m in sim.messages()] == ["Your quote Q-9"]


def test_a_redelivered_approval_sends_one_email(sim):
    quote = approved_quote()
    settle(TENANT)
    from jobs.outbox import outbox_event_requeue  # noqa: F401 - the operator's requeue redelivers the same way

    OutboxEvent.objects.filter(event_type="quote.approved").update(state="PENDING", next_attempt_at=None)
    settle(TENANT)
    assert Job.objects.filter(tenant=TENANT, key__startswith="send-quote-").count() == 1
    assert Operation.objects.filter(job__key="send-quote-Q-1").count() == 1
    assert len(sim.messages()) == 1
    quote.refresh_from_db()
    assert quote.status == "SENT"


def test_a_followed_up_quote_is_not_followed_up_again_after_retention_deleted_the_follow_up_job(sim):
    from django.utils import timezone

    from company.agent import agent_propose
    from jobs.retention import retention_sweep
    from jobs.store import Store

    quote = approved_quote(follow_up_after=timedelta(0))
    settle(TENANT)
    Store().resume(TENANT, "quote-follow-up-Q-1", reason="approved", actor="reviewer")
    settle(TENANT)
    assert len(sim.messages()) == 2
    quote.refresh_from_db()
    assert quote.followed_up_at is not None
    # The wait ended without a reply (an operator cancelled it); retention deletes the job.
    Job.objects.filter(tenant=TENANT, key="quote-follow-up-Q-1").update(state="CANCELLED",
                                                                         finished_at=timezone.now())
    retention_sweep(now=timezone.now() + timedelta(days=31), retention_days=30, redact_after_days=30)
    assert not Job.objects.filter(key="quote-follow-up-Q-1").exists()

    assert "quote-follow-up-Q-1" not in agent_propose(tenant=quote.tenant, now=timezone.now() + timedelta(days=60))
    # Proposed again all the same (by hand) and approved: the quote says it was followed up.
    Store().enqueue(TENANT, "quote-follow-up-Q-1", action="company.send_quote_follow_up", subject_type="company.quote",
                    subject_id=quote.pk, subject_version=quote.version)
    settle(TENANT)
    assert len(sim.messages()) == 2
    assert job("quote-follow-up-Q-1").result["follow_up_sent"] is False
