"""The agent proposes, the engine decides: review unless the tenant's
policy lets the action run; business keys make a second run propose nothing."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from company.models import Proposal
from company.services import (
    customer_ensure,
    invoice_issue,
    proposal_submit,
    quote_approve,
    quote_create,
    tenant_ensure,
    tenant_policy_set,
)
from jobs.models import Job
from jobs.store import Store
from operations.models import Operation

from .support import run_one, settle

pytestmark = pytest.mark.django_db
TENANT = "acme"


@pytest.fixture
def sim(start_sim, settings):
    simulator = start_sim("idempotent")
    settings.PROVIDER_URL = simulator.url
    return simulator


def overdue(tenant, number="INV-1"):
    customer = customer_ensure(tenant=tenant, email="ada@example.com", name="Ada")
    return invoice_issue(tenant=tenant, number=number, customer=customer, amount=Decimal("90"),
                         due_date=timezone.now().date() - timedelta(days=3), terms="Net 30", actor="t")


def run_agent(run: str):
    store = Store()
    store.enqueue(TENANT, f"agent-rules-{run}", action="company.agent_run")
    assert store.claim(TENANT, f"agent-rules-{run}", "w") is not None
    run_one(store, Job.objects.get(tenant=TENANT, key=f"agent-rules-{run}"), "w")
    return Job.objects.get(tenant=TENANT, key=f"agent-rules-{run}")


def test_a_proposal_that_needs_review_never_runs_before_a_decision(sim):
    tenant = tenant_ensure(slug=TENANT)
    invoice = overdue(tenant)
    submitted = proposal_submit(tenant=tenant, proposed_by="agent:rules", action="company.send_invoice_reminder",
                                job_key="invoice-reminder-INV-1", rationale="overdue by 3 days",
                                subject_type="company.invoice", subject_id=invoice.pk,
                                subject_version=invoice.version)
    job = submitted.job
    assert job.state == "WAITING_REVIEW" and "overdue by 3 days" in job.wait_reason
    created = job.events.get(kind="enqueue")
    assert (created.to_state, created.actor, created.reason) == ("WAITING_REVIEW", "agent:rules", "overdue by 3 days")
    assert created.detail["proposal"] == {
        "id": submitted.proposal.pk, "proposed_by": "agent:rules", "rationale": "overdue by 3 days",
        "subject_type": "company.invoice", "subject_id": str(invoice.pk), "subject_version": invoice.version}
    assert Store().claim_next("w", tenants=[TENANT], actions=["company.send_invoice_reminder"]) is None
    assert not Operation.objects.exists() and sim.messages() == []

    Store().resume(TENANT, "invoice-reminder-INV-1", reason="go ahead", actor="reviewer")
    settle(TENANT)
    assert Job.objects.get(key="invoice-reminder-INV-1").state == "DONE"
    assert len(sim.messages()) == 1


def test_an_action_the_policy_allows_runs_without_review(sim):
    tenant = tenant_ensure(slug=TENANT)
    tenant_policy_set(tenant=tenant, runs_without_review=["company.send_invoice_reminder"])
    invoice = overdue(tenant)
    job = proposal_submit(tenant=tenant, proposed_by="agent:rules", action="company.send_invoice_reminder",
                          job_key="invoice-reminder-INV-1", rationale="overdue", subject_type="company.invoice",
                          subject_id=invoice.pk, subject_version=invoice.version).job
    assert job.state == "READY"
    settle(TENANT)
    assert len(sim.messages()) == 1


def test_a_second_agent_run_proposes_nothing_new(sim):
    tenant = tenant_ensure(slug=TENANT)
    overdue(tenant, "INV-1")
    customer = customer_ensure(tenant=tenant, email="grace@example.com", name="Grace")
    quote_approve(quote=quote_create(tenant=tenant, number="Q-1", customer=customer, amount=Decimal("10")),
                  actor="alice")  # approved; its outbox event is not relayed yet

    first = run_agent("1")
    assert sorted(first.result["proposed"]) == ["invoice-reminder-INV-1", "send-quote-Q-1"]
    assert Proposal.objects.count() == 2
    second = run_agent("2")
    assert second.result == {"proposed": [], "new": 0}
    assert Proposal.objects.count() == 2
    # The outbox consumer finds the agent's job: still one job per quote.
    settle(TENANT)
    assert Job.objects.filter(tenant=TENANT, key="send-quote-Q-1").count() == 1


def test_a_proposal_without_a_rationale_is_refused():
    tenant = tenant_ensure(slug=TENANT)
    with pytest.raises(ValueError, match="rationale"):
        proposal_submit(tenant=tenant, proposed_by="agent:rules", action="jobs.noop", job_key="x", rationale=" ")
    assert not Job.objects.exists()


def test_a_reviewer_approving_an_early_reminder_sends_it_now(sim):
    tenant = tenant_ensure(slug=TENANT)
    tenant_policy_set(tenant=tenant, invoice_reminder_after=timedelta(days=30))  # the timer is weeks away
    invoice = overdue(tenant)
    run_agent("1")
    job = Job.objects.get(tenant=TENANT, key="invoice-reminder-INV-1")
    assert job.state == "WAITING_REVIEW"
    Store().resume(TENANT, job.key, reason="remind them now", actor="reviewer")
    settle(TENANT)
    job.refresh_from_db()
    assert job.state == "DONE" and job.result["sent"] is True
    assert [m["subject"] for m in sim.messages()] == [f"Reminder: invoice {invoice.number}"]
