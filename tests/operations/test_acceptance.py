"""Acceptance: real worker processes, a real simulator process, real HTTP,
real `kill -9` (DESIGN §6, §12; the seed's acceptance test).

A worker is killed after the provider accepted the message but before the
answer reached it; a new worker, started once the lease has expired, must
leave exactly one customer-visible message and a reconciled receipt — or,
with a provider that cannot reconcile, one message and a job a human can
understand.
"""

import signal
import time

import pytest

from connectors.simulator_process import running_simulator
from jobs.models import Job
from operations.models import Operation
from operations.protocol import CRASH_AFTER_INTENDED_ENV

from tests.support import lease_expired, work_to_do

from .support import enqueue_email, wait_for

pytestmark = [pytest.mark.acceptance]

LEASE_TTL = "1.5"
KEY = "send-quote-017"


def worker_env(sim, *, read_timeout: float) -> dict:
    return {"PROVIDER_URL": sim.url, "PROVIDER_READ_TIMEOUT": str(read_timeout), "PROVIDER_CONNECT_TIMEOUT": "1"}


def start_worker(manage, sim, name: str, *extra: str, read_timeout: float, env: dict | None = None):
    return manage.start("run_worker", "--worker-id", name, "--lease-ttl", LEASE_TTL, "--poll-interval", "0.1",
                        *extra, env={**worker_env(sim, read_timeout=read_timeout), **(env or {})})


def after_lease_expires(tenant: str = "studio", key: str = KEY) -> None:
    """Wait until the dead worker's lease has run out by the database's clock."""
    if Job.objects.get(tenant=tenant, key=key).lease_until is not None:
        wait_for(lambda: lease_expired(tenant, key), timeout=30, what="the dead worker's lease to expire")


@pytest.fixture
def clean_worker(manage):
    """Run `run_worker --until-idle` (read timeout 0.5 s), again while the
    job is merely not due yet (a retry's backoff); returns the settled job."""

    def run(sim, *, tenant: str = "studio", key: str = KEY, timeout: float = 60) -> Job:
        deadline = time.monotonic() + timeout
        for round_ in range(1, 30):
            worker = start_worker(manage, sim, f"w2-{round_}", "--until-idle", read_timeout=0.5)
            output, _ = worker.communicate(timeout=max(1, deadline - time.monotonic()))
            assert worker.returncode == 0, output
            job = Job.objects.get(tenant=tenant, key=key)
            if job.state not in ("READY", "LEASED") or time.monotonic() > deadline:
                return job
            # Not due yet (a retry's backoff, a lease still running): start the next worker when it is.
            wait_for(lambda: work_to_do(tenant, key), timeout=max(1, deadline - time.monotonic()),
                     what="the job to be due again")
        return job

    return run


@pytest.mark.parametrize("mode", ["idempotent", "lookup"])
def test_worker_killed_after_the_provider_accepted_sends_exactly_once(mode, manage, store, clean_worker, tmp_path):
    with running_simulator(mode, db_path=tmp_path / "provider.sqlite3", stall_after_accept=10, quiet=True) as sim:
        enqueue_email(store, mode=mode)
        # The read timeout (3 s) leaves the worker waiting on the stalled
        # answer long enough for the kill to land mid-request.
        worker = start_worker(manage, sim, "w1", read_timeout=3)
        wait_for(sim.messages, timeout=30, what="the simulator to store the message")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        op = Operation.objects.get(job__key=KEY)
        assert op.state == "INTENDED"  # the worker died before it heard the answer

        after_lease_expires()
        job = clean_worker(sim)

        messages = sim.messages()
    op.refresh_from_db()
    assert len([m for m in messages if m["client_reference"] == op.intent_key]) == 1
    assert len(messages) == 1
    assert op.state == "ACCEPTED"
    # Both providers declare lookup, so the in-doubt send is found, not resent.
    assert op.receipt.how == "lookup"
    assert op.receipt.provider_reference == messages[0]["id"]
    assert job.state == "DONE"
    assert job.result["provider_reference"] == messages[0]["id"]


def test_bare_provider_worker_killed_after_acceptance_goes_to_a_human_without_resending(
    manage, store, clean_worker, tmp_path
):
    with running_simulator("bare", db_path=tmp_path / "provider.sqlite3", stall_after_accept=10, quiet=True) as sim:
        enqueue_email(store, mode="bare")
        worker = start_worker(manage, sim, "w1", read_timeout=3)
        wait_for(sim.messages, timeout=30, what="the simulator to store the message")
        worker.send_signal(signal.SIGKILL)
        worker.wait()

        after_lease_expires()
        job = clean_worker(sim)

        messages = sim.messages()
    op = Operation.objects.get(job__key=KEY)
    assert len(messages) == 1
    assert op.state == "NEEDS_INVESTIGATION"
    assert op.attempts == 1
    assert job.state == "NEEDS_ATTENTION"
    # A reason an operator can act on: what, why it is not resent, what to do.
    assert "email to ada@example.com may or may not have been accepted by sim-bare" in job.last_error
    assert "not sent again automatically" in job.last_error
    assert f"client reference {op.intent_key}" in job.last_error
    assert "mark the operation sent" in job.last_error


@pytest.mark.parametrize("mode", ["idempotent", "lookup"])
def test_crash_after_the_intent_before_the_request_leaves_sends_exactly_once(
    mode, manage, store, clean_worker, tmp_path
):
    with running_simulator(mode, db_path=tmp_path / "provider.sqlite3", quiet=True) as sim:
        enqueue_email(store, mode=mode)
        worker = start_worker(manage, sim, "w1", read_timeout=0.5, env={CRASH_AFTER_INTENDED_ENV: "1"})
        output, _ = worker.communicate(timeout=60)
        assert worker.returncode == 137, output
        assert sim.messages() == []
        assert Operation.objects.get(job__key=KEY).state == "INTENDED"

        after_lease_expires()
        job = clean_worker(sim)

        messages = sim.messages()
    op = Operation.objects.get(job__key=KEY)
    assert len(messages) == 1
    assert messages[0]["client_reference"] == op.intent_key
    assert (op.state, op.receipt.how) == ("ACCEPTED", "direct")
    assert job.state == "DONE"


def test_bare_provider_crash_after_the_intent_goes_to_a_human_without_sending(
    manage, store, clean_worker, tmp_path
):
    with running_simulator("bare", db_path=tmp_path / "provider.sqlite3", quiet=True) as sim:
        enqueue_email(store, mode="bare")
        worker = start_worker(manage, sim, "w1", read_timeout=0.5, env={CRASH_AFTER_INTENDED_ENV: "1"})
        output, _ = worker.communicate(timeout=60)
        assert worker.returncode == 137, output

        after_lease_expires()
        job = clean_worker(sim)

        messages = sim.messages()
    op = Operation.objects.get(job__key=KEY)
    assert messages == []
    assert op.state == "NEEDS_INVESTIGATION"
    assert job.state == "NEEDS_ATTENTION"
    assert "may have died before or after sending" in job.last_error
