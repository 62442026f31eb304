"""Test-only registrations, imported at start-up in every process (tests,
`run_worker`, `relay_outbox`): the invoice as a timer subject, outbox
consumers and an action that waits for "a reply or a timer"."""

import os
import signal
import time
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time

from django.db import transaction

from jobs.actions import Wait, action
from jobs.outbox import outbox_consumer
from jobs.store import Store
from jobs.timers import SubjectState, register_subject, timer_condition, timer_schedule

from .models import Delivery, Invoice

INVOICE = "testapp.invoice"


def reminder_time(due_date: date, days_after_due: int = 0) -> datetime:
    """Reminders go out at 09:00 UTC, `days_after_due` days after the due date."""
    return datetime.combine(due_date + timedelta(days=days_after_due), clock_time(9, 0), tzinfo=UTC)


def load_invoice(*, tenant: str, subject_id: str) -> SubjectState | None:
    invoice = Invoice.objects.filter(tenant=tenant, pk=subject_id).first()
    if invoice is None:
        return None
    return SubjectState(
        invoice.version,
        {"number": invoice.number, "due_date": invoice.due_date.isoformat(), "paid": invoice.paid,
         "suppressed": invoice.suppressed},
    )


def plan_reminder(*, timer, subject: SubjectState) -> datetime | None:
    """Re-plan from the current record: the reminder follows the due date."""
    return reminder_time(date.fromisoformat(subject.context["due_date"]), timer.payload.get("days_after_due", 0))


register_subject(INVOICE, loader=load_invoice, planner=plan_reminder)


@timer_condition("testapp.invoice_settled")
def invoice_settled(subject: SubjectState, **args) -> bool:
    return subject.context["paid"] or subject.context["suppressed"]


# ---------------------------------------------------------------- outbox consumers


@outbox_consumer("invoice.issued")
def plan_invoice_reminder(event) -> None:
    """The usual consumer: one job per business identity."""
    Delivery.objects.create(event_id=event.id, aggregate_id=event.aggregate_id, sequence=event.sequence,
                            consumer="plan_invoice_reminder")
    Store().enqueue(event.tenant, f"invoice-reminder-plan-{event.aggregate_id}", action="jobs.noop",
                    subject_type=INVOICE, subject_id=event.aggregate_id)
    if event.payload.get("crash_after_publish_on_attempt") == event.attempts:
        # kill -9 right after this consumer's transaction commits and before
        # the relay marks the event published.
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))


@outbox_consumer("testapp.recorded")
def record_delivery(event) -> None:
    """Records each delivery (and the delivering process) for order checks."""
    Delivery.objects.create(event_id=event.id, aggregate_id=event.aggregate_id, sequence=event.sequence,
                            consumer=str(os.getpid()))
    if event.payload.get("sleep"):
        time.sleep(event.payload["sleep"])


@outbox_consumer("testapp.poison")
def reject_poison(event) -> None:
    raise ValueError(f"cannot parse payload {event.payload!r}")


# ---------------------------------------------------------------- an action that waits


@action("testapp.invoice_reminder")
def invoice_reminder(ctx):
    """Wait for the customer's reply or the reminder date, whichever comes
    first; then report what woke it."""
    woken = ctx.job.events.filter(kind="resume").last()
    if woken is None:
        invoice = Invoice.objects.get(pk=ctx.job.subject_id)
        with ctx.under_fence():
            timer_schedule(
                job=ctx.job,
                job_epoch=ctx.epoch,
                scheduled_for=reminder_time(invoice.due_date),
                reason="payment reminder",
                subject_type=INVOICE,
                subject_id=invoice.pk,
                subject_version=invoice.version,
                cancellation_condition="testapp.invoice_settled",
            )
        return Wait.external("customer reply or payment reminder date", provider="sim")
    return {"woken_by": woken.actor, "detail": woken.detail}


@action("test.deferred")
def deferred_until(ctx):
    """Held back (a limit's window, say) until `payload["until"]` (unix
    seconds): it waits, handing its attempt back, then runs."""
    from jobs.errors import Deferred

    until = ctx.payload["until"]
    if time.time() < until:
        raise Deferred(f"a window opens at {until}", wake_at=until)
    return {"ran": True}
