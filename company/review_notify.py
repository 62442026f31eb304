"""Telling a tenant's reviewers what waits for them.

- **Digest**: at most one email per reviewer per period (the tenant's
  `review_digest_every`). A periodic task of every worker enqueues one
  planning job per tenant and period (`review-digests-<tenant>-<period>`);
  that job enqueues one `company.notify_reviewer` job per reviewer under the
  key `review-digest-<tenant>-<period>-u<user id>` — the key is the
  once-per-period rule: enqueueing it again (another worker, a late sweep, a
  retried plan) creates nothing.
- **Overdue**: when a review becomes overdue (`review.escalation`) each
  reviewer of the tenant gets one email about it, keyed by the job, the
  review's round and the reviewer.

The recipients are the tenant's current reviewers (`reviewers_of`: a
reviewer's membership there and the permission to review), asked again when
each email is sent: a reviewer demoted after the plan gets nothing.

Every email goes through the operation protocol (`company.handlers._send_once`:
intent under the job's fence, receipt, reconciliation), so a worker killed
mid-send is followed by a lookup or an idempotent resend, never a second email.
"""

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.urls import reverse

from jobs import access
from jobs.actions import JobContext, action
from jobs.clock import db_now
from jobs.models import Job
from jobs.periodic import periodic_task
from jobs.states import State
from jobs.store import Store
from operations.protocol import operation_settle
from review.escalation import register_overdue_notifier

from .handlers import EMAIL_RETRY, _held, _send_once
from .models import Membership, Tenant, TenantPolicy

__all__ = ["NOTIFY_REVIEWER", "PLAN_REVIEW_DIGESTS", "digest_period_start", "review_digest_key",
           "review_digests_plan", "reviewer_now", "reviewers_of", "waiting_for_review"]

NOTIFY_REVIEWER = "company.notify_reviewer"
PLAN_REVIEW_DIGESTS = "company.plan_review_digests"
DIGEST_LINES = 20
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _reviewer_memberships(tenant_slug: str):
    # One membership row per user and tenant: the role and the tenant are of the same row.
    return (get_user_model().objects.filter(memberships__tenant__slug=tenant_slug,
                                            memberships__role=Membership.Role.REVIEWER, is_active=True)
            .exclude(email="").order_by("pk"))


def _reviews(user, tenant_slug: str) -> bool:
    # Whether they may review there now, asked as every decision asks
    # (`jobs.access`: the permission and the role in the tenant).
    return not access.refusal(user, "approve", tenant=tenant_slug)


def reviewers_of(tenant_slug: str) -> list:
    """The tenant's current reviewers with an email address: active users
    with a reviewer's membership in it who hold the permission to review —
    not its viewers or operators, not a reviewer whose group was taken away.
    Read when asked: each email asks again when it is sent (`reviewer_now`)."""
    return [user for user in _reviewer_memberships(tenant_slug) if _reviews(user, tenant_slug)]


def reviewer_now(user_id: int, tenant_slug: str):
    """The user, if they are one of the tenant's `reviewers_of` at this moment; else None."""
    user = _reviewer_memberships(tenant_slug).filter(pk=user_id).first()
    return user if user is not None and _reviews(user, tenant_slug) else None


def waiting_for_review(tenant_slug: str):
    """The tenant's items waiting for review, longest-waiting first (`job_state_tenant`)."""
    return Job.objects.filter(tenant=tenant_slug, state=State.WAITING_REVIEW).order_by("updated_at", "id")


