"""The company's actions, timer subjects and outbox consumers.

The quote loop: `quote_approve` emits `quote.approved` → its consumer enqueues
`send-quote-<number>` → `company.send_quote` sends the email through the
operation protocol (once), marks the quote SENT and waits — without a process —
for the customer's reply or the follow-up timer, whichever comes first. A
reply accepts or declines the quote; the timer proposes a follow-up that a
reviewer decides on.

Invoice reminders: a timer per open invoice (`invoice_reminder_plan`), which
re-reads the invoice when it comes due (paid or suppressed → cancelled with
the reason; a new due date or terms → re-planned); `company.send_invoice_reminder`
re-reads it once more and sends the reminder rendered from the record as it
is then.

Every action asks the operation protocol what the provider holds of its step
(`operation_settle`) before it re-checks the business record: a reminder the
provider accepted before the invoice was paid is reported sent, not "not sent
because paid", and its operation is never left in doubt.
"""

from datetime import datetime

from django.conf import settings
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field

from jobs.actions import JobContext, Wait, action
from jobs.errors import PermanentError
from jobs.outbox import outbox_consumer
from jobs.retry import RetryPolicy
from jobs.selectors import wake_detail
from jobs.timers import SubjectState, register_subject, timer_condition, timer_schedule, waiting_jobs_resume
from operations.models import Receipt
from operations.handlers import ProviderChoice
from operations.protocol import operation_perform, operation_settle
from operations.selectors import operation_for_step

from .agent import agent_propose
from .emails import invoice_reminder_email, quote_email, quote_follow_up_email
from .models import Invoice, Quote, Tenant
from .previews import send_invoice_reminder_preview, send_quote_follow_up_preview, send_quote_preview
from .review import quote_send_enqueue
from .names import (
    AGENT_RUN,
    INVOICE,
    INVOICE_NOT_TO_REMIND,
    PLAN_INVOICE_REMINDERS,
    QUOTE,
    QUOTE_ANSWERED,
    SEND_INVOICE_REMINDER,
    SEND_QUOTE,
    SEND_QUOTE_FOLLOW_UP,
    quote_follow_up_key,
)
from .services import (
    QuoteStateError,
    invoice_not_to_remind,
    invoice_reminder_at,
    invoice_mark_reminded,
    invoice_reminder_plan,
    proposal_submit,
    quote_accept,
    quote_decline,
    quote_mark_followed_up,
    quote_mark_sent,
    tenant_policy,
)

# The same policy as connectors.send_email: an UNKNOWN outcome is reconciled
# at once, an outage reaches an operator within minutes.
EMAIL_RETRY = RetryPolicy(initial_interval=0.5, max_interval=30.0, max_attempts=8)

QS = Quote.Status
# The customer's address is personal data: a viewer reads these jobs'
# previews and requests without it (review.masking).
SENSITIVE = ("to",)


class RecordEmailPayload(BaseModel):
    """An email rendered from the record the job's subject names (a quote or
    an invoice) when it is sent; the payload only chooses the provider."""

    model_config = ConfigDict(extra="forbid", strict=True, title="Email rendered from the record")

    provider: ProviderChoice = Field(None, title="Provider",
                                 description="The email provider (default: the deployment's).")


def reply_provider() -> str:
    """The inbound provider whose signed events carry customers' replies
    (contract C2: only its events may end a quote's wait)."""
    return getattr(settings, "COMPANY_REPLY_PROVIDER", "mailer")


def _send_once(ctx: JobContext, *, step: str, render) -> Receipt:
    """Send one email of this job step through the operation protocol.

    A retry of the step sends (or reconciles) exactly what the first attempt
    recorded — the stored request and provider — so a record that changed in
    between cannot turn into a `DigestMismatch` or a second, different email.
    """
    recorded = operation_for_step(job=ctx.job, step=step)
    if recorded is not None:
        provider, request = recorded.provider, recorded.request
    else:
        provider = ctx.payload.get("provider") or getattr(settings, "OPERATIONS_DEFAULT_EMAIL_PROVIDER",
                                                          "sim-idempotent")
        request = render()
    return operation_perform(ctx, step=step, provider=provider, request=request)


def _held(receipt: Receipt) -> dict:
    """What a job's result says about an email the provider holds."""
    return {"provider_reference": receipt.provider_reference, "receipt": receipt.how}


