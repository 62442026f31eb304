"""An effect limit of 0 allows no effect: the job is held — it waits, once,
without being claimed again and again — until an operator raises the limit,
which lets it go on at once. Real workers, a real simulator."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job, JobEvent
from operations.limits import action_limit_set
from operations.models import DispatchHold

from .support import SEND_EMAIL, enqueue_email
from .test_limits import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("raised", [1, None], ids=["raised", "removed"])
def test_a_limit_of_0_holds_the_job_until_it_is_raised(store, sim, settings, raised):
    settings.OPERATIONS_HOLD_RECHECK_SECONDS = 300
    action_limit_set(tenant="studio", action=SEND_EMAIL, max_effects=0, actor="otto")
    enqueue_email(store, "mail-1")
    run_until_idle()
    run_until_idle()  # a second worker finds nothing due: the job does not cycle
    job = Job.objects.get(key="mail-1")
    assert job.state == "WAITING_EXTERNAL" and job.attempts == 0 and sim.messages() == []
    assert "allows no connectors.send_email" in job.wait_reason and "raises the limit" in job.wait_reason
    assert job.wake_at > timezone.now() + timedelta(seconds=200)  # the re-check, not a second from now
    assert JobEvent.objects.filter(job=job, kind="wait").count() == 1

    action_limit_set(tenant="studio", action=SEND_EMAIL, max_effects=raised, actor="otto")
    assert Job.objects.get(key="mail-1").state == "READY" and not DispatchHold.objects.exists()
    run_until_idle()
    assert Job.objects.get(key="mail-1").state == "DONE" and len(sim.messages()) == 1


def test_lowering_a_limit_to_0_releases_nothing(store, sim):
    action_limit_set(tenant="studio", action=SEND_EMAIL, max_effects=0, actor="otto")
    enqueue_email(store, "mail-1")
    run_until_idle()
    action_limit_set(tenant="studio", action=SEND_EMAIL, max_effects=0, window_seconds=60, actor="otto")
    assert Job.objects.get(key="mail-1").state == "WAITING_EXTERNAL"