def digest_period_start(every: timedelta, at: datetime) -> datetime:
    """The start of the period of length `every` that `at` falls in
    (periods are counted from the Unix epoch, so every worker agrees)."""
    return _EPOCH + ((at - _EPOCH) // every) * every


def review_digest_key(tenant_slug: str, user_id: int, period_start: datetime) -> str:
    """The business key of one reviewer's digest for one period: at most one job, hence one email."""
    return f"review-digest-{tenant_slug}-{period_start:%Y%m%dT%H%M%SZ}-u{user_id}"


def _console_url(path: str) -> str:
    return getattr(settings, "CONSOLE_BASE_URL", "http://localhost:8000").rstrip("/") + path


@periodic_task("company.review_digests", every=30.0)
def review_digests_plan(*, limit: int = 100, worker_id: str = "review-digests", now=None) -> int:
    """Enqueue this period's digest plan of at most `limit` tenants (one
    job per tenant and period, idempotent by its key); returns how many it
    created. Tenants without a policy row get the default period; a tenant
    with nothing waiting for review gets no plan this time (a later sweep of
    the same period plans it once something waits)."""
    at = now or db_now()
    created = 0
    default_every = TenantPolicy._meta.get_field("review_digest_every").default
    for tenant in Tenant.objects.select_related("policy").order_by("pk")[:limit]:
        policy = getattr(tenant, "policy", None)
        every = policy.review_digest_every if policy is not None else default_every
        # Nothing waits (one probe of the partial index `job_state_tenant`): no plan, no job.
        if not every or not waiting_for_review(tenant.slug).exists():
            continue
        start = digest_period_start(every, at)
        _, made = Store().enqueue_once(
            tenant.slug, f"review-digests-{tenant.slug}-{start:%Y%m%dT%H%M%SZ}", action=PLAN_REVIEW_DIGESTS,
            payload={"period_start": start.isoformat(), "every_seconds": every.total_seconds()}, actor=worker_id,
            reason="the reviewers' digest of this period")
        created += made
    return created


@action(PLAN_REVIEW_DIGESTS, description="Enqueue one digest email per reviewer of the tenant for a period.")
def plan_review_digests(ctx: JobContext) -> dict:
    start = datetime.fromisoformat(ctx.payload["period_start"])
    waiting = waiting_for_review(ctx.tenant).count()
    if not waiting:
        return {"waiting": 0, "digests": []}
    keys = []
    for user in reviewers_of(ctx.tenant):
        key = review_digest_key(ctx.tenant, user.pk, start)
        Store().enqueue_once(ctx.tenant, key, action=NOTIFY_REVIEWER, actor=ctx.key,
                             payload={"kind": "digest", "user_id": user.pk, "period_start": start.isoformat()},
                             reason=f"digest for {user.get_username()}")
        keys.append(key)
    return {"waiting": waiting, "digests": keys}


def overdue_notify(*, job: Job, deadline) -> None:
    """Enqueue one email per reviewer of the tenant about an overdue item."""
    for user in reviewers_of(job.tenant):
        Store().enqueue_once(job.tenant, f"review-overdue-{job.pk}-r{deadline.round}-u{user.pk}",
                             action=NOTIFY_REVIEWER, actor="review policy",
                             payload={"kind": "overdue", "user_id": user.pk, "job_id": job.pk},
                             reason=f"{job.key} is overdue for review")


register_overdue_notifier(overdue_notify)


def _item_line(job: Job) -> str:
    return (f"- {job.key} ({job.action}), waiting since {job.updated_at:%Y-%m-%d %H:%M} UTC: "
            f"{_console_url(reverse('console:decide', args=[job.pk]))}")


def _digest_email(user, tenant_slug: str) -> dict | None:
    waiting = list(waiting_for_review(tenant_slug)[: DIGEST_LINES + 1])
    if not waiting:
        return None
    total = waiting_for_review(tenant_slug).count() if len(waiting) > DIGEST_LINES else len(waiting)
    lines = [_item_line(job) for job in waiting[:DIGEST_LINES]]
    if total > DIGEST_LINES:
        lines.append(f"… and {total - DIGEST_LINES} more: {_console_url(reverse('console:review'))}")
    return {"to": user.email, "subject": f"{total} item{'s' if total != 1 else ''} wait for your review ({tenant_slug})",
            "body": f"Hello {user.get_username()},\n\nthese items of {tenant_slug} wait for a review:\n\n"
                    + "\n".join(lines) + "\n"}


def _overdue_email(user, job: Job) -> dict | None:
    if job.state != State.WAITING_REVIEW:
        return None
    return {"to": user.email, "subject": f"Overdue for review: {job.key} ({job.tenant})",
            "body": f"Hello {user.get_username()},\n\n{job.key} ({job.action}) was not decided in time.\n\n"
                    f"{_console_url(reverse('console:decide', args=[job.pk]))}\n"}


@action(NOTIFY_REVIEWER, retry=EMAIL_RETRY, timeout=300,
        description="Email one reviewer (the period's digest of what waits, or an overdue item), once.")
def notify_reviewer(ctx: JobContext) -> dict:
    sent = operation_settle(ctx, step="email")
    if sent is not None:
        return {"sent": True, **_held(sent)}
    # The recipient is asked for when the email is sent, not when it was planned.
    user = reviewer_now(ctx.payload.get("user_id"), ctx.tenant)
    if user is None:
        return {"sent": False, "why": "the user is no longer a reviewer of the tenant with an email address"}
    if ctx.payload.get("kind") == "overdue":
        job = Job.objects.filter(pk=ctx.payload.get("job_id"), tenant=ctx.tenant).first()
        email = _overdue_email(user, job) if job is not None else None
    else:
        email = _digest_email(user, ctx.tenant)
    if email is None:
        return {"sent": False, "why": "nothing waits for review any more"}
    receipt = _send_once(ctx, step="email", render=lambda: email)
    return {"sent": True, "to": email["to"], **_held(receipt)}