def _apply_reply(quote: Quote, wake: dict) -> dict:
    data = wake.get("data") or {}
    decision = str(data.get("decision", "")).strip().lower()
    who = f"customer via {wake.get('provider', 'inbound')} event {wake.get('event_id', '')}".strip()
    answer = {"accept": quote_accept, "accepted": quote_accept, "yes": quote_accept,
              "decline": quote_decline, "declined": quote_decline, "no": quote_decline}.get(decision)
    if answer is None:
        # A person reads a reply the machine cannot classify.
        raise PermanentError(f"the customer's reply to quote {quote.number} says neither accept nor decline: {data!r}")
    try:
        quote = answer(quote=quote, actor=who)
    except QuoteStateError as exc:
        # Answered otherwise meanwhile (in the office): a person reconciles the two.
        raise PermanentError(f"the customer's reply ({decision}) cannot be applied: {exc}") from exc
    return {"quote": quote.number, "status": quote.status, "answered_by": who}


def _quote_of(ctx: JobContext) -> Quote:
    quote = (Quote.objects.select_related("customer", "tenant")
             .filter(tenant__slug=ctx.tenant, pk=ctx.job.subject_id).first())
    if quote is None:
        raise PermanentError(f"job {ctx.key} names quote {ctx.job.subject_id!r}, which does not exist")
    return quote


def _record_email_search(render, model):
    """The console's search texts of an email rendered from its record
    (`@action(searchable=…)`): the recipient and the subject as they would
    be sent now (the record at the time the job is created or corrected)."""

    def texts(job) -> list[str]:
        record = (model.objects.select_related("customer").filter(tenant__slug=job.tenant, pk=job.subject_id)
                  .first() if str(job.subject_id or "").isdigit() else None)
        if record is None:
            return []
        email = render(record)
        return [email["to"], email["subject"]]

    return texts


# ---------------------------------------------------------------- the quote loop


@action(SEND_QUOTE, retry=EMAIL_RETRY, timeout=300, schema=RecordEmailPayload,
        preview=send_quote_preview, sensitive=SENSITIVE,
        searchable=_record_email_search(quote_email, Quote),
        description=f"Send an approved quote to its customer (once), then wait for the reply. Subject: "
                    f"{{\"type\": \"{QUOTE}\", \"id\": <quote id>}}.")
def send_quote(ctx: JobContext):
    """Send an approved quote once, then wait for the reply or the follow-up
    timer; a reply accepts/declines, the timer proposes a follow-up."""
    quote = _quote_of(ctx)
    sent = operation_settle(ctx, step="send")
    if quote.status in (QS.ACCEPTED, QS.DECLINED, QS.EXPIRED):
        return {"quote": quote.number, "status": quote.status, "email_sent": sent is not None,
                **(_held(sent) if sent else {})}
    if quote.status in (QS.DRAFT, QS.PENDING_APPROVAL):
        held = f"; its email was already accepted as {sent.provider_reference}" if sent else ""
        raise PermanentError(f"quote {quote.number} is {quote.status}: only an approved quote is sent{held}")
    if quote.status == QS.APPROVED:
        receipt = sent or _send_once(ctx, step="send", render=lambda: quote_email(quote))
        quote = quote_mark_sent(quote=quote, actor=f"{ctx.worker_id} (receipt {receipt.provider_reference})")
    wake = wake_detail(ctx.job)
    if wake and "inbound_event" in wake:
        return _apply_reply(quote, wake)
    if wake and "timer" in wake:
        submitted = proposal_submit(
            tenant=quote.tenant, proposed_by="timer:quote-follow-up", action=SEND_QUOTE_FOLLOW_UP,
            job_key=quote_follow_up_key(quote.number),
            rationale=f"no reply to quote {quote.number} since it was sent on {quote.sent_at:%Y-%m-%d %H:%M} UTC",
            subject_type=QUOTE, subject_id=quote.pk, subject_version=quote.version,
        )
        return {"quote": quote.number, "status": quote.status, "follow_up": submitted.job.key}
    follow_up_at = (quote.sent_at or timezone.now()) + tenant_policy(quote.tenant).quote_follow_up_after
    # Under the fence: the timer belongs to the wait returned below and is
    # cancelled if the job moves on without it.
    with ctx.under_fence():
        timer_schedule(job=ctx.job, job_epoch=ctx.epoch, scheduled_for=follow_up_at, reason="quote follow-up",
                       subject_type=QUOTE, subject_id=quote.pk, subject_version=quote.version,
                       cancellation_condition=QUOTE_ANSWERED)
    return Wait.external(f"customer's reply to quote {quote.number}, or the follow-up at "
                         f"{follow_up_at:%Y-%m-%d %H:%M:%S} UTC", provider=reply_provider())


