"""A tenant's review policy, handed to the review layer (`review.policy`):
per action (or the tenant's default row, `action` empty) how many different
people approve, when a review is due, when the policy rejects it, and
whether a correction restarts the clock."""

from datetime import timedelta

from django.db import transaction

from review.policy import ReviewTerms

from .models import ReviewPolicy, Tenant

__all__ = ["review_terms_for", "review_terms_of", "review_policy_set"]


def _seconds(value: timedelta | None) -> float | None:
    return value.total_seconds() if value is not None else None


def review_terms_for(job) -> ReviewTerms:
    """The terms of `job`'s review (`review_terms_of` its tenant and action)."""
    return review_terms_of(job.tenant, job.action)


def review_terms_of(tenant: str, action: str) -> ReviewTerms:
    """The review terms of `action` in `tenant` (its slug): the action's
    row, else the tenant's default row, else one approval and no due time
    (one query, served by the unique constraint on (tenant, action))."""
    rows = {p.action: p for p in ReviewPolicy.objects.filter(tenant__slug=tenant, action__in=[action, ""])}
    policy = rows.get(action) or rows.get("")
    if policy is None:
        return ReviewTerms()
    return ReviewTerms(approvals=policy.approvals, due_after=_seconds(policy.due_after),
                       reject_after=_seconds(policy.reject_after),
                       reset_on_correction=policy.reset_due_on_correction,
                       source=f"{tenant}/{policy.action or 'default'}")


@transaction.atomic
def review_policy_set(*, tenant: Tenant, action: str = "", approvals: int = 1, due_after: timedelta | None = None,
                      reject_after: timedelta | None = None, reset_due_on_correction: bool = False) -> ReviewPolicy:
    """Set the review terms of `tenant` for `action` ("" = its default).
    Raises `ValueError` for approvals other than 1 or 2, or a negative period.
    Applies to reviews that begin (or restart their clock) from now on."""
    if approvals not in (1, 2):
        raise ValueError(f"approvals must be 1 or 2, not {approvals!r}")
    for name, period in (("due_after", due_after), ("reject_after", reject_after)):
        if period is not None and period < timedelta(0):
            raise ValueError(f"{name} must not be negative ({period})")
    policy, _ = ReviewPolicy.objects.update_or_create(
        tenant=tenant, action=action,
        defaults={"approvals": approvals, "due_after": due_after, "reject_after": reject_after,
                  "reset_due_on_correction": reset_due_on_correction})
    return policy
