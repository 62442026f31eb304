"""Timers re-read their subject before they act (DESIGN §8)."""

import json
import multiprocessing
import time
from datetime import date, datetime, timedelta

import pytest
from django.db import connections

from jobs import interventions
from jobs.inbound import inbound_event_receive, signature_for
from jobs.models import InboundEvent, Job, JobEvent, Timer
from jobs.timers import TimerError, timer_fire_due, timer_schedule
from tests.testapp.handlers import INVOICE, reminder_time
from tests.testapp.models import Invoice

SECRET = "s3cret-for-tests"
DUE = date(2030, 1, 10)
REMIND_AT = reminder_time(DUE)  # 2030-01-10 09:00 UTC


def at(moment: datetime, seconds: float = 0) -> float:
    return moment.timestamp() + seconds


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.INBOUND_WEBHOOK_SECRETS = {"sim": SECRET}
    settings.INBOUND_PROVIDER_TENANTS = {"sim": ["studio"]}


def waiting_for_reply_or_reminder(store, *, number="INV-1", key=None):
    """An invoice and a job that waits for the customer's reply or the
    reminder date, the timer set from the handler under its fence."""
    invoice = Invoice.objects.create(number=number, due_date=DUE)
    key = key or f"invoice-reminder-{invoice.pk}"
    store.enqueue("studio", key, action="jobs.noop", subject_type=INVOICE, subject_id=invoice.pk)
    epoch = store.claim("studio", key, "w")
    job = Job.objects.get(tenant="studio", key=key)
    timer = timer_schedule(job=job, job_epoch=epoch, scheduled_for=REMIND_AT, reason="payment reminder",
                           subject_type=INVOICE, subject_id=invoice.pk, subject_version=invoice.version,
                           cancellation_condition="testapp.invoice_settled")
    store.wait("studio", key, "w", epoch, reason="customer reply or payment reminder date", provider="sim")
    return invoice, job, timer


def change_terms(invoice: Invoice, **changes) -> None:
    for name, value in changes.items():
        setattr(invoice, name, value)
    invoice.version += 1
    invoice.save()


def reply_to(job: Job, event_id: str = "evt-1") -> str:
    body = json.dumps({"id": event_id, "type": "message.reply", "tenant": job.tenant,
                       "correlation": {"job_key": job.key}, "data": {"text": "Paid yesterday"}}).encode()
    timestamp = str(int(time.time()))
    signature = signature_for(secret=SECRET, timestamp=timestamp, body=body)
    return inbound_event_receive(provider="sim", body=body, timestamp=timestamp, signature=signature).status


def resumes(job: Job) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, kind="resume"))


pytestmark = pytest.mark.django_db


def test_a_timer_does_nothing_before_it_is_due(store):
    _, job, timer = waiting_for_reply_or_reminder(store)
    assert timer_fire_due(now=at(REMIND_AT, -1)) == 0
    timer.refresh_from_db()
    assert timer.state == "PENDING"
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"


def test_version_unchanged_fires_and_the_job_is_ready_with_the_fresh_context(store):
    _, job, timer = waiting_for_reply_or_reminder(store)
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    timer.refresh_from_db()
    assert timer.state == "FIRED"
    assert timer.fired_at == REMIND_AT
    job.refresh_from_db()
    assert job.state == "READY"
    [resumed] = resumes(job)
    assert resumed.actor == "timer"
    assert resumed.detail["timer"] == timer.pk
    assert resumed.detail["context"] == {"number": "INV-1", "due_date": "2030-01-10", "paid": False,
                                         "suppressed": False}
    assert timer_fire_due(now=at(REMIND_AT, 60)) == 0


def test_due_date_moved_replans_the_timer_to_the_new_date(store):
    invoice, job, timer = waiting_for_reply_or_reminder(store)
    change_terms(invoice, due_date=date(2030, 2, 1))
    new_date = reminder_time(date(2030, 2, 1))

    assert timer_fire_due(now=at(REMIND_AT)) == 1
    timer.refresh_from_db()
    assert timer.state == "SUPERSEDED"
    successor = timer.superseded_by
    assert (successor.state, successor.scheduled_for, successor.subject_version) == ("PENDING", new_date, 2)
    assert (successor.job_id, successor.job_epoch, successor.reason) == (job.pk, timer.job_epoch, timer.reason)
    assert "changed from version 1 to 2" in timer.outcome["reason"]
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"  # not woken on the old date

    assert timer_fire_due(now=at(new_date, -1)) == 0
    assert timer_fire_due(now=at(new_date)) == 1
    successor.refresh_from_db()
    assert successor.state == "FIRED"
    [resumed] = resumes(job)
    assert resumed.detail["context"]["due_date"] == "2030-02-01"


def test_due_date_moved_earlier_fires_at_the_next_sweep(store):
    invoice, job, timer = waiting_for_reply_or_reminder(store)
    change_terms(invoice, due_date=date(2029, 12, 1))
    # A sweep today sees nothing: the timer is not due on its old date …
    assert timer_fire_due(now=at(reminder_time(date(2029, 12, 5)))) == 0
    # … but once it is reconsidered, the earlier date is already past.
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    assert Timer.objects.filter(job=job, state="FIRED").get().scheduled_for == reminder_time(date(2029, 12, 1))
    assert Job.objects.get(pk=job.pk).state == "READY"


