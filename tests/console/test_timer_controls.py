"""Operators on waits and timers: run a timer now, reschedule it,
cancel a wait with a reason — each audited on the job and refused when the
job moved since the operator's page; and the header's count of items waiting
for the signed-in reviewer."""

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from jobs import interventions
from jobs.models import Job, Timer
from jobs.store import Store
from jobs.timers import timer_fire_due, timer_schedule

from .conftest import make_job, newest_event

pytestmark = pytest.mark.django_db

LATER = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def waiting_with_timer(key="wait-1"):
    store = Store()
    store.enqueue("studio", key)
    epoch = store.claim("studio", key, "w1")
    job = Job.objects.get(tenant="studio", key=key)
    timer = timer_schedule(job=job, job_epoch=epoch, scheduled_for=LATER, reason="the customer's reply deadline")
    store.wait("studio", key, "w1", epoch, reason="the customer's reply")
    return Job.objects.get(pk=job.pk), timer


def post(client, url, seen, **data):
    return client.post(url, {"seen_event": seen, "note": "the customer called", **data}, follow=True)


def test_an_operator_runs_a_timer_now_and_the_next_sweep_fires_it(client, people):
    job, timer = waiting_with_timer()
    client.force_login(people["operator"])
    page = client.get(f"/admin/console/jobs/{job.pk}/").content.decode()
    assert "Run timer now" in page and "the customer&#x27;s reply deadline" in page

    response = post(client, f"/admin/console/jobs/{job.pk}/timers/{timer.pk}/run/", newest_event(job))
    assert "Run timer now: studio/wait-1" in response.content.decode()
    timer.refresh_from_db()
    assert timer.state == "PENDING" and timer.scheduled_for <= timezone.now()
    event = job.events.order_by("-id").first()
    assert (event.kind, event.actor, event.reason) == ("timer_run_now", "otto", "the customer called")
    assert event.detail["before"] == LATER.isoformat()

    assert timer_fire_due(now=timezone.now()) == 1
    job.refresh_from_db()
    assert job.state == "READY"


def test_a_timer_control_is_refused_when_the_job_moved_since_the_page(client, people):
    job, timer = waiting_with_timer()
    seen = newest_event(job)
    interventions.job_note(tenant="studio", key="wait-1", kind="note", state="WAITING_EXTERNAL", actor="someone", reason="moved")
    client.force_login(people["operator"])
    for url, extra in ((f"/admin/console/jobs/{job.pk}/timers/{timer.pk}/run/", {}),
                       (f"/admin/console/jobs/{job.pk}/timers/{timer.pk}/reschedule/",
                        {"scheduled_for": "2031-05-01T10:00"}),
                       (f"/admin/console/jobs/{job.pk}/cancel-wait/", {})):
        page = post(client, url, seen, **extra).content.decode()
        assert "refused: already decided by someone" in page, url
    timer.refresh_from_db()
    job.refresh_from_db()
    assert timer.scheduled_for == LATER and timer.state == "PENDING" and job.state == "WAITING_EXTERNAL"
    assert job.events.order_by("-id").first().kind == "note"


def test_an_operator_reschedules_a_timer_and_a_fired_one_cannot_be_moved(client, people):
    job, timer = waiting_with_timer()
    client.force_login(people["operator"])
    post(client, f"/admin/console/jobs/{job.pk}/timers/{timer.pk}/reschedule/", newest_event(job),
         scheduled_for="2031-05-01T10:00")
    timer.refresh_from_db()
    assert timer.scheduled_for == datetime(2031, 5, 1, 10, 0, tzinfo=UTC)
    assert job.events.order_by("-id").first().kind == "timer_rescheduled"

    page = post(client, f"/admin/console/jobs/{job.pk}/timers/{timer.pk}/reschedule/", newest_event(job),
                scheduled_for="not a time").content.decode()
    assert "is not a date and time" in page

    Timer.objects.filter(pk=timer.pk).update(state="FIRED")
    page = post(client, f"/admin/console/jobs/{job.pk}/timers/{timer.pk}/run/", newest_event(job)).content.decode()
    assert "no longer pending" in page


def test_an_operator_cancels_a_wait_with_a_reason_and_its_timers_go_with_it(client, people):
    job, timer = waiting_with_timer()
    client.force_login(people["reviewer"])  # not an operator
    post(client, f"/admin/console/jobs/{job.pk}/cancel-wait/", newest_event(job))
    job.refresh_from_db()
    assert job.state == "WAITING_EXTERNAL"

    client.force_login(people["operator"])
    post(client, f"/admin/console/jobs/{job.pk}/cancel-wait/", newest_event(job), note="")
    job.refresh_from_db()
    assert job.state == "WAITING_EXTERNAL", "a reason is required"

    post(client, f"/admin/console/jobs/{job.pk}/cancel-wait/", newest_event(job))
    job.refresh_from_db()
    timer.refresh_from_db()
    assert job.state == "CANCELLED" and job.events.order_by("-id").first().actor == "otto"
    assert timer.state == "CANCELLED"


def test_another_tenants_operator_gets_404_for_timer_controls(client, people, tenants):
    from django.contrib.auth.models import Group

    from tests.factories import MembershipFactory

    job, timer = waiting_with_timer()
    stranger = MembershipFactory(user__username="olga", user__groups=[Group.objects.get(name="operators")],
                                 tenant=tenants[1], role="operator").user
    client.force_login(stranger)
    response = client.post(f"/admin/console/jobs/{job.pk}/timers/{timer.pk}/run/",
                           {"seen_event": newest_event(job), "note": "x"})
    assert response.status_code == 404


def test_the_header_counts_what_waits_for_the_signed_in_reviewer(client, people):
    make_job("r-1", "WAITING_REVIEW")
    make_job("r-2", "WAITING_REVIEW")
    make_job("r-3", "WAITING_REVIEW", tenant="acme")
    client.force_login(people["reviewer"])
    assert "2 waiting for your review" in client.get("/admin/").content.decode()
    client.force_login(people["other"])
    assert "1 waiting for your review" in client.get("/admin/").content.decode()
    client.force_login(people["viewer"])
    assert "waiting for your review" not in client.get("/admin/").content.decode()
