"""The company's emails, rendered from the record as it is when they are
sent: `{"to", "subject", "body"}`, the request an email connector takes."""

from .models import Invoice, Quote

__all__ = ["quote_email", "quote_follow_up_email", "invoice_reminder_email"]

def quote_email(quote: Quote) -> dict:
    return {"to": quote.customer.email, "subject": f"Your quote {quote.number}",
            "body": f"Dear {quote.customer.name},\n\nplease find quote {quote.number} for {quote.amount} attached. "
                    "Reply 'accept' or 'decline'."}


def quote_follow_up_email(quote: Quote) -> dict:
    return {"to": quote.customer.email, "subject": f"Following up on quote {quote.number}",
            "body": f"Dear {quote.customer.name},\n\nwe have not heard from you about quote {quote.number} "
                    f"({quote.amount}). Reply 'accept' or 'decline'."}


def invoice_reminder_email(invoice: Invoice) -> dict:
    return {"to": invoice.customer.email, "subject": f"Reminder: invoice {invoice.number}",
            "body": f"Dear {invoice.customer.name},\n\ninvoice {invoice.number} was due on "
                    f"{invoice.due_date.isoformat()} ({invoice.terms}); {invoice.balance} is still open."}
