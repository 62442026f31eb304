"""Plain helpers shared by the operations tests."""

from connectors.registry import PROVIDER_FOR_SIMULATOR_MODE
from jobs.actions import JobContext, get_action
from jobs.errors import Conflict
from jobs.models import Job
from tests.support import wait_for  # noqa: F401 - re-exported for the operations tests

SEND_EMAIL = "connectors.send_email"
EMAIL = {"to": "ada@example.com", "subject": "Your quote Q-017", "body": "Please find your quote attached."}


def email_payload(mode: str = "idempotent", **overrides) -> dict:
    """A `connectors.send_email` payload aimed at the provider of a simulator mode."""
    return {**EMAIL, "provider": PROVIDER_FOR_SIMULATOR_MODE[mode], **overrides}


def enqueue_email(store, key: str = "send-quote-017", *, tenant: str = "studio", mode: str = "idempotent",
                  **overrides) -> Job:
    return store.enqueue(tenant, key, action=SEND_EMAIL, payload=email_payload(mode, **overrides))


def attempt(store, tenant: str = "studio", key: str = "send-quote-017", *, worker: str = "w1"):
    """One attempt as `run_worker` makes it, in this process: claim the job,
    run its handler, record the outcome under the fence. Returns the
    handler's result or the exception it raised (already recorded)."""
    make_due(tenant, key)
    epoch = store.claim(tenant, key, worker, ttl=60)
    assert epoch is not None, f"{tenant}/{key} is not claimable: {Job.objects.get(tenant=tenant, key=key)}"
    job = Job.objects.get(tenant=tenant, key=key)
    ctx = JobContext(job=job, worker_id=worker, store=store)
    try:
        result = get_action(job.action).handler(ctx)
    except Conflict:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded exactly as the worker does
        store.fail_with(tenant, key, worker, epoch, exc)
        return exc
    store.finish(tenant, key, worker, epoch, result=result)
    return result


def make_due(tenant: str, key: str) -> None:
    """Skip a retry's backoff: the test decides when the next attempt happens."""
    Job.objects.filter(tenant=tenant, key=key, state="READY").update(next_attempt_at=None)


def job(tenant: str = "studio", key: str = "send-quote-017") -> Job:
    return Job.objects.get(tenant=tenant, key=key)
