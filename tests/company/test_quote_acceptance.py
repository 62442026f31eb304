"""Acceptance: the quote loop with real processes — a simulator process, real
`run_worker` processes, real HTTP, a real SIGKILL right after the provider
accepted the quote email — and the reply/timer race on PostgreSQL."""

import signal
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from company.models import Proposal, Quote
from connectors.registry import PROVIDER_FOR_SIMULATOR_MODE
from connectors.simulator_process import running_simulator
from jobs.models import InboundEvent, Job, Timer
from jobs.timers import timer_fire_due
from operations.models import Operation
from tests.support import lease_expired, wait_for, work_to_do

from . import support
from .support import REPLY_PROVIDER, REPLY_SECRET, inbound_settings, post_reply, settle

pytestmark = [pytest.mark.acceptance]
TENANT = "acme"
LEASE_TTL = "1.5"


def approved_quote(number="Q-1", *, follow_up_after=timedelta(days=7)) -> Quote:
    return support.approved_quote(TENANT, number, follow_up_after=follow_up_after)


def start_worker(manage, sim, name: str, *extra: str, read_timeout: float, mode: str = "idempotent"):
    env = {"PROVIDER_URL": sim.url, "PROVIDER_READ_TIMEOUT": str(read_timeout), "PROVIDER_CONNECT_TIMEOUT": "1",
           "OPERATIONS_DEFAULT_EMAIL_PROVIDER": PROVIDER_FOR_SIMULATOR_MODE[mode],
           "INBOUND_WEBHOOK_SECRETS": f"{REPLY_PROVIDER}={REPLY_SECRET}"}
    return manage.start("run_worker", "--worker-id", name, "--lease-ttl", LEASE_TTL, "--poll-interval", "0.1",
                        *extra, env=env)


def job(key: str = "send-quote-Q-1") -> Job | None:
    return Job.objects.filter(tenant=TENANT, key=key).first()


def stop(worker) -> None:
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=30)


def test_quote_loop_with_real_processes_approve_one_email_reply_accepted(manage, settings, tmp_path):
    inbound_settings(settings)
    with running_simulator("idempotent", db_path=tmp_path / "provider.sqlite3", quiet=True) as sim:
        quote = approved_quote()
        worker = start_worker(manage, sim, "w1", read_timeout=2)
        try:
            wait_for(lambda: job() and job().state == "WAITING_EXTERNAL", timeout=60, what="the quote email")
            assert post_reply(TENANT, "Q-1", "accept", event_id="evt-1").status_code == 202
            wait_for(lambda: job().state == "DONE", timeout=60, what="the worker to apply the reply")
        finally:
            stop(worker)
        messages = sim.messages()
    quote.refresh_from_db()
    assert quote.status == "ACCEPTED"
    assert [m["subject"] for m in messages] == ["Your quote Q-1"]
    assert Timer.objects.get(job=job()).state == "CANCELLED"


def test_quote_without_reply_gets_a_follow_up_proposal_once_the_timer_fires(manage, settings, tmp_path):
    inbound_settings(settings)
    with running_simulator("idempotent", db_path=tmp_path / "provider.sqlite3", quiet=True) as sim:
        approved_quote(follow_up_after=timedelta(seconds=1))
        worker = start_worker(manage, sim, "w1", read_timeout=2)
        try:
            follow_up = wait_for(lambda: job("quote-follow-up-Q-1"), timeout=60, what="the follow-up proposal")
            wait_for(lambda: job().state == "DONE", timeout=30, what="the quote job to finish")
        finally:
            stop(worker)
        messages = sim.messages()
    assert follow_up.state == "WAITING_REVIEW"
    assert Proposal.objects.get(job_key="quote-follow-up-Q-1").needs_review
    assert len(messages) == 1  # the follow-up waits for a reviewer: nothing more was sent
    assert Quote.objects.get(number="Q-1").status == "SENT"


@pytest.mark.parametrize("mode", ["idempotent", "lookup", "bare"])
def test_quote_email_with_worker_killed_right_after_the_provider_accepted(mode, manage, settings, tmp_path):
    inbound_settings(settings)
    with running_simulator(mode, db_path=tmp_path / "provider.sqlite3", stall_after_accept=10, quiet=True) as sim:
        quote = approved_quote()
        # The read timeout (3 s) keeps the worker waiting on the stalled
        # answer long enough for the kill to land mid-request.
        worker = start_worker(manage, sim, "w1", read_timeout=3, mode=mode)
        wait_for(sim.messages, timeout=60, what="the provider to accept the quote email")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        op = Operation.objects.get(job__key="send-quote-Q-1")
        assert op.state == "INTENDED"  # the worker died before it heard the answer
        wait_for(lambda: lease_expired(TENANT, "send-quote-Q-1"), timeout=60,
                 what="the dead worker's lease to expire")

        for round_ in range(20):
            clean = start_worker(manage, sim, f"w2-{round_}", "--until-idle", read_timeout=0.5, mode=mode)
            output, _ = clean.communicate(timeout=120)
            assert clean.returncode == 0, output
            if job().state not in ("READY", "LEASED"):
                break
            # Not due yet (a retry's backoff): start the next worker when it is.
            wait_for(lambda: work_to_do(TENANT, "send-quote-Q-1"), timeout=60, what="the job to be due again")
        messages = sim.messages()

    op.refresh_from_db()
    quote.refresh_from_db()
    assert len(messages) == 1
    if mode == "bare":
        # Nothing can tell whether it arrived: a human decides, nothing is resent.
        assert job().state == "NEEDS_ATTENTION"
        assert op.state in ("UNKNOWN", "NEEDS_INVESTIGATION") and op.attempts == 1
        assert "not sent again automatically" in job().last_error
        assert quote.status == "APPROVED"
    else:
        assert op.state == "ACCEPTED" and op.receipt.how in ("lookup", "idempotent_replay")
        assert op.receipt.provider_reference == messages[0]["id"]
        assert quote.status == "SENT"
        assert job().state == "WAITING_EXTERNAL"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_reply_and_follow_up_timer_racing_resolve_to_exactly_one(start_sim, settings):
    sim = start_sim("idempotent")
    settings.PROVIDER_URL = sim.url
    inbound_settings(settings)
    numbers = [f"Q-{i}" for i in range(1, 9)]
    for number in numbers:
        approved_quote(number)
    settle(TENANT)
    assert Job.objects.filter(tenant=TENANT, state="WAITING_EXTERNAL").count() == len(numbers)
    Timer.objects.filter(tenant=TENANT, state="PENDING").update(scheduled_for=timezone.now())

    for number in numbers:
        barrier = threading.Barrier(2)
        errors = []

        def race(run):
            try:
                barrier.wait(timeout=10)
                run()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=race, args=(lambda: timer_fire_due(limit=1),)),
                   threading.Thread(target=race, args=(lambda n=number: post_reply(TENANT, n, "accept",
                                                                                    event_id=f"evt-{n}"),))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
    settle(TENANT)

    for number in numbers:
        send = job(f"send-quote-{number}")
        resumes = send.events.filter(kind="resume").count()
        accepted = Quote.objects.get(number=number).status == "ACCEPTED"
        followed_up = job(f"quote-follow-up-{number}") is not None
        reply = InboundEvent.objects.get(event_id=f"evt-{number}")
        assert resumes == 1, number
        assert accepted != followed_up, number  # exactly one of them won
        assert (reply.state == "APPLIED") == accepted
        assert send.state == "DONE"
