"""Decisions people take on the business records in the admin (DESIGN §14).

Approving a quote sends its email, so it is a decision, not an edit: it
needs the permission `company.approve_quote` and a reviewer's membership in
the quote's tenant (`jobs.access`, decision `approve_quote`, registered in
`apps.py`); a quote of another tenant does not exist for the user. The
change, its outbox event and the admin `LogEntry` commit together.
"""

from django.db import transaction

from jobs import access
from jobs.access import DecisionRefused, decision_logged

from .models import Quote
from .services import quote_approve_locked

# The engine's tenant string is the tenant's slug.
TENANT_FIELD = "tenant__slug"


def quote_approve_by(*, quote_id: int, user) -> Quote:
    """`user` approves the quote (DRAFT or PENDING_APPROVAL → APPROVED; its
    email is then sent by a worker).

    Raises `Http404` for a quote outside the user's tenants (as for a
    missing one), `DecisionRefused` without the permission or the role, and
    `QuoteStateError` for a quote in another status. Nothing is written on
    error."""
    with transaction.atomic(durable=True):  # a human decision: never nested
        quote = access.get_visible_or_404(Quote.objects.select_related("tenant"), user, tenant_field=TENANT_FIELD,
                                          pk=quote_id)
        refused = access.refusal(user, "approve_quote", tenant=quote.tenant.slug)
        if refused:
            raise DecisionRefused(refused)
        quote = quote_approve_locked(quote=quote, actor=user.get_username())
        decision_logged(user=user, obj=quote, message=f"Approved quote {quote.number}: its email is queued")
    return quote