@pytest.mark.parametrize("change", [{"paid": True}, {"suppressed": True}], ids=["paid", "suppressed"])
def test_a_settled_subject_cancels_the_timer(store, change):
    invoice, job, timer = waiting_for_reply_or_reminder(store)
    for name, value in change.items():
        setattr(invoice, name, value)
    invoice.save()  # same version: the cancellation condition is what matters
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    timer.refresh_from_db()
    assert timer.state == "CANCELLED"
    assert timer.outcome["reason"] == "cancellation condition testapp.invoice_settled holds"
    assert timer.fired_at is None
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"
    assert resumes(job) == []


def test_a_settled_subject_with_new_terms_is_cancelled_not_replanned(store):
    invoice, _, timer = waiting_for_reply_or_reminder(store)
    change_terms(invoice, due_date=date(2030, 3, 1), paid=True)
    timer_fire_due(now=at(REMIND_AT))
    timer.refresh_from_db()
    assert (timer.state, timer.superseded_by) == ("CANCELLED", None)


def test_a_deleted_subject_cancels_the_timer(store):
    invoice, _, timer = waiting_for_reply_or_reminder(store)
    invoice.delete()
    timer_fire_due(now=at(REMIND_AT))
    timer.refresh_from_db()
    assert timer.state == "CANCELLED"
    assert "no longer exists" in timer.outcome["reason"]


def test_reply_first_resumes_the_job_and_cancels_the_timer_in_the_same_transaction(store):
    _, job, timer = waiting_for_reply_or_reminder(store)
    assert reply_to(job) == "applied"
    timer.refresh_from_db()
    assert timer.state == "CANCELLED"
    assert "resumed the job first" in timer.outcome["reason"]
    assert timer_fire_due(now=at(REMIND_AT)) == 0
    assert len(resumes(job)) == 1


def test_timer_first_resumes_the_job_and_a_later_reply_is_kept_unmatched(store):
    _, job, timer = waiting_for_reply_or_reminder(store)
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    assert reply_to(job) == "unmatched"
    assert "is READY, not waiting" in InboundEvent.objects.get().note
    assert len(resumes(job)) == 1
    assert resumes(job)[0].actor == "timer"


def test_the_first_timer_of_a_wait_cancels_its_other_timers(store):
    invoice, job, first = waiting_for_reply_or_reminder(store)
    second = timer_schedule(job=job, job_epoch=first.job_epoch, scheduled_for=REMIND_AT + timedelta(days=14),
                            reason="escalate to the owner")
    timer_fire_due(now=at(REMIND_AT))
    second.refresh_from_db()
    assert second.state == "CANCELLED"
    assert f"timer {first.pk} woke the job first" in second.outcome["reason"]


def test_a_timer_of_a_finished_job_is_cancelled(store):
    _, job, timer = waiting_for_reply_or_reminder(store)
    interventions.job_cancel(tenant="studio", key=job.key, reason="customer withdrew", actor="ops")
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    timer.refresh_from_db()
    assert (timer.state, timer.outcome["reason"]) == ("CANCELLED", "the job is CANCELLED")


def test_a_timer_of_a_wait_that_ended_is_cancelled_not_fired_into_the_next_wait(store):
    _, job, timer = waiting_for_reply_or_reminder(store)
    store.resume("studio", job.key, reason="reviewer approved", actor="ops")  # the wait ended another way
    epoch = store.claim("studio", job.key, "w")
    store.wait("studio", job.key, "w", epoch, reason="a later wait")
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    timer.refresh_from_db()
    assert timer.state == "CANCELLED"
    assert "moved on to epoch 2" in timer.outcome["reason"]
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"


def test_a_timer_set_by_a_running_handler_waits_until_the_job_waits(store):
    invoice = Invoice.objects.create(number="INV-1", due_date=DUE)
    store.enqueue("studio", "remind")
    epoch = store.claim("studio", "remind", "w")
    job = Job.objects.get(key="remind")
    timer = timer_schedule(job=job, job_epoch=epoch, scheduled_for=REMIND_AT, reason="payment reminder",
                           subject_type=INVOICE, subject_id=invoice.pk, subject_version=1)
    assert timer_fire_due(now=at(REMIND_AT)) == 0  # the job is still LEASED at the timer's epoch
    timer.refresh_from_db()
    assert timer.state == "PENDING"
    store.wait("studio", "remind", "w", epoch, reason="reply or reminder")
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    assert Job.objects.get(pk=job.pk).state == "READY"


def test_a_timer_without_a_job_enqueues_its_action_once(store):
    invoice = Invoice.objects.create(number="INV-1", due_date=DUE)
    timer = timer_schedule(tenant="studio", action="jobs.noop", job_key=f"invoice-reminder-{invoice.pk}",
                           payload={"days_after_due": 0}, scheduled_for=REMIND_AT, reason="payment reminder",
                           subject_type=INVOICE, subject_id=invoice.pk, subject_version=1)
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    job = Job.objects.get(key=f"invoice-reminder-{invoice.pk}")
    assert (job.state, job.subject_version) == ("READY", 1)
    assert job.payload["days_after_due"] == 0
    assert job.payload["timer"]["timer"] == timer.pk
    assert job.payload["timer"]["context"]["due_date"] == "2030-01-10"


