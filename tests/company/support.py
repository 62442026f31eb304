"""Helpers for the company tests: run the loop in this process, one step at
a time, exactly as `run_worker` records each outcome."""

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from company.models import Quote
from company.replies import quote_reply_post
from company.services import customer_ensure, quote_approve, quote_create, tenant_ensure, tenant_policy_set
from jobs.actions import JobContext, Wait, get_action
from jobs.models import Job
from jobs.outbox import outbox_relay
from jobs.store import Store
from jobs.timers import timer_fire_due

REPLY_PROVIDER = "mailer"
REPLY_SECRET = "reply-secret"


def inbound_settings(settings) -> None:
    """The reply provider's secret and its tenant binding (contracts C2, C3)."""
    settings.INBOUND_WEBHOOK_SECRETS = {REPLY_PROVIDER: REPLY_SECRET}
    settings.INBOUND_PROVIDER_TENANTS = {REPLY_PROVIDER: ["*"]}
    settings.COMPANY_REPLY_PROVIDER = REPLY_PROVIDER


def run_one(store: Store, job: Job, worker: str = "test-worker"):
    """Run a claimed job's handler and record its outcome as the worker does."""
    ctx = JobContext(job=job, worker_id=worker, store=store)
    try:
        outcome = get_action(job.action).handler(ctx)
    except Exception as exc:  # noqa: BLE001 - recorded exactly as the worker does
        store.fail_with(job.tenant, job.key, worker, job.lease_epoch, exc)
        return exc
    if isinstance(outcome, Wait):
        store.wait(job.tenant, job.key, worker, job.lease_epoch, state=outcome.state, reason=outcome.reason,
                   wake_at=outcome.wake_at, provider=outcome.provider)
    else:
        store.finish(job.tenant, job.key, worker, job.lease_epoch, result=outcome)
    return outcome


def settle(tenant: str, *, rounds: int = 200) -> None:
    """Relay the outbox, fire due timers and run every eligible job of
    `tenant` until nothing moves (a retry's backoff is skipped)."""
    store = Store()
    for _ in range(rounds):
        Job.objects.filter(tenant=tenant, state="READY").update(next_attempt_at=None)
        # Wall-clock time: inside a test's transaction PostgreSQL's now()
        # stands still at the transaction's start.
        moved = outbox_relay() + timer_fire_due(now=timezone.now())
        job = store.claim_next("test-worker", tenants=[tenant], ttl=60)
        if job is not None:
            run_one(store, job)
        elif not moved:
            return
    raise AssertionError(f"{tenant} did not settle in {rounds} rounds")


def post_reply(tenant: str, quote_number: str, decision: str, *, event_id: str, job_key: str | None = None):
    return quote_reply_post(provider=REPLY_PROVIDER, secret=REPLY_SECRET, tenant=tenant, quote_number=quote_number,
                            decision=decision, event_id=event_id, job_key=job_key)


def approved_quote(tenant_slug: str, number: str = "Q-1", *, follow_up_after=timedelta(days=7)) -> Quote:
    """An approved quote of a fresh customer; its `quote.approved` event is not relayed yet."""
    tenant = tenant_ensure(slug=tenant_slug)
    tenant_policy_set(tenant=tenant, quote_follow_up_after=follow_up_after)
    customer = customer_ensure(tenant=tenant, email="ada@example.com", name="Ada")
    quote = quote_create(tenant=tenant, number=number, customer=customer, amount=Decimal("1200.00"))
    return quote_approve(quote=quote, actor="alice")
