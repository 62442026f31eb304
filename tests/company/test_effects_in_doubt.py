"""An email whose answer was lost (operation UNKNOWN) is reconciled before the
business decides anything: the invoice paid, the customer suppressed or the
quote answered since the first attempt must not turn "the provider may hold
it" into "not sent". Against real simulators over real HTTP, one attempt at a
time as `run_worker` records it."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from company.models import Invoice
from company.services import (
    customer_ensure,
    customer_suppress,
    invoice_issue,
    invoice_record_payment,
    quote_accept,
    tenant_ensure,
)
from jobs import interventions
from jobs.errors import TransientError
from jobs.models import Job
from jobs.outbox import outbox_relay
from jobs.store import Store
from jobs.timers import timer_fire_due
from operations.models import Operation, OperationEvent

from .support import approved_quote, run_one, settle

pytestmark = pytest.mark.django_db
TENANT = "acme"


@pytest.fixture
def aim(settings):
    """Point the connectors at a simulator, with a read timeout short enough
    that an accepted-then-stalled answer is lost."""

    def point(sim, provider: str = "sim-lookup") -> None:
        settings.PROVIDER_URL = sim.url
        settings.PROVIDER_CONNECT_TIMEOUT = 1.0
        settings.PROVIDER_READ_TIMEOUT = 0.3
        settings.OPERATIONS_DEFAULT_EMAIL_PROVIDER = provider
        # The in-flight window a lookup miss must outlast (a stalled request
        # of these tests is over long before the retry looks).
        settings.OPERATIONS_LOOKUP_SETTLE_SECONDS = 0

    return point


def attempt(key: str):
    """One attempt of `key` (a retry's backoff skipped), recorded as the worker does."""
    store = Store()
    Job.objects.filter(tenant=TENANT, key=key, state="READY").update(next_attempt_at=None)
    assert store.claim(TENANT, key, "w1", ttl=60) is not None, f"{key} is not claimable"
    return run_one(store, Job.objects.get(tenant=TENANT, key=key), "w1")


def operation_of(key: str) -> Operation:
    return Operation.objects.get(job__tenant=TENANT, job__key=key)


def reminder_job_for_overdue_invoice() -> Invoice:
    tenant = tenant_ensure(slug=TENANT)
    customer = customer_ensure(tenant=tenant, email="ada@example.com", name="Ada")
    invoice = invoice_issue(tenant=tenant, number="INV-1", customer=customer, amount=Decimal("500.00"),
                            due_date=timezone.now().date() - timedelta(days=5), terms="Net 30", actor="t")
    outbox_relay()  # plans the reminder timer …
    timer_fire_due(now=timezone.now())  # … which is due: the reminder job is enqueued
    return invoice


def paid(invoice: Invoice) -> None:
    invoice_record_payment(invoice=invoice, amount=Decimal("500.00"), actor="bank")


def suppressed(invoice: Invoice) -> None:
    customer_suppress(customer=invoice.customer, reason="disputes the invoice", actor="carol")


@pytest.mark.parametrize("change", [paid, suppressed], ids=["paid", "suppressed"])
def test_a_reminder_accepted_but_unanswered_is_reported_sent_after_the_invoice_changed(start_sim, aim, change):
    stalling = start_sim("lookup", stall_after_accept=3)
    aim(stalling)
    invoice = reminder_job_for_overdue_invoice()
    key = "invoice-reminder-INV-1"

    first = attempt(key)
    assert isinstance(first, TransientError) and operation_of(key).state == "UNKNOWN"
    assert len(stalling.messages()) == 1  # the provider holds it; we do not know

    change(invoice)
    outcome = attempt(key)

    op = operation_of(key)
    [message] = stalling.messages()
    assert (op.state, op.receipt.how, op.receipt.provider_reference) == ("ACCEPTED", "lookup", message["id"])
    job = Job.objects.get(tenant=TENANT, key=key)
    assert job.state == "DONE"
    assert outcome["sent"] is True and outcome["provider_reference"] == message["id"]
    assert outcome["no_longer_due"]  # says why it would not be sent now


def test_a_reminder_the_provider_never_got_is_not_sent_and_its_operation_is_no_longer_in_doubt(start_sim, aim):
    failing = start_sim("lookup", error_rate=1.0, db_name="failing.sqlite3")  # 500: stores nothing
    aim(failing)
    invoice = reminder_job_for_overdue_invoice()
    key = "invoice-reminder-INV-1"
    assert isinstance(attempt(key), TransientError) and operation_of(key).state == "UNKNOWN"

    paid(invoice)
    healthy = start_sim("lookup", db_name="healthy.sqlite3")
    aim(healthy)
    outcome = attempt(key)

    op = operation_of(key)
    assert op.state == "FAILED"  # the provider said (by lookup) it holds nothing
    assert list(OperationEvent.objects.filter(operation=op).values_list("kind", flat=True))[-1] == "lookup_miss"
    assert outcome == {"invoice": "INV-1", "sent": False, "reason": "invoice INV-1 is paid"}
    assert healthy.messages() == [] and failing.messages() == []


def test_a_follow_up_accepted_but_unanswered_is_reported_sent_after_the_quote_was_answered(start_sim, aim):
    healthy = start_sim("lookup", db_name="healthy.sqlite3")
    aim(healthy)
    quote = approved_quote(TENANT, "Q-1", follow_up_after=timedelta(days=7))
    settle(TENANT)  # the quote email goes out; the job waits for the reply or the follow-up
    timer_fire_due(now=timezone.now() + timedelta(days=8))
    settle(TENANT)  # the follow-up is proposed and waits for a reviewer
    follow_up = "quote-follow-up-Q-1"
    interventions.job_approve(tenant=TENANT, key=follow_up, reason="yes, chase them", actor="rita")

    stalling = start_sim("lookup", stall_after_accept=3, db_name="stalling.sqlite3")
    aim(stalling)
    assert isinstance(attempt(follow_up), TransientError) and operation_of(follow_up).state == "UNKNOWN"

    quote_accept(quote=quote, actor="carol, on the phone")  # answered in the office meanwhile
    outcome = attempt(follow_up)

    op = operation_of(follow_up)
    [message] = stalling.messages()
    assert (op.state, op.receipt.provider_reference) == ("ACCEPTED", message["id"])
    assert outcome["follow_up_sent"] is True and outcome["provider_reference"] == message["id"]
    assert outcome["status"] == "ACCEPTED"