@action(SEND_QUOTE_FOLLOW_UP, retry=EMAIL_RETRY, timeout=300, schema=RecordEmailPayload,
        preview=send_quote_follow_up_preview, sensitive=SENSITIVE,
        searchable=_record_email_search(quote_follow_up_email, Quote),
        description=f"Follow up a sent quote that has no reply (once). Subject: "
                    f"{{\"type\": \"{QUOTE}\", \"id\": <quote id>}}.")
def send_quote_follow_up(ctx: JobContext):
    """A reviewer approved following up: send the follow-up once (only while
    the quote is still unanswered), then wait for the customer's reply."""
    quote = _quote_of(ctx)
    sent = operation_settle(ctx, step="follow-up")
    wake = wake_detail(ctx.job)
    if wake and "inbound_event" in wake:
        return _apply_reply(quote, wake)
    if sent is not None:
        quote_mark_followed_up(quote=quote)
    if quote.status != QS.SENT:
        return {"quote": quote.number, "status": quote.status, "follow_up_sent": sent is not None,
                **(_held(sent) if sent else {})}
    if sent is None:
        if quote.followed_up_at is not None:
            # Followed up by an earlier job of this key (since deleted by retention).
            return {"quote": quote.number, "status": quote.status, "follow_up_sent": False,
                    "reason": f"quote {quote.number} was already followed up on {quote.followed_up_at:%Y-%m-%d}"}
        _send_once(ctx, step="follow-up", render=lambda: quote_follow_up_email(quote))
        quote_mark_followed_up(quote=quote)
    return Wait.external(f"customer's reply to the follow-up on quote {quote.number}", provider=reply_provider())


def load_quote(*, tenant: str, subject_id: str) -> SubjectState | None:
    quote = Quote.objects.filter(tenant__slug=tenant, pk=subject_id).first()
    if quote is None:
        return None
    return SubjectState(quote.version, {"number": quote.number, "status": quote.status})


@timer_condition(QUOTE_ANSWERED)
def quote_answered(subject: SubjectState, **args) -> bool | str:
    """Cancels a follow-up once the quote is accepted or declined (or expired)."""
    status = subject.context["status"]
    if status in (QS.ACCEPTED, QS.DECLINED, QS.EXPIRED):
        return f"quote {subject.context['number']} was {status.lower()}"
    return False


register_subject(QUOTE, loader=load_quote)


@outbox_consumer("quote.approved")
def enqueue_quote_email(event) -> None:
    """One `send-quote-<number>` job per approved quote, however often the
    event is delivered (enqueue is idempotent per key), held for review
    when the email's policy needs more approvals than the quote's
    (`company.review.quote_send_enqueue`)."""
    quote_send_enqueue(tenant=event.tenant, number=event.payload["number"], quote_id=event.aggregate_id,
                       version=event.payload["version"], approver=event.payload.get("actor", ""),
                       actor=f"outbox:{event.id}")


@outbox_consumer("quote.accepted")
@outbox_consumer("quote.declined")
@outbox_consumer("quote.expired")
def settle_quote_waits(event) -> None:
    """A quote answered another way (in the office, by a colleague): the jobs
    still waiting for its reply are resumed — they see the answer and finish —
    and their follow-up timers cancelled, in one transaction per job."""
    waiting_jobs_resume(tenant=event.tenant, subject_type=QUOTE, subject_id=event.aggregate_id,
                        reason=f"quote {event.payload['number']} was {event.payload['status'].lower()}",
                        actor=f"outbox:{event.id}", detail={"quote_status": event.payload["status"]},
                        timer_reason=f"quote {event.payload['number']} was answered")


@outbox_consumer("quote.created")
@outbox_consumer("quote.submitted")
@outbox_consumer("quote.sent")
@outbox_consumer("customer.suppressed")
def acknowledge(event) -> None:
    """Published for subscribers outside this project (a CRM sync, an
    analytics feed); nothing in it reacts, and an event type without any
    consumer would be quarantined as a typo."""


# ---------------------------------------------------------------- invoice reminders


def load_invoice(*, tenant: str, subject_id: str) -> SubjectState | None:
    invoice = Invoice.objects.select_related("customer", "tenant").filter(tenant__slug=tenant, pk=subject_id).first()
    if invoice is None:
        return None
    return SubjectState(invoice.version, {
        "number": invoice.number, "balance": str(invoice.balance), "due_date": invoice.due_date.isoformat(),
        "terms": invoice.terms, "not_to_remind": invoice_not_to_remind(invoice),
        "reminder_at": invoice_reminder_at(invoice).isoformat(),
    })


def plan_invoice_reminder(*, timer, subject: SubjectState) -> datetime | None:
    """Re-plan from the record as it is now: the reminder follows the due date."""
    return datetime.fromisoformat(subject.context["reminder_at"])


