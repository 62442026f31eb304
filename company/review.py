"""Decisions people take on the business records in the admin (DESIGN §14).

Approving a quote sends its email, so it is a decision, not an edit: it
needs the permission `company.approve_quote` and a reviewer's membership in
the quote's tenant (`jobs.access`, decision `approve_quote`, registered in
`apps.py`); a quote of another tenant does not exist for the user. The
change, its outbox event and the admin `LogEntry` commit together.

The review policy of the action a business approval causes covers that
approval: the quote's approver is the first approval of its email
(`company.send_quote`). Under one approval the email goes out at once; under
two, its job waits in the review queue with the quote's approval recorded as
the first, and another reviewer's approval sends it.
"""

from django.db import transaction

from jobs import access
from jobs.access import DecisionRefused, decision_logged
from jobs.models import Job
from jobs.store import Store
from review.decisions import job_approval_given_before

from .models import Quote
from .names import QUOTE, SEND_QUOTE, quote_send_key
from .review_policy import review_terms_of
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


def quote_send_approvals(tenant: str) -> int:
    """How many people must approve a quote's email (`company.send_quote`'s
    review policy in `tenant`); the quote's approver is the first."""
    return max(1, review_terms_of(tenant, SEND_QUOTE).approvals)


def quote_send_enqueue(*, tenant: str, number: str, quote_id, version: int, approver: str, actor: str) -> Job:
    """The job that sends approved quote `number`'s email, once per quote:
    READY when one approval releases it, else WAITING_REVIEW with
    `approver`'s quote approval recorded as its first approval. In the
    caller's transaction (the outbox consumer's)."""
    required = quote_send_approvals(tenant)
    review = None
    if required > 1:
        review = (f"quote {number} was approved by {approver}; the review policy of its email needs {required} "
                  f"approvals by different people: another reviewer's approval sends it")
    key = quote_send_key(number)
    job, created = Store().enqueue_once(tenant, key, action=SEND_QUOTE, subject_type=QUOTE, subject_id=quote_id,
                                        subject_version=version, actor=actor, reason=f"quote {number} was approved",
                                        review=review)
    if created and review is not None:
        job = job_approval_given_before(tenant=tenant, key=key, actor=approver, required=required,
                                        reason=f"approved quote {number}", detail={"quote": number})
    return job
