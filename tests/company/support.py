"""Helpers for the company tests: run the loop in this process, one step at
a time, exactly as `run_worker` records each outcome."""

from django.test import Client
from django.utils import timezone

from company.replies import quote_reply_request
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
                   wake_at=outcome.wake_at)
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
    body, headers = quote_reply_request(secret=REPLY_SECRET, tenant=tenant, quote_number=quote_number,
                                        decision=decision, event_id=event_id, job_key=job_key)
    return Client(SERVER_NAME="localhost").post(f"/hooks/{REPLY_PROVIDER}/events", body,
                                                content_type="application/json", headers=headers)
