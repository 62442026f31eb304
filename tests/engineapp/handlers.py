"""Test-only actions: their payload says how to behave."""

import time

from jobs.actions import Wait, action
from jobs.errors import AuthError, PermanentError, TransientError
from jobs.retry import RetryPolicy


@action("test.sleep")
def sleep(ctx):
    """Sleep `seconds`, checking the cancellation flag; report whether it was cancelled."""
    seconds = float(ctx.payload.get("seconds", 1))
    if ctx.payload.get("first_attempt_only") and ctx.job.attempts > 1:
        seconds = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled.is_set():
            return {"cancelled": True}
        time.sleep(0.02)
    return {"slept": ctx.payload.get("seconds", 1)}


@action("test.sleep_with_timeout", timeout=0.5)
def sleep_with_timeout(ctx):
    time.sleep(float(ctx.payload.get("seconds", 2)))
    return {"finished": True}


@action("test.fail", retry=RetryPolicy(initial_interval=0.01, max_interval=0.05, max_attempts=3))
def fail(ctx):
    kind = ctx.payload.get("kind", "transient")
    if kind == "auth":
        raise AuthError("provider answered 401: API key revoked")
    if kind == "permanent":
        raise PermanentError("recipient 'bob' has no @")
    if kind == "crash":
        raise RuntimeError("unexpected bug")
    raise TransientError("provider timed out")


@action("test.wait")
def wait(ctx):
    return Wait.external("waiting for the customer's reply")
