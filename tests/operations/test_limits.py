"""Effect limits and pauses where operations dispatch (operations.limits):
a job over its tenant's limit, or held by a pause, waits — visibly, with
the reason — and is sent once when the window opens or the pause lifts;
never dropped, never sent twice. Real workers, a real simulator."""

import signal

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.models import Job
from jobs.worker import Worker, WorkerConfig
from operations.limits import action_limit_set, action_pause, action_resume, window_full_since
from operations.models import ActionLimit, DispatchHold, Operation
from tests.support import ProcessOutput, wait_for

from .support import SEND_EMAIL, enqueue_email

pytestmark = pytest.mark.django_db(transaction=True)


def run_until_idle(**config) -> Worker:
    worker = Worker(WorkerConfig(until_idle=True, poll_interval=0.05, worker_id="w", **config))
    worker.run()
    return worker


def states() -> dict[str, str]:
    return dict(Job.objects.values_list("key", "state"))


def test_an_effect_over_its_limit_waits_with_the_reason_and_goes_out_once_the_window_opens(store, sim):
    action_limit_set(tenant="studio", action=SEND_EMAIL, max_effects=2, window_seconds=2, actor="otto")
    for n in range(3):
        enqueue_email(store, f"mail-{n}")
    run_until_idle()
    assert len(sim.messages()) == 2
    waiting = Job.objects.get(state="WAITING_EXTERNAL")
    assert waiting.wait_reason.startswith("effect limit: tenant studio allows 2 connectors.send_email per 2 s")
    assert waiting.wake_at is not None and waiting.attempts == 0  # waiting used up no attempt
    assert not Operation.objects.filter(job=waiting).exists()  # nothing was recorded, so nothing to reconcile

    wait_for(lambda: timezone.now() > waiting.wake_at, timeout=10, what="the window to open")
    run_until_idle()
    assert set(states().values()) == {"DONE"}
    messages = sim.messages()
    assert len(messages) == 3 and len({m["client_reference"] for m in messages}) == 3


def test_an_effect_limit_of_another_tenant_or_action_holds_nothing_back(store, sim):
    action_limit_set(tenant="other", action=SEND_EMAIL, max_effects=0, actor="otto")
    action_limit_set(tenant="studio", action="company.send_quote", max_effects=0, actor="otto")
    enqueue_email(store, "mail-1")
    run_until_idle()
    assert states() == {"mail-1": "DONE"}


def test_pausing_an_action_holds_undispatched_jobs_and_resuming_releases_them(store, sim):
    action_pause(tenant="studio", action=SEND_EMAIL, reason="provider incident", actor="otto")
    enqueue_email(store, "mail-1")
    enqueue_email(store, "mail-2")
    run_until_idle()
    assert sim.messages() == []
    held = Job.objects.get(key="mail-1")
    assert held.state == "WAITING_EXTERNAL" and held.attempts == 0
    assert "action connectors.send_email is paused for tenant studio: provider incident" in held.wait_reason
    assert DispatchHold.objects.filter(tenant="studio").count() == 2

    limit, released = action_resume(tenant="studio", action=SEND_EMAIL, actor="otto", note="provider back")
    assert released == 2 and not limit.paused
    assert set(states().values()) == {"READY"} and not DispatchHold.objects.exists()
    run_until_idle()
    assert set(states().values()) == {"DONE"} and len(sim.messages()) == 2


def test_a_paused_action_never_holds_an_operation_already_in_doubt(store, start_sim, provider):
    from .support import attempt, make_due

    stalling = start_sim("idempotent", stall_after_accept=3)
    provider(stalling, read_timeout=0.3)
    enqueue_email(store, "mail-1")
    attempt(store, key="mail-1")  # accepted, but the answer never arrived: UNKNOWN
    assert Operation.objects.get().state == "UNKNOWN"
    action_pause(tenant="studio", action=SEND_EMAIL, reason="incident", actor="otto")
    provider(stalling, read_timeout=5)

    def reconciled() -> bool:
        # While the first request still stalls at the provider, a resend under
        # its key answers "in progress" (409) and the job retries later.
        make_due("studio", "mail-1")
        run_until_idle()
        return states()["mail-1"] != "READY"

    wait_for(reconciled, timeout=30, interval=0.2, what="the operation in doubt to be reconciled")
    # The message may already be at the provider: it is reconciled, not held.
    assert states() == {"mail-1": "DONE"} and len(stalling.messages()) == 1


def test_a_window_is_full_from_its_limits_newest_intent_and_counts_only_its_tenant_and_action(store):
    from tests.factories import OperationFactory

    job = enqueue_email(store, "mail-1")
    for n in range(3):
        OperationFactory(job=job, tenant="studio", action=SEND_EMAIL, step=f"s{n}")
    OperationFactory(job=job, tenant="studio", action="company.send_quote", step="other")
    three = ActionLimit.objects.create(tenant="studio", action=SEND_EMAIL, max_effects=3, window_seconds=3600)
    oldest = Operation.objects.filter(action=SEND_EMAIL).order_by("created_at").first().created_at
    assert window_full_since(three, now=timezone.now()) == oldest
    four = ActionLimit(tenant="studio", action=SEND_EMAIL, max_effects=4, window_seconds=3600)
    assert window_full_since(four, now=timezone.now()) is None


@pytest.mark.postgres
def test_concurrent_workers_send_exactly_the_limit_and_the_rest_wait(store, start_sim, manage):
    sim = start_sim("idempotent")
    limit, jobs, workers = 5, 30, 4
    action_limit_set(tenant="studio", action=SEND_EMAIL, max_effects=limit, window_seconds=3600, actor="otto")
    # Twelve slots, idle and listening before the work arrives, all woken by
    # the one commit that makes it READY: they race for the limit at once
    # (workers started after the enqueue let the first one send alone).
    fleet = [ProcessOutput(manage.start("run_worker", "--worker-id", f"w{n}", "--concurrency", "3",
                                        "--poll-interval", "0.05", env={"PROVIDER_URL": sim.url}))
             for n in range(workers)]
    try:
        for worker in fleet:
            worker.wait_for("worker.start", timeout=60)
        with transaction.atomic():
            for n in range(jobs):
                enqueue_email(store, f"mail-{n:02}")
        wait_for(lambda: not Job.objects.filter(state__in=["READY", "LEASED"]).exists(), timeout=120,
                 what="every job sent or waiting")
    finally:
        for worker in fleet:
            worker.process.send_signal(signal.SIGTERM)
        outputs = [worker.finish(timeout=60) for worker in fleet]
    assert [worker.process.returncode for worker in fleet] == [0] * workers, outputs
    assert len(sim.messages()) == limit
    assert Job.objects.filter(state="DONE").count() == limit
    waiting = Job.objects.filter(state="WAITING_EXTERNAL")
    assert waiting.count() == jobs - limit
    assert all(j.wait_reason.startswith("effect limit:") and j.wake_at for j in waiting)
    assert Operation.objects.count() == limit
