"""What approving one of the company's email jobs will send, rendered now
from the quote or invoice it is about — by the same functions, and after the
same checks, as the handlers in `handlers.py` use when they send it."""

from jobs.actions import Preview
from operations.previews import recorded_or_rendered
from operations.selectors import operation_for_step

from .emails import invoice_reminder_email, quote_email, quote_follow_up_email
from .models import Invoice, Quote
from .services import invoice_not_to_remind

QS = Quote.Status


def _email(job, *, step: str, record: str, refusal: str, render) -> Preview:
    """The step's email — the recorded request once its intent exists (that
    is what the handler settles, whatever the record says now), else
    nothing when the handler would refuse to send (`refusal`), else the
    email rendered from the record now."""
    if refusal and operation_for_step(job=job, step=step) is None:
        return Preview(summary=f"Sends nothing: {refusal}.")
    return recorded_or_rendered(
        job, step=step, render=render,
        rendered_note=f"Rendered now from {record}. It is rendered again from the record when it is sent, so a "
                      f"change to {record} before then changes the email; to change the email, change {record}.")


def _quote(job) -> Quote | None:
    return Quote.objects.select_related("customer").filter(tenant__slug=job.tenant, pk=job.subject_id).first()


def send_quote_preview(job) -> Preview:
    """`handlers.send_quote`: an approved quote's email, once."""
    quote = _quote(job)
    if quote is None:
        refusal = f"quote {job.subject_id!r} does not exist"
    elif quote.status in (QS.DRAFT, QS.PENDING_APPROVAL):
        refusal = f"quote {quote.number} is {quote.status} (only an approved quote is sent; the job fails)"
    elif quote.status != QS.APPROVED:
        refusal = f"quote {quote.number} is {quote.status}"
    else:
        refusal = ""
    return _email(job, step="send", record=f"quote {getattr(quote, 'number', job.subject_id)}", refusal=refusal,
                  render=lambda: quote_email(quote))


def send_quote_follow_up_preview(job) -> Preview:
    """`handlers.send_quote_follow_up`: sent only while the quote is unanswered."""
    quote = _quote(job)
    if quote is None:
        refusal = f"quote {job.subject_id!r} does not exist"
    elif quote.status != QS.SENT:
        refusal = f"quote {quote.number} is {quote.status}, no longer waiting for a reply"
    else:
        refusal = ""
    return _email(job, step="follow-up", record=f"quote {getattr(quote, 'number', job.subject_id)}",
                  refusal=refusal, render=lambda: quote_follow_up_email(quote))


def send_invoice_reminder_preview(job) -> Preview:
    """`handlers.send_invoice_reminder`: not if the invoice is paid or its customer suppressed."""
    invoice = (Invoice.objects.select_related("customer")
               .filter(tenant__slug=job.tenant, pk=job.subject_id).first())
    refusal = invoice_not_to_remind(invoice) if invoice is not None else \
        f"invoice {job.subject_id!r} no longer exists"
    return _email(job, step="reminder", record=f"invoice {getattr(invoice, 'number', job.subject_id)}",
                  refusal=refusal, render=lambda: invoice_reminder_email(invoice))
