"""Invoice reminder timers re-read the invoice when they come due: paid →
cancelled, suppressed → cancelled with the reason, changed → re-planned,
otherwise one reminder rendered from the record as it is then."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from company.models import Invoice
from company.services import (
    customer_ensure,
    customer_suppress,
    invoice_change_terms,
    invoice_issue,
    invoice_record_payment,
    tenant_ensure,
)
from jobs.models import Job, Timer
from jobs.outbox import outbox_relay
from jobs.store import Store

from .support import run_one, settle

pytestmark = pytest.mark.django_db
TENANT = "acme"


@pytest.fixture
def sim(start_sim, settings):
    simulator = start_sim("lookup")
    settings.PROVIDER_URL = simulator.url
    settings.OPERATIONS_DEFAULT_EMAIL_PROVIDER = "sim-lookup"
    return simulator


def overdue_invoice(number: str, email: str, *, days_overdue: int = 5) -> Invoice:
    tenant = tenant_ensure(slug=TENANT)
    customer = customer_ensure(tenant=tenant, email=email, name=email.split("@")[0].title())
    return invoice_issue(tenant=tenant, number=number, customer=customer, amount=Decimal("500.00"),
                         due_date=timezone.now().date() - timedelta(days=days_overdue), terms="Net 30", actor="t")


def planned(invoice: Invoice) -> Timer:
    outbox_relay()
    return Timer.objects.get(subject_type="company.invoice", subject_id=str(invoice.pk))


def test_an_overdue_invoice_is_reminded_once_with_its_balance_at_send_time(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com")
    planned(invoice)
    invoice = invoice_record_payment(invoice=invoice, amount=Decimal("120.00"), actor="bank")
    settle(TENANT)
    settle(TENANT)
    messages = sim.messages()
    assert [(m["to"], m["subject"]) for m in messages] == [("ada@example.com", "Reminder: invoice INV-1")]
    job = Job.objects.get(tenant=TENANT, key="invoice-reminder-INV-1")
    assert job.state == "DONE" and job.result["sent"] is True
    # Rendered from the record when it was sent: the balance after the payment.
    from operations.models import Operation

    assert "380.00 is still open" in Operation.objects.get(job=job).request["body"]
    # The payment changed the version: the first timer re-planned, its successor fired.
    states = sorted(Timer.objects.filter(subject_id=str(invoice.pk)).values_list("state", flat=True))
    assert states == ["FIRED", "SUPERSEDED"]


def test_a_paid_invoice_is_never_reminded(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com")
    timer = planned(invoice)
    invoice_record_payment(invoice=invoice, amount=Decimal("500.00"), actor="bank")
    settle(TENANT)
    timer.refresh_from_db()
    assert timer.state == "CANCELLED" and timer.outcome["reason"] == "invoice INV-1 is paid"
    assert not Job.objects.filter(key="invoice-reminder-INV-1").exists()
    assert sim.messages() == []


def test_a_suppressed_customer_is_never_reminded_and_the_timer_says_why(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com")
    timer = planned(invoice)
    customer_suppress(customer=invoice.customer, reason="disputes the invoice", actor="carol")
    settle(TENANT)
    timer.refresh_from_db()
    assert timer.state == "CANCELLED"
    assert timer.outcome["reason"] == "ada@example.com suppressed reminders (disputes the invoice)"
    assert sim.messages() == []


def test_a_new_due_date_re_plans_the_reminder_from_the_record(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com")
    timer = planned(invoice)
    new_due = timezone.now().date() + timedelta(days=20)
    invoice_change_terms(invoice=invoice, due_date=new_due, terms="Net 45", actor="carol")
    settle(TENANT)
    timer.refresh_from_db()
    assert timer.state == "SUPERSEDED"
    successor = timer.superseded_by
    assert successor.state == "PENDING" and successor.scheduled_for.date() == new_due + timedelta(days=1)
    assert sim.messages() == []


def test_an_invoice_paid_after_its_timer_fired_is_not_reminded(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com")
    planned(invoice)
    from jobs.timers import timer_fire_due

    timer_fire_due(now=timezone.now())  # the job is enqueued …
    invoice_record_payment(invoice=invoice, amount=Decimal("500.00"), actor="bank")  # … then the money arrives
    settle(TENANT)
    job = Job.objects.get(key="invoice-reminder-INV-1")
    assert job.result == {"invoice": "INV-1", "sent": False, "reason": "invoice INV-1 is paid"}
    assert sim.messages() == []


def test_planning_reminders_daily_is_idempotent(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com", days_overdue=-10)  # due in ten days
    paid = overdue_invoice("INV-2", "grace@example.com")
    invoice_record_payment(invoice=paid, amount=Decimal("500.00"), actor="bank")
    outbox_relay()
    store = Store()
    for day in ("2026-11-30", "2026-11-30", "2026-12-01"):
        store.enqueue(TENANT, f"invoice-reminder-plan-{day}", action="company.plan_invoice_reminders",
                      payload={"date": day})
    for _ in range(3):
        run_one(store, store.claim_next("w", tenants=[TENANT]), "w")
    assert Timer.objects.filter(subject_id=str(invoice.pk), state="PENDING").count() == 1
    assert not Timer.objects.filter(subject_id=str(paid.pk)).exists()


def test_a_due_date_moved_after_the_timer_fired_waits_for_the_new_date(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com")
    planned(invoice)
    from jobs.timers import timer_fire_due

    timer_fire_due(now=timezone.now())  # the job is enqueued for version 1 …
    new_due = timezone.now().date() + timedelta(days=30)
    invoice_change_terms(invoice=invoice, due_date=new_due, actor="carol")  # … then the due date moves
    settle(TENANT)
    job = Job.objects.get(key="invoice-reminder-INV-1")
    assert job.state == "WAITING_EXTERNAL" and "re-planned" in job.wait_reason
    timer = Timer.objects.get(job=job)
    assert timer.state == "PENDING" and timer.scheduled_for.date() == new_due + timedelta(days=1)
    assert sim.messages() == []


def test_a_customer_who_suppresses_reminders_after_the_timer_fired_gets_none(sim):
    invoice = overdue_invoice("INV-1", "ada@example.com")
    planned(invoice)
    from jobs.timers import timer_fire_due

    timer_fire_due(now=timezone.now())
    customer_suppress(customer=invoice.customer, reason="asked us to stop", actor="carol")
    settle(TENANT)
    job = Job.objects.get(key="invoice-reminder-INV-1")
    assert job.result["sent"] is False and job.result["reason"] == "ada@example.com suppressed reminders (asked us to stop)"
    assert sim.messages() == []


def test_a_reminded_invoice_is_not_reminded_again_after_retention_deleted_its_job(sim):
    from company.agent import agent_propose
    from company.services import invoice_reminder_plan
    from jobs.retention import retention_sweep

    invoice = overdue_invoice("INV-1", "ada@example.com")
    planned(invoice)
    settle(TENANT)
    assert len(sim.messages()) == 1
    invoice.refresh_from_db()
    assert invoice.reminded_at is not None

    report = retention_sweep(now=timezone.now() + timedelta(days=31), retention_days=30, redact_after_days=30)
    assert report.deleted
    assert not Job.objects.filter(key="invoice-reminder-INV-1").exists()

    # The next daily plan, and the agent's rules, read the invoice: reminded.
    assert invoice_reminder_plan(invoice=invoice) is None
    assert "invoice-reminder-INV-1" not in agent_propose(tenant=invoice.tenant, now=timezone.now())
    settle(TENANT)
    assert len(sim.messages()) == 1
