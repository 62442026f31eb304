"""`manage.py seed_demo`: a tenant with customers, open invoices and approved
quotes, made through the business services so everything flows through the
outbox (DESIGN §10). Idempotent by business keys, also when two runs seed one
tenant at once (each record is made by one of them; both succeed and the end
state is one run's); creates no users."""

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from durable.numbers import whole_flag

from company.models import Invoice, Quote
from company.services import (
    InvoiceNumberTaken,
    QuoteNumberTaken,
    QuoteStateError,
    customer_ensure,
    invoice_issue,
    quote_approve,
    quote_create,
    tenant_ensure,
)

CUSTOMERS = [
    ("ada@example.com", "Ada Lovelace"),
    ("grace@example.com", "Grace Hopper"),
    ("edsger@example.com", "Edsger Dijkstra"),
    ("barbara@example.com", "Barbara Liskov"),
    ("donald@example.com", "Donald Knuth"),
    ("frances@example.com", "Frances Allen"),
]
ACTOR = "seed_demo"


def quote_number(i: int) -> str:
    return f"Q-{i:04d}"


def invoice_number(i: int) -> str:
    return f"INV-{i:04d}"


def refuse_in_production(what: str) -> None:
    """`CommandError` with DURABLE_PRODUCTION=1: demo data (and demo users)
    have no place in production — a seeded quote's email really goes out."""
    if getattr(settings, "PRODUCTION", False):
        raise CommandError(f"{what}; it refuses to run with DURABLE_PRODUCTION=1")


def seed(*, tenant_slug: str, quotes: int, invoices: int) -> dict:
    """Create what is missing; returns how many quotes were approved and
    invoices issued by this call (0 and 0 on a repeated call; what a
    concurrent call made is not counted twice)."""
    tenant = tenant_ensure(slug=tenant_slug, name=tenant_slug.title())
    customers = [customer_ensure(tenant=tenant, email=email, name=name) for email, name in CUSTOMERS]
    today = timezone.now().date()
    issued = approved = 0
    for i in range(1, invoices + 1):
        if not Invoice.objects.filter(tenant=tenant, number=invoice_number(i)).exists():
            try:
                # Overdue by 4, 7, 10 … days: the agent sees each as overdue.
                invoice_issue(tenant=tenant, number=invoice_number(i), customer=customers[(i - 1) % len(customers)],
                              amount=Decimal(250 * i), due_date=today - timedelta(days=3 * i + 1), terms="Net 30",
                              actor=ACTOR)
                issued += 1
            except InvoiceNumberTaken:
                pass  # a concurrent run issued this very invoice
    for i in range(1, quotes + 1):
        quote = Quote.objects.filter(tenant=tenant, number=quote_number(i)).first()
        if quote is None:
            try:
                quote = quote_create(tenant=tenant, number=quote_number(i),
                                     customer=customers[(i - 1) % len(customers)], amount=Decimal(1000 + 100 * i))
            except QuoteNumberTaken:
                quote = Quote.objects.get(tenant=tenant, number=quote_number(i))  # a concurrent run's
        if quote.status in (Quote.Status.DRAFT, Quote.Status.PENDING_APPROVAL):
            try:
                quote_approve(quote=quote, actor=ACTOR)
                approved += 1
            except QuoteStateError:
                quote.refresh_from_db()
                if quote.status in (Quote.Status.DRAFT, Quote.Status.PENDING_APPROVAL):
                    raise
                # Approved by a concurrent run meanwhile: the same end state.
    return {"tenant": tenant, "quotes_approved": approved, "invoices_issued": issued}


class Command(BaseCommand):
    help = ("Create a demo tenant with customers, overdue invoices (their reminders are planned through the "
            "outbox) and N quotes approved through quote_approve (each one's email is enqueued through the "
            "outbox). Idempotent by quote and invoice number; creates no users. Refuses to run with "
            "DURABLE_PRODUCTION=1.")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo", help="Tenant slug (default: demo).")
        parser.add_argument("--quotes", type=whole_flag(0, 9999), default=3,
                            help="Quotes to approve, 0-9999 (default: 3).")
        parser.add_argument("--invoices", type=whole_flag(0, 9999), default=4,
                            help="Open invoices to issue, 0-9999 (default: 4).")

    def handle(self, *args, **opts):
        refuse_in_production("seed_demo creates demo customers, invoices and approved quotes whose emails a worker "
                             "sends")
        try:
            result = seed(tenant_slug=opts["tenant"], quotes=opts["quotes"], invoices=opts["invoices"])
        except QuoteStateError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"tenant {result['tenant'].slug}: approved {result['quotes_approved']} quote(s), "
                          f"issued {result['invoices_issued']} invoice(s)")
