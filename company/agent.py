"""A deterministic agent: rules over the records, no model call.

It only proposes (`proposal_submit`); whether a proposal runs at once or
waits for a reviewer is the tenant's policy, decided by the engine's side.
Each proposal carries a business key (`send-quote-<n>`, `quote-follow-up-<n>`,
`invoice-reminder-<n>`) that the system's own triggers use too, so running
the agent twice — or after the outbox or a timer already created the work —
proposes nothing new.

A real model could be added as one more rule with the same shape (read the
records, return proposals); every rule here is plain code so the whole loop
runs and is tested without one.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from .models import Invoice, Quote, Tenant
from .names import (
    INVOICE,
    QUOTE,
    SEND_INVOICE_REMINDER,
    SEND_QUOTE,
    SEND_QUOTE_FOLLOW_UP,
    invoice_reminder_key,
    quote_follow_up_key,
    quote_send_key,
)
from .services import proposal_submit, tenant_policy

PROPOSER = "agent:rules"


@dataclass(frozen=True)
class Idea:
    action: str
    job_key: str
    rationale: str
    subject_type: str
    subject_id: int
    subject_version: int


def approved_quotes_not_sent(tenant: Tenant, now: datetime) -> Iterator[Idea]:
    for quote in Quote.objects.filter(tenant=tenant, status=Quote.Status.APPROVED).select_related("customer"):
        yield Idea(SEND_QUOTE, quote_send_key(quote.number),
                   f"quote {quote.number} ({quote.amount}) was approved by {quote.approved_by or 'someone'} "
                   f"and has not been sent to {quote.customer.email}", QUOTE, quote.pk, quote.version)


def sent_quotes_without_reply(tenant: Tenant, now: datetime) -> Iterator[Idea]:
    cutoff = now - tenant_policy(tenant).quote_follow_up_after
    for quote in Quote.objects.filter(tenant=tenant, status=Quote.Status.SENT, sent_at__lte=cutoff,
                                        followed_up_at__isnull=True):
        yield Idea(SEND_QUOTE_FOLLOW_UP, quote_follow_up_key(quote.number),
                   f"quote {quote.number} was sent on {quote.sent_at:%Y-%m-%d} and the customer has not replied",
                   QUOTE, quote.pk, quote.version)


def overdue_invoices(tenant: Tenant, now: datetime) -> Iterator[Idea]:
    # What invoice_not_to_remind says, as a query: open, not suppressed, not reminded yet.
    overdue = (Invoice.objects.filter(tenant=tenant, balance__gt=0, due_date__lt=now.date(),
                                      customer__suppressed=False, reminded_at__isnull=True)
               .select_related("customer"))
    for invoice in overdue:
        yield Idea(SEND_INVOICE_REMINDER, invoice_reminder_key(invoice.number),
                   f"invoice {invoice.number} was due on {invoice.due_date.isoformat()} and {invoice.balance} is "
                   f"still open", INVOICE, invoice.pk, invoice.version)


RULES: list[Callable[[Tenant, datetime], Iterator[Idea]]] = [
    approved_quotes_not_sent,
    sent_quotes_without_reply,
    overdue_invoices,
]


def agent_propose(*, tenant: Tenant, now: datetime) -> list[str]:
    """Run every rule for `tenant` and submit what they suggest; returns the
    job keys of the proposals that are new (a key that exists is skipped)."""
    proposed = []
    for rule in RULES:
        for idea in rule(tenant, now):
            submitted = proposal_submit(
                tenant=tenant, proposed_by=PROPOSER, action=idea.action, job_key=idea.job_key,
                rationale=idea.rationale, subject_type=idea.subject_type, subject_id=idea.subject_id,
                subject_version=idea.subject_version,
            )
            if submitted.created:
                proposed.append(idea.job_key)
    return proposed
