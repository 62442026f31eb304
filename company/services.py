"""Every change to the business goes through one of these services.

Each is one transaction: the record changes and its outbox event
(`jobs.outbox.outbox_emit`) commit together, so what reacts to a change (a
quote email, a reminder plan) can neither miss it nor see one that rolled
back. Quote and invoice rows are locked (`select_for_update`) for the change,
which also serialises the emitters of one aggregate's events.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as clock_time
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.models import Timer
from jobs.outbox import outbox_emit
from jobs.selectors import job_by_key, timers_pending_for_subject
from jobs.store import Store
from jobs.timers import timer_schedule

from .models import Customer, Invoice, Proposal, Quote, Tenant, TenantPolicy
from .names import INVOICE, INVOICE_NOT_TO_REMIND, QUOTE, SEND_INVOICE_REMINDER, invoice_reminder_key


QS = Quote.Status


class QuoteStateError(ValueError):
    """The quote is not in a status that allows this change."""


class QuoteNumberTaken(QuoteStateError):
    """The tenant already has a quote of that number (perhaps created a moment ago by another process)."""


class InvoiceError(ValueError):
    """The invoice change is not possible (a negative payment, an unknown invoice)."""


class InvoiceNumberTaken(InvoiceError):
    """The tenant already has an invoice of that number (perhaps issued a moment ago by another process)."""


# ---------------------------------------------------------------- tenants and customers


@transaction.atomic
def tenant_ensure(*, slug: str, name: str = "") -> Tenant:
    """The tenant `slug`, created with its default policy when missing."""
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    TenantPolicy.objects.get_or_create(tenant=tenant)
    return tenant


def tenant_policy(tenant: Tenant) -> TenantPolicy:
    policy = TenantPolicy.objects.filter(tenant=tenant).first()
    return policy or TenantPolicy(tenant=tenant)


_UNCHANGED = object()


@transaction.atomic
def tenant_policy_set(*, tenant: Tenant, runs_without_review: list[str] | None = None,
                      quote_follow_up_after=None, invoice_reminder_after=None,
                      review_digest_every=_UNCHANGED) -> TenantPolicy:
    """Change what runs without review and the business delays of a tenant
    (`review_digest_every=None` turns the reviewers' digest off)."""
    policy, _ = TenantPolicy.objects.select_for_update().get_or_create(tenant=tenant)
    if runs_without_review is not None:
        policy.runs_without_review = sorted(set(runs_without_review))
    if quote_follow_up_after is not None:
        policy.quote_follow_up_after = quote_follow_up_after
    if invoice_reminder_after is not None:
        policy.invoice_reminder_after = invoice_reminder_after
    if review_digest_every is not _UNCHANGED:
        if review_digest_every is not None and review_digest_every <= timedelta(0):
            raise ValueError(f"review_digest_every must be a positive period, not {review_digest_every}")
        policy.review_digest_every = review_digest_every
    policy.save()
    return policy


@transaction.atomic
def customer_ensure(*, tenant: Tenant, email: str, name: str) -> Customer:
    """The tenant's customer with this email, created when missing (never changed)."""
    customer, _ = Customer.objects.get_or_create(tenant=tenant, email=email, defaults={"name": name})
    return customer


@transaction.atomic
def customer_suppress(*, customer: Customer, reason: str, actor: str) -> Customer:
    """The customer asked not to be chased: no reminder goes out to them from
    now on (reminder timers re-read this when they fire)."""
    customer = Customer.objects.select_for_update().get(pk=customer.pk)
    customer.suppressed = True
    customer.suppressed_reason = reason[:300]
    customer.save(update_fields=["suppressed", "suppressed_reason"])
    outbox_emit(tenant=customer.tenant.slug, aggregate_type="company.customer", aggregate_id=customer.pk,
                event_type="customer.suppressed", payload={"reason": reason, "actor": actor})
    return customer


# ---------------------------------------------------------------- quotes


def _locked_quote(quote: Quote) -> Quote:
    return Quote.objects.select_for_update().select_related("tenant", "customer").get(pk=quote.pk)


def _quote_change(quote: Quote, *, to: str, allowed: set, event_type: str, actor: str, **fields) -> Quote:
    """Move a locked quote to `to` (bumping its version) and emit its event."""
    if quote.status not in allowed:
        raise QuoteStateError(
            f"quote {quote.number} is {quote.status}; {event_type} needs one of {', '.join(sorted(allowed))}"
        )
    quote.status = to
    quote.version += 1
    for name, value in fields.items():
        setattr(quote, name, value)
    quote.save()
    outbox_emit(tenant=quote.tenant.slug, aggregate_type=QUOTE, aggregate_id=quote.pk, event_type=event_type,
                payload={"number": quote.number, "status": quote.status, "version": quote.version, "actor": actor})
    return quote


@transaction.atomic
def quote_create(*, tenant: Tenant, number: str, customer: Customer, amount: Decimal) -> Quote:
    """A DRAFT quote. Raises `QuoteNumberTaken` when the number is taken —
    also by another process between the check and the insert."""
    taken = QuoteNumberTaken(f"quote {number} already exists for {tenant.slug}")
    if Quote.objects.filter(tenant=tenant, number=number).exists():
        raise taken
    try:
        with transaction.atomic():
            quote = Quote.objects.create(tenant=tenant, number=number, customer=customer, amount=amount)
    except IntegrityError:
        raise taken from None
    outbox_emit(tenant=tenant.slug, aggregate_type=QUOTE, aggregate_id=quote.pk, event_type="quote.created",
                payload={"number": number, "status": quote.status, "version": quote.version})
    return quote


@transaction.atomic
def quote_submit(*, quote: Quote, actor: str) -> Quote:
    """DRAFT → PENDING_APPROVAL."""
    return _quote_change(_locked_quote(quote), to=QS.PENDING_APPROVAL, allowed={QS.DRAFT},
                         event_type="quote.submitted", actor=actor)


@transaction.atomic(durable=True)  # a human decision: never nested in another transaction
def quote_approve(*, quote: Quote, actor: str) -> Quote:
    """DRAFT or PENDING_APPROVAL → APPROVED, with the `quote.approved` event
    whose consumer enqueues `send-quote-<number>` (the email goes out once,
    however often the event is delivered). Raises `QuoteStateError`.

    For a script or a command acting as `actor`; a person in the admin
    approves through `company.review.quote_approve_by` (permission, role,
    tenant, admin history)."""
    return quote_approve_locked(quote=quote, actor=actor)


def quote_approve_locked(*, quote: Quote, actor: str) -> Quote:
    """`quote_approve` inside the caller's transaction (the decision's)."""
    return _quote_change(_locked_quote(quote), to=QS.APPROVED, allowed={QS.DRAFT, QS.PENDING_APPROVAL},
                         event_type="quote.approved", actor=actor, approved_by=actor)


@transaction.atomic
def quote_mark_sent(*, quote: Quote, actor: str) -> Quote:
    """APPROVED → SENT once the provider accepted the email; idempotent for a
    quote already SENT (a retried job marks it again harmlessly)."""
    quote = _locked_quote(quote)
    if quote.status == QS.SENT:
        return quote
    return _quote_change(quote, to=QS.SENT, allowed={QS.APPROVED}, event_type="quote.sent", actor=actor,
                         sent_at=timezone.now())


@transaction.atomic
def quote_mark_followed_up(*, quote: Quote) -> Quote:
    """Record on the quote that the provider accepted its follow-up email
    (read by every later rule instead of the follow-up job, which retention
    deletes); idempotent, the first kept."""
    quote = _locked_quote(quote)
    if quote.followed_up_at is None:
        quote.followed_up_at = timezone.now()
        quote.save(update_fields=["followed_up_at", "updated_at"])
    return quote


def _quote_answer(quote: Quote, *, to: str, event_type: str, actor: str) -> Quote:
    quote = _locked_quote(quote)
    if quote.status == to:
        return quote  # the same answer delivered twice
    return _quote_change(quote, to=to, allowed={QS.SENT}, event_type=event_type, actor=actor,
                         answered_at=timezone.now())


@transaction.atomic
def quote_accept(*, quote: Quote, actor: str) -> Quote:
    """SENT → ACCEPTED (the customer said yes). Idempotent; raises
    `QuoteStateError` for a quote that was not sent or was answered otherwise."""
    return _quote_answer(quote, to=QS.ACCEPTED, event_type="quote.accepted", actor=actor)


@transaction.atomic
def quote_decline(*, quote: Quote, actor: str) -> Quote:
    """SENT → DECLINED. Idempotent; raises `QuoteStateError` otherwise."""
    return _quote_answer(quote, to=QS.DECLINED, event_type="quote.declined", actor=actor)


@transaction.atomic
def quote_expire(*, quote: Quote, actor: str) -> Quote:
    """SENT → EXPIRED (no answer will be taken any more)."""
    return _quote_answer(quote, to=QS.EXPIRED, event_type="quote.expired", actor=actor)


# ---------------------------------------------------------------- invoices


def _invoice_event(invoice: Invoice, event_type: str, actor: str, **extra) -> None:
    outbox_emit(tenant=invoice.tenant.slug, aggregate_type=INVOICE, aggregate_id=invoice.pk, event_type=event_type,
                payload={"number": invoice.number, "version": invoice.version, "balance": str(invoice.balance),
                         "due_date": invoice.due_date.isoformat(), "terms": invoice.terms, "actor": actor, **extra})


def _locked_invoice(invoice: Invoice) -> Invoice:
    return Invoice.objects.select_for_update().select_related("tenant", "customer").get(pk=invoice.pk)


@transaction.atomic
def invoice_issue(*, tenant: Tenant, number: str, customer: Customer, amount: Decimal, due_date, terms: str,
                  actor: str) -> Invoice:
    """A new open invoice; its `invoice.issued` event plans the reminder.
    Raises `InvoiceError` when the amount is not positive and
    `InvoiceNumberTaken` when the number is taken — also by another process
    between the check and the insert."""
    if amount <= 0:
        raise InvoiceError(f"invoice {number}: the amount must be positive, not {amount}")
    taken = InvoiceNumberTaken(f"invoice {number} already exists for {tenant.slug}")
    if Invoice.objects.filter(tenant=tenant, number=number).exists():
        raise taken
    try:
        with transaction.atomic():
            invoice = Invoice.objects.create(tenant=tenant, number=number, customer=customer, amount=amount,
                                             balance=amount, due_date=due_date, terms=terms)
    except IntegrityError:
        raise taken from None
    _invoice_event(invoice, "invoice.issued", actor)
    return invoice


@transaction.atomic
def invoice_record_payment(*, invoice: Invoice, amount: Decimal, actor: str) -> Invoice:
    """Lower the balance (a balance of 0 is paid: no reminder goes out any
    more). Raises `InvoiceError` for a non-positive amount."""
    if amount <= 0:
        raise InvoiceError(f"invoice {invoice.number}: a payment must be positive, not {amount}")
    invoice = _locked_invoice(invoice)
    invoice.balance = max(Decimal("0"), invoice.balance - amount)
    invoice.version += 1
    invoice.save(update_fields=["balance", "version", "updated_at"])
    _invoice_event(invoice, "invoice.payment_recorded", actor, paid=str(amount))
    return invoice


@transaction.atomic
def invoice_change_terms(*, invoice: Invoice, actor: str, due_date=None, terms: str | None = None) -> Invoice:
    """A new due date and/or terms: the reminder is re-planned from the record
    when its timer comes due (the timer sees a newer version)."""
    invoice = _locked_invoice(invoice)
    changed = False
    if due_date is not None and due_date != invoice.due_date:
        invoice.due_date, changed = due_date, True
    if terms is not None and terms != invoice.terms:
        invoice.terms, changed = terms, True
    if not changed:
        return invoice
    invoice.version += 1
    invoice.save(update_fields=["due_date", "terms", "version", "updated_at"])
    _invoice_event(invoice, "invoice.terms_changed", actor)
    return invoice


@transaction.atomic
def invoice_mark_reminded(*, invoice: Invoice, provider_reference: str) -> Invoice:
    """Record on the invoice that the provider accepted its reminder (the
    business fact every later plan reads); idempotent, the first kept."""
    invoice = _locked_invoice(invoice)
    if invoice.reminded_at is None:
        invoice.reminded_at, invoice.reminder_reference = timezone.now(), provider_reference[:200]
        invoice.save(update_fields=["reminded_at", "reminder_reference", "updated_at"])
    return invoice


# ---------------------------------------------------------------- proposals


@dataclass(frozen=True)
class Submitted:
    proposal: Proposal | None  # None: the business key was taken, nothing new was proposed
    job: object  # jobs.models.Job

    @property
    def created(self) -> bool:
        return self.proposal is not None


@transaction.atomic
def proposal_submit(
    *,
    tenant: Tenant,
    proposed_by: str,
    action: str,
    job_key: str,
    rationale: str,
    payload: dict | None = None,
    subject_type: str = "",
    subject_id: str | int = "",
    subject_version: int | None = None,
    key_free: bool = False,
) -> Submitted:
    """Record who proposes what and why, and create its job.

    The engine decides, not the proposer: the job is READY when the tenant's
    policy lets `action` run without review, otherwise WAITING_REVIEW with the
    rationale as its wait reason. The creation event carries the proposal
    (contract C1) so the review page can say "proposed by X — rationale".

    Idempotent by business key, also under concurrency (as `Store.enqueue`
    is): when a job `job_key` already exists — proposed before, proposed by
    another caller at the same moment, or created by the system itself (the
    outbox, a timer), even between this call's read and its insert — nothing
    is recorded and the existing job is returned with `proposal=None`; only
    the caller whose proposal made the job gets `created`. Raises
    `ValueError` for a proposal without a rationale. `key_free`: the caller
    has just read the key free in its transaction, so it is not read again
    (the insert still decides a race, as above).
    """
    if not rationale.strip():
        raise ValueError("a proposal needs a rationale: the reviewer decides on it")
    existing = None if key_free else job_by_key(tenant=tenant.slug, key=job_key)
    if existing is not None:
        return Submitted(None, existing)
    needs_review = action not in tenant_policy(tenant).runs_without_review
    try:
        # A savepoint: the proposal stands only if its job is the one it made.
        with transaction.atomic():
            proposal = Proposal.objects.create(
                tenant=tenant, proposed_by=proposed_by, action=action, job_key=job_key, rationale=rationale,
                payload=payload or {}, subject_type=subject_type, subject_id=str(subject_id or ""),
                subject_version=subject_version, needs_review=needs_review,
            )
            job, created = Store().enqueue_once(
                tenant.slug, job_key, action=action, payload=payload or {}, subject_type=subject_type,
                subject_id=str(subject_id or ""), subject_version=subject_version, actor=proposed_by,
                reason=rationale,
                detail={"proposal": {"id": proposal.pk, "proposed_by": proposed_by, "rationale": rationale,
                                     "subject_type": subject_type, "subject_id": str(subject_id or ""),
                                     "subject_version": subject_version}},
                review=f"proposed by {proposed_by}: {rationale}" if needs_review else None, key_free=True,
            )
            if not created:
                raise _KeyTaken(job)
    except IntegrityError:
        # Another caller's proposal of this key committed first (PostgreSQL
        # made this insert wait for it): its job is the one.
        job = job_by_key(tenant=tenant.slug, key=job_key)
        if job is None:
            raise
        return Submitted(None, job)
    except _KeyTaken as taken:
        # The outbox (or a timer) created the key meanwhile: its job, and no proposal of ours.
        return Submitted(None, taken.job)
    return Submitted(proposal, job)


class _KeyTaken(Exception):
    """Rolls a proposal back to its savepoint: the key's job was made by someone else."""

    def __init__(self, job):
        super().__init__(f"job {job.tenant}/{job.key} exists")
        self.job = job


# ---------------------------------------------------------------- invoice reminders


def invoice_reminder_at(invoice: Invoice) -> datetime:
    """When the invoice is reminded: 09:00 UTC on its due date plus the
    tenant's `invoice_reminder_after`."""
    at_nine = datetime.combine(invoice.due_date, clock_time(9, 0), tzinfo=UTC)
    return at_nine + tenant_policy(invoice.tenant).invoice_reminder_after


def invoice_not_to_remind(invoice: Invoice) -> str:
    """Why no reminder may go out for this invoice now ("" when one may):
    paid, a suppressed customer, or already reminded (read on the invoice,
    never from whether a reminder job exists: retention deletes jobs)."""
    if invoice.is_paid:
        return f"invoice {invoice.number} is paid"
    if invoice.reminded_at is not None:
        return (f"invoice {invoice.number} was already reminded on {invoice.reminded_at:%Y-%m-%d %H:%M} UTC "
                f"({invoice.reminder_reference})")
    if invoice.customer.suppressed:
        reason = invoice.customer.suppressed_reason or "no reason given"
        return f"{invoice.customer.email} suppressed reminders ({reason})"
    return ""


@transaction.atomic
def invoice_reminder_plan(*, invoice: Invoice) -> Timer | None:
    """Make sure an open invoice has its reminder timer; idempotent.

    Nothing is planned for a paid invoice, a suppressed customer, an invoice
    already reminded (`Invoice.reminded_at`), one whose reminder job exists
    (under way, or finished without sending) or one with a pending timer
    (that timer re-plans itself from the record when it comes due). The
    invoice row is locked, so two planners cannot both schedule.
    """
    invoice = Invoice.objects.select_for_update().select_related("customer", "tenant").get(pk=invoice.pk)
    key = invoice_reminder_key(invoice.number)
    if invoice_not_to_remind(invoice) or job_by_key(tenant=invoice.tenant.slug, key=key) is not None:
        return None
    if timers_pending_for_subject(tenant=invoice.tenant.slug, subject_type=INVOICE, subject_id=invoice.pk).exists():
        return None
    return timer_schedule(
        tenant=invoice.tenant.slug, action=SEND_INVOICE_REMINDER, job_key=key,
        scheduled_for=invoice_reminder_at(invoice), reason=f"invoice {invoice.number} reminder",
        subject_type=INVOICE, subject_id=invoice.pk, subject_version=invoice.version,
        cancellation_condition=INVOICE_NOT_TO_REMIND,
    )
