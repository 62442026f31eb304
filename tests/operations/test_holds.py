"""Lifting a pause releases every job waiting on that pause — one its worker
still held when the pause was lifted included — and never a job that waits
for something else (operations.limits, Store.defer). Real workers, a real
simulator."""

import threading

import pytest
from django.db import connections, transaction

from jobs.models import Job
from operations import limits
from operations.limits import action_pause, action_resume
from operations.models import DispatchHold
from tests.support import wait_for

from .support import SEND_EMAIL, enqueue_email
from .test_limits import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_pause_lifted_while_the_worker_holds_the_job_lets_it_go_on_at_once(store, sim, monkeypatch):
    action_pause(tenant="studio", action=SEND_EMAIL, reason="incident", actor="otto")
    enqueue_email(store, "mail-1")
    hold = limits._hold

    def lifted_as_soon_as_held(job, why):
        # The operator resumes the action the moment the fence's transaction
        # commits: the job is still LEASED, its worker not yet waiting.
        transaction.on_commit(lambda: action_resume(tenant="studio", action=SEND_EMAIL, actor="otto"))
        monkeypatch.setattr(limits, "_hold", hold)
        return hold(job, why)

    monkeypatch.setattr(limits, "_hold", lifted_as_soon_as_held)
    run_until_idle()
    job = Job.objects.get(key="mail-1")
    assert (job.state, job.attempts) == ("DONE", 1), job.wait_reason
    assert len(sim.messages()) == 1 and not DispatchHold.objects.exists()


def test_a_pause_still_in_force_when_the_wait_is_recorded_holds_the_job(store, sim):
    action_pause(tenant="studio", action=SEND_EMAIL, reason="incident", actor="otto")
    enqueue_email(store, "mail-1")
    run_until_idle()
    job = Job.objects.get(key="mail-1")
    assert job.state == "WAITING_EXTERNAL" and job.wake_at is not None and job.attempts == 0
    assert sim.messages() == [] and DispatchHold.objects.count() == 1


def _held(store) -> Job:
    action_pause(tenant="studio", action=SEND_EMAIL, reason="incident", actor="otto")
    enqueue_email(store, "mail-1")
    run_until_idle()
    assert DispatchHold.objects.count() == 1
    return Job.objects.get(key="mail-1")


def _waits_for_a_reply(store) -> None:
    """The held job moves on: woken (its re-check), claimed, and its handler
    now waits for the customer's reply."""
    store.resume("studio", "mail-1", reason="re-check", actor="timer")
    epoch = store.claim("studio", "mail-1", "w2", ttl=60)
    store.wait("studio", "mail-1", "w2", epoch, reason="waiting for the customer's reply")


def test_lifting_a_pause_leaves_a_job_that_now_waits_for_a_reply_waiting(store, sim):
    _held(store)
    _waits_for_a_reply(store)
    _, released = action_resume(tenant="studio", action=SEND_EMAIL, actor="otto")
    job = Job.objects.get(key="mail-1")
    assert released == 0 and (job.state, job.wait_reason) == ("WAITING_EXTERNAL", "waiting for the customer's reply")
    assert not DispatchHold.objects.exists()


@pytest.mark.postgres
def test_a_job_moving_on_while_the_pause_is_lifted_is_never_resumed_from_its_new_wait(store, sim):
    """The lift reads the held job while, in another transaction, it is
    woken, claimed and starts waiting for a reply: the lift must decide on
    the job as it is once that transaction commits."""
    _held(store)
    outcome = {}

    def lift():
        try:
            outcome["released"] = action_resume(tenant="studio", action=SEND_EMAIL, actor="otto")[1]
        finally:
            connections.close_all()

    lifter = threading.Thread(target=lift)
    with transaction.atomic():
        Job.objects.select_for_update().get(key="mail-1")
        lifter.start()

        def lift_blocked() -> bool:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")  # the view is read once per transaction
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                               "AND datname = current_database()")
                return cursor.fetchone()[0] > 0 or not lifter.is_alive()

        wait_for(lift_blocked, timeout=30, what="the lift to reach the job")
        _waits_for_a_reply(store)
    lifter.join(timeout=60)
    job = Job.objects.get(key="mail-1")
    assert outcome == {"released": 0}
    assert (job.state, job.wait_reason) == ("WAITING_EXTERNAL", "waiting for the customer's reply")