def test_a_broken_condition_still_fires_with_the_error_recorded(store, monkeypatch):
    from jobs import timers

    _, job, timer = waiting_for_reply_or_reminder(store)

    def broken(subject, **args):
        raise KeyError("paid")

    monkeypatch.setitem(timers._conditions, "testapp.invoice_settled", broken)
    assert timer_fire_due(now=at(REMIND_AT)) == 1
    timer.refresh_from_db()
    assert timer.state == "FIRED"
    assert "KeyError" in timer.outcome["error"]
    assert "KeyError" in resumes(job)[0].detail["error"]


def test_the_sweep_is_bounded(store):
    for n in range(7):
        timer_schedule(tenant="studio", action="jobs.noop", scheduled_for=REMIND_AT, reason=f"t{n}")
    assert timer_fire_due(now=at(REMIND_AT), limit=5) == 5
    assert timer_fire_due(now=at(REMIND_AT), limit=5) == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cancellation_condition": "nope"}, "no cancellation condition 'nope'"),
        ({"subject_type": "nope"}, "no loader is registered for subject type 'nope'"),
        ({"subject_version": 3}, "needs a subject_type"),
        ({"action": ""}, "exactly one of job= and action="),
    ],
)
def test_schedule_refuses_what_it_could_not_evaluate(kwargs, message):
    args = {"tenant": "studio", "action": "jobs.noop", "scheduled_for": REMIND_AT, "reason": "r", **kwargs}
    with pytest.raises(TimerError, match=message):
        timer_schedule(**args)


@pytest.mark.django_db(transaction=True)
def test_a_handler_waits_for_a_reply_or_a_timer_and_the_worker_resumes_it(manage):
    from jobs.store import Store

    def run_until_idle():
        manage.run("run_worker", "--until-idle", "--poll-interval", "0.05", "--grace", "5")

    # Reply first.
    early = Invoice.objects.create(number="INV-1", due_date=date.today() + timedelta(days=30))
    Store().enqueue("studio", "remind-1", action="testapp.invoice_reminder", subject_id=early.pk)
    run_until_idle()
    job = Job.objects.get(key="remind-1")
    assert job.state == "WAITING_EXTERNAL"
    assert Timer.objects.get(job=job).state == "PENDING"
    assert reply_to(job) == "applied"
    run_until_idle()
    job.refresh_from_db()
    assert (job.state, job.result["woken_by"]) == ("DONE", "inbound:sim")
    assert Timer.objects.get(job=job).state == "CANCELLED"

    # The reminder date first: already due when the worker runs.
    late = Invoice.objects.create(number="INV-2", due_date=date(2020, 1, 1))
    Store().enqueue("studio", "remind-2", action="testapp.invoice_reminder", subject_id=late.pk)
    run_until_idle()
    job = Job.objects.get(key="remind-2")
    assert (job.state, job.result["woken_by"]) == ("DONE", "timer")
    assert job.result["detail"]["context"]["number"] == "INV-2"


# ---------------------------------------------------------------- the race in real processes


def _sweep_until_decided(count: int) -> int:
    fired = 0
    deadline = time.monotonic() + 60
    while Timer.objects.filter(state="PENDING").exists() and time.monotonic() < deadline:
        fired += timer_fire_due(limit=5, now=at(REMIND_AT))
    connections.close_all()
    return fired


def _reply_to_all(keys: list[str]) -> list[str]:
    from django.conf import settings

    settings.INBOUND_WEBHOOK_SECRETS = {"sim": SECRET}
    outcomes = [reply_to(Job.objects.get(tenant="studio", key=key), event_id=f"evt-{key}") for key in keys]
    connections.close_all()
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_reply_or_timer_race_resolves_to_exactly_one_resume_per_job(store):
    jobs = [waiting_for_reply_or_reminder(store, number=f"INV-{n}")[1] for n in range(60)]
    keys = [job.key for job in jobs]
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        sweeps = [pool.apply_async(_sweep_until_decided, (len(keys),)) for _ in range(2)]
        replies = [pool.apply_async(_reply_to_all, (keys[i::2],)) for i in range(2)]
        fired = sum(s.get(timeout=120) for s in sweeps)
        outcomes = [o for r in replies for o in r.get(timeout=120)]

    applied = outcomes.count("applied")
    assert applied + fired == 60
    assert outcomes.count("unmatched") == fired  # a reply after the timer is kept, not applied
    for job in jobs:
        [resumed] = resumes(job)  # exactly one wake-up per job
        timer = Timer.objects.get(job=job)
        event = InboundEvent.objects.get(job=job)
        if resumed.actor == "timer":
            assert (timer.state, event.state) == ("FIRED", "UNMATCHED")
        else:
            assert (timer.state, event.state) == ("CANCELLED", "APPLIED")