@timer_condition(INVOICE_NOT_TO_REMIND)
def invoice_paid_or_suppressed(subject: SubjectState, **args) -> bool | str:
    return subject.context["not_to_remind"] or False


register_subject(INVOICE, loader=load_invoice, planner=plan_invoice_reminder)


@outbox_consumer("invoice.issued")
@outbox_consumer("invoice.payment_recorded")
@outbox_consumer("invoice.terms_changed")
def plan_reminder_on_change(event) -> None:
    invoice = Invoice.objects.filter(tenant__slug=event.tenant, pk=event.aggregate_id).first()
    if invoice is not None:
        invoice_reminder_plan(invoice=invoice)


@action(SEND_INVOICE_REMINDER, retry=EMAIL_RETRY, timeout=300, schema=RecordEmailPayload,
        preview=send_invoice_reminder_preview, sensitive=SENSITIVE,
        searchable=_record_email_search(invoice_reminder_email, Invoice),
        description=f"Remind the customer of an open invoice (once; not if paid or suppressed). Subject: "
                    f"{{\"type\": \"{INVOICE}\", \"id\": <invoice id>}}.")
def send_invoice_reminder(ctx: JobContext):
    """Re-read the invoice and its customer, then remind once — or say why not.

    The reminder's text is rendered from the record now, not from the time it
    was planned. An invoice changed since the job was created whose reminder
    date is now in the future waits for that date (a timer on this job
    re-reads the invoice again then).
    """
    sent = operation_settle(ctx, step="reminder")
    invoice = (Invoice.objects.select_related("customer", "tenant")
               .filter(tenant__slug=ctx.tenant, pk=ctx.job.subject_id).first())
    gone = f"invoice {ctx.job.subject_id} no longer exists"
    why_not = invoice_not_to_remind(invoice) if invoice is not None else gone
    number = {"invoice": invoice.number} if invoice is not None else {}
    if sent is not None:
        # The provider holds it (accepted before the record changed, say):
        # that is the outcome, whatever the record says now.
        if invoice is not None:
            invoice_mark_reminded(invoice=invoice, provider_reference=sent.provider_reference)
        return {**number, "sent": True, **_held(sent), **({"no_longer_due": why_not} if why_not else {})}
    if why_not:
        return {**number, "sent": False, "reason": why_not}
    remind_at = invoice_reminder_at(invoice)
    started = operation_for_step(job=ctx.job, step="reminder") is not None
    # Only a change since the job was created moves it: a reviewer who
    # approved an early reminder (the agent's proposal) meant "send it now".
    changed = ctx.job.subject_version is not None and ctx.job.subject_version != invoice.version
    if changed and not started and remind_at > timezone.now():
        with ctx.under_fence():
            timer_schedule(job=ctx.job, job_epoch=ctx.epoch, scheduled_for=remind_at,
                           reason=f"invoice {invoice.number} reminder (re-planned)", subject_type=INVOICE,
                           subject_id=invoice.pk, subject_version=invoice.version)
        return Wait.external(f"invoice {invoice.number} reminder re-planned for {remind_at:%Y-%m-%d %H:%M} UTC")
    receipt = _send_once(ctx, step="reminder", render=lambda: invoice_reminder_email(invoice))
    invoice_mark_reminded(invoice=invoice, provider_reference=receipt.provider_reference)
    return {"invoice": invoice.number, "sent": True, "version": invoice.version, **_held(receipt)}


@action(PLAN_INVOICE_REMINDERS)
def plan_invoice_reminders(ctx: JobContext):
    """Contract C6: the daily calendar's job (`invoice-reminder-plan-<date>`)
    makes sure each open invoice of the tenant has its reminder timer."""
    planned = 0
    open_invoices = Invoice.objects.filter(tenant__slug=ctx.tenant, balance__gt=0).order_by("pk")
    for invoice in open_invoices.iterator():
        planned += invoice_reminder_plan(invoice=invoice) is not None
    return {"date": ctx.payload.get("date"), "planned": planned}


# ---------------------------------------------------------------- the agent


@action(AGENT_RUN)
def agent_run(ctx: JobContext):
    """The rules agent of a tenant, as a job of its own: it proposes, the
    engine and the reviewers decide (see `company.agent`)."""
    tenant = Tenant.objects.filter(slug=ctx.tenant).first()
    if tenant is None:
        raise PermanentError(f"no tenant {ctx.tenant!r}")
    proposed = agent_propose(tenant=tenant, now=timezone.now())
    return {"proposed": proposed, "new": len(proposed)}

