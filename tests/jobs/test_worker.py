"""The worker runtime: outcomes, heartbeats, fence loss, timeouts, signals.

In-process workers (threads, real database connections) for the runtime's
logic; real `manage.py run_worker` processes for SIGKILL and SIGTERM.
"""

import os
import signal
import threading
import time

import pytest

from jobs.errors import Conflict
from jobs.metrics import WORKER_REGISTRY
from jobs.models import Job
from jobs.store import JobSpec, Store
from jobs.worker import Worker, WorkerConfig
from tests.support import ProcessOutput, lease_expired, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def run_until_idle(**config) -> Worker:
    worker = Worker(WorkerConfig(until_idle=True, poll_interval=0.05, **config))
    worker.run()
    return worker


def job(key, tenant="studio"):
    return Job.objects.get(tenant=tenant, key=key)


def test_worker_runs_jobs_until_idle_and_counts_outcomes(store):
    for i in range(10):
        store.enqueue("studio", f"noop-{i}")
    store.enqueue("studio", "mystery", action="nobody.handles.this")
    store.enqueue("studio", "wait", action="test.wait")
    worker = run_until_idle(worker_id="w1", concurrency=3)
    assert Job.objects.filter(state="DONE").count() == 10
    assert job("mystery").state == "NEEDS_ATTENTION"
    assert "no handler is registered for action 'nobody.handles.this'" in job("mystery").last_error
    assert (job("wait").state, job("wait").wait_reason) == ("WAITING_EXTERNAL", "waiting for the customer's reply")
    assert worker.stats["claimed"] == 12 and worker.stats["done"] == 10
    assert worker.stats["attention"] == 1 and worker.stats["waiting"] == 1


@pytest.mark.parametrize("batch", [1, 10])
def test_a_handler_is_timed_whether_it_returns_or_raises(store, batch):
    def count(action):
        return WORKER_REGISTRY.get_sample_value("durable_handler_duration_seconds_count", {"action": action}) or 0

    before = count("jobs.noop"), count("test.fail")
    store.enqueue("studio", "fine")
    store.enqueue("studio", "bad", action="test.fail", payload={"kind": "permanent"})
    run_until_idle(worker_id="w1", batch=batch)
    assert job("bad").state == "WAITING_REVIEW" and job("fine").state == "DONE"
    assert (count("jobs.noop"), count("test.fail")) == (before[0] + 1, before[1] + 1)


def test_auth_error_is_never_attempted_twice(store):
    store.enqueue("studio", "auth", action="test.fail", payload={"kind": "auth"})
    for _ in range(3):
        run_until_idle(worker_id="w1")
    j = job("auth")
    assert (j.state, j.attempts) == ("NEEDS_ATTENTION", 1)
    assert list(j.events.exclude(claimed_at=None).values_list("kind", flat=True)) == ["fail"]  # one attempt
    assert "401" in j.last_error and "not retried" in j.last_error


def test_permanent_error_lands_in_review_with_the_reason(store):
    store.enqueue("studio", "bad", action="test.fail", payload={"kind": "permanent"})
    run_until_idle(worker_id="w1")
    j = job("bad")
    assert j.state == "WAITING_REVIEW"
    assert "recipient 'bob' has no @" in j.wait_reason
    assert list(j.events.exclude(claimed_at=None).values_list("kind", flat=True)) == ["fail"]  # one attempt


@pytest.mark.parametrize("kind", ["transient", "crash"])
def test_transient_failures_retry_with_backoff_then_need_attention(store, kind):
    store.enqueue("studio", "flaky", action="test.fail", payload={"kind": kind})

    def run_until_it_settles():
        run_until_idle(worker_id="w1")
        flaky = job("flaky")
        if flaky.state == "READY":
            # Retried after a backoff: the worker stopped while it was not yet due. Its backoff
            # has passed (it is due from the database's clock on).
            assert flaky.next_attempt_at is not None
            Job.objects.filter(pk=flaky.pk).update(next_attempt_at=None)
        return flaky.state != "READY"

    wait_for(run_until_it_settles, timeout=60, interval=0, what="the flaky job to run out of attempts")
    j = job("flaky")
    assert (j.state, j.attempts) == ("NEEDS_ATTENTION", 3)
    kinds = list(j.events.values_list("kind", "to_state"))
    assert kinds.count(("fail", "READY")) == 2 and kinds[-1] == ("fail", "NEEDS_ATTENTION")
    assert "gave up after 3 attempts" in j.last_error


def _in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_heartbeat_keeps_a_long_handlers_lease_alive_past_several_ttls(store):
    store.enqueue("studio", "long", action="test.sleep", payload={"seconds": 2.4})
    worker = Worker(WorkerConfig(worker_id="w1", lease_ttl=0.6, until_idle=True, poll_interval=0.05))
    thread = _in_thread(worker)
    wait_for(lambda: job("long").state == "LEASED")
    thief = Store()

    def done_and_never_taken_over():
        # Four TTLs go by; the lease never expires, so nobody can take the job over.
        assert thief.claim("studio", "long", "thief") is None
        return job("long").state == "DONE"

    wait_for(done_and_never_taken_over, timeout=30, interval=0.1, what="the long handler to finish")
    thread.join(timeout=20)
    j = job("long")
    assert (j.state, j.lease_epoch, j.result) == ("DONE", 1, {"slept": 2.4})


def test_fence_loss_cancels_the_handler_and_its_result_is_discarded(store):
    store.enqueue("studio", "stolen", action="test.sleep", payload={"seconds": 10})
    worker = Worker(WorkerConfig(worker_id="w1", lease_ttl=0.6, until_idle=True, poll_interval=0.05))
    thread = _in_thread(worker)
    wait_for(lambda: job("stolen").state == "LEASED")
    # Simulate a partition: the lease looks expired to everyone else and a
    # second worker takes the job over.
    Job.objects.filter(key="stolen").update(lease_until="2000-01-01T00:00:00Z")
    assert Store().claim("studio", "stolen", "thief", ttl=60) == 2
    thread.join(timeout=10)
    assert not thread.is_alive()
    j = job("stolen")
    assert (j.state, j.lease_epoch, j.worker_id) == ("LEASED", 2, "thief")
    assert not j.events.filter(kind="finish").exists()
    assert worker.stats["lost"] >= 1 and worker.stats["done"] == 0


def test_handler_past_its_timeout_is_no_longer_renewed_and_is_taken_over(store):
    store.enqueue("studio", "stuck", action="test.sleep_with_timeout", payload={"seconds": 2.5})
    worker = Worker(WorkerConfig(worker_id="w1", lease_ttl=0.6, until_idle=True, poll_interval=0.05))
    thread = _in_thread(worker)
    wait_for(lambda: job("stuck").state == "LEASED")
    # Timeout 0.5 s, ttl 0.6 s: well before the handler returns, the lease lapses.
    epoch = wait_for(lambda: Store().claim("studio", "stuck", "rescuer", ttl=60), timeout=2.0)
    assert epoch == 2
    thread.join(timeout=10)
    j = job("stuck")
    assert (j.state, j.worker_id) == ("LEASED", "rescuer")
    assert not j.events.filter(kind="finish").exists()


def test_sigkill_mid_handler_then_another_worker_recovers_the_job(store, manage):
    store.enqueue("studio", "killed", action="test.sleep", payload={"seconds": 60, "first_attempt_only": True})
    victim = manage.start("run_worker", "--worker-id", "victim", "--lease-ttl", "1")
    try:
        wait_for(lambda: job("killed").state == "LEASED")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            victim.kill()
    old = job("killed")
    assert (old.worker_id, old.lease_epoch) == ("victim", 1)
    wait_for(lambda: lease_expired("studio", "killed"), what="the dead worker's lease to expire")
    result = manage.run("run_worker", "--worker-id", "rescuer", "--until-idle", "--lease-ttl", "1")
    assert "job.recovered" in result.stdout
    j = job("killed")
    assert (j.state, j.lease_epoch, j.worker_id) == ("DONE", 2, "rescuer")
    # The dead worker's late writes, with its old epoch, are fenced out.
    for late_write in (
        lambda: store.finish("studio", "killed", "victim", 1),
        lambda: store.fail("studio", "killed", "victim", 1, error="late"),
        lambda: store.renew("studio", "killed", "victim", 1),
    ):
        with pytest.raises(Conflict):
            late_write()
    assert job("killed").state == "DONE"


def sigterm_while_running(store, manage, key, *, seconds, grace, ttl):
    """Start a worker on one sleeping job, SIGTERM it mid-handler; return
    (exit code, output, seconds from signal to exit)."""
    store.enqueue("studio", key, action="test.sleep", payload={"seconds": seconds})
    proc = manage.start("run_worker", "--worker-id", "w1", "--grace", str(grace), "--lease-ttl", str(ttl))
    wait_for(lambda: job(key).state == "LEASED")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    return proc.returncode, out, time.monotonic() - started


def test_sigterm_lets_a_running_handler_finish_within_the_grace_period(store, manage):
    code, out, elapsed = sigterm_while_running(store, manage, "short", seconds=1.0, grace=10, ttl=5)
    assert code == 0, out
    assert elapsed < 10
    assert job("short").state == "DONE"
    assert "worker.stopping" in out and "worker.stop " in out and "done=1" in out


def test_sigterm_past_the_grace_period_exits_0_and_leaves_the_job_to_expire(store, manage):
    code, out, elapsed = sigterm_while_running(store, manage, "long", seconds=30, grace=1, ttl=2)
    assert code == 0, out
    assert elapsed < 5
    assert "job.abandoned" in out
    assert job("long").state == "LEASED"  # not finished, not half-written
    wait_for(lambda: lease_expired("studio", "long"), what="the abandoned lease to expire")
    recovered = Store().recover_expired()
    assert [(r.key, r.to_state) for r in recovered] == [("long", "READY")]


def test_second_signal_exits_at_once(store, manage):
    store.enqueue("studio", "long", action="test.sleep", payload={"seconds": 30})
    proc = manage.start("run_worker", "--worker-id", "w1", "--grace", "60")
    output = ProcessOutput(proc)
    wait_for(lambda: job("long").state == "LEASED")
    proc.send_signal(signal.SIGTERM)
    output.wait_for("worker.stopping")  # the first signal was handled: now the second
    proc.send_signal(signal.SIGTERM)
    # "At once" against a 60 s grace period; generous for a loaded machine.
    out = output.finish(timeout=20)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "worker.kill" in out


def test_tenant_and_action_filters_limit_what_a_worker_claims(store, manage):
    store.enqueue("studio", "a")
    store.enqueue("bakery", "b")
    store.enqueue("bakery", "c", action="test.wait")
    manage.run("run_worker", "--until-idle", "--tenant", "bakery", "--action", "jobs.noop")
    assert [(j.key, j.state) for j in Job.objects.order_by("key")] == [("a", "READY"), ("b", "DONE"), ("c", "READY")]


def test_json_log_lines_carry_the_job_identity(store, manage):
    import json

    store.enqueue("studio", "logged")
    out = manage.run("run_worker", "--until-idle", "--worker-id", "w-json", "--log-format", "json").stdout
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    done = next(e for e in events if e["event"] == "job.done")
    assert (done["tenant"], done["key"], done["epoch"], done["worker"]) == ("studio", "logged", 1, "w-json")
    assert events[0]["event"] == "worker.start" and events[-1]["event"] == "worker.stop"


def test_bad_options_are_refused_with_a_clear_error(manage):
    result = manage.run("run_worker", "--concurrency", "0", check=False)
    assert result.returncode != 0 and "argument --concurrency: must be a whole number at least 1" in result.stderr


def test_a_failing_periodic_task_is_logged_and_the_worker_carries_on(store):
    from jobs import periodic

    def broken(**kwargs):
        raise ValueError("malformed row")

    periodic.register(periodic.PeriodicTask("test.broken", broken, every=0))
    try:
        store.enqueue("studio", "still-runs")
        w = run_until_idle(worker_id="w1")
    finally:
        periodic.unregister("test.broken")
    assert job("still-runs").state == "DONE"
    assert w.stats["task_errors"] >= 1


def test_a_deferred_job_waits_with_its_reason_hands_its_attempt_back_and_runs_when_due(store):
    until = time.time() + 1.0
    store.enqueue("studio", "held", action="test.deferred", payload={"until": until})
    run_until_idle(worker_id="w1")
    held = job("held")
    assert held.state == "WAITING_EXTERNAL" and held.wait_reason == f"a window opens at {until}"
    assert held.wake_at is not None and held.attempts == 0 and held.first_attempt_at is None
    wait_for(lambda: time.time() > until + 0.1, timeout=5, what="the window to open")
    run_until_idle(worker_id="w2")
    done = job("held")
    assert done.state == "DONE" and done.result == {"ran": True} and done.attempts == 1
    kinds = list(done.events.values_list("kind", flat=True))
    assert kinds == ["enqueue", "wait", "resume", "finish"]
    # Both attempts' rows carry their claims, each before its end.
    for event in done.events.exclude(claimed_at=None):
        assert event.claimed_at <= event.created_at


class _SlowToWake(threading.Condition):
    """A slot thread the scheduler runs late: woken, it takes half a second
    to get back to claiming (as on a loaded machine), still counted idle."""

    def wait(self, timeout=None):
        woke = super().wait(timeout)
        self.release()
        try:
            time.sleep(0.5)
        finally:
            self.acquire()
        return woke


def test_until_idle_waits_for_a_slot_to_claim_the_work_housekeeping_just_made_ready(store):
    """The main thread's housekeeping ends a wait (the job is READY) and wakes
    the slots; `--until-idle` must not take a slot that has not yet claimed
    since for an idle one and stop, leaving the job READY."""
    store.enqueue("studio", "woken")
    epoch = store.claim("studio", "woken", "w0")
    store.wait("studio", "woken", "w0", epoch, reason="a reply or the reminder", wake_at=time.time() - 1)
    class SlotFirst(Worker):
        def _maintain(self, **kwargs):
            # The slot has looked (and found nothing: the job waits) before
            # the housekeeping ends the wait.
            wait_for(lambda: self._idle_slots == self.config.concurrency, timeout=30, what="the slot to go idle")
            return super()._maintain(**kwargs)

    worker = SlotFirst(WorkerConfig(worker_id="w1", until_idle=True, poll_interval=0.05))
    worker._work = _SlowToWake()
    worker.run()
    assert job("woken").state == "DONE"
    assert worker.stats["claimed"] == 1


def test_a_worker_forgets_when_a_lease_runs_out_once_the_job_s_success_is_written(store):
    """The worker notes when each lease it holds runs out (to know how long
    a write in doubt may be retried). Kept until a sweep, the note of every
    job claimed in the last two lease lengths would stay, and a claim that
    sweeps would copy them all. A written success leaves no note behind."""
    store.enqueue_many(JobSpec("studio", f"many-{i}") for i in range(120))
    worker = run_until_idle(worker_id="w1", concurrency=2)
    assert Job.objects.filter(state="DONE").count() == 120
    assert worker.completer._lease_ends == {}


def test_each_action_s_handler_time_is_observed_under_its_own_name(store):
    from jobs.metrics import HANDLER_DURATION

    def observed(action):
        return next(sample.value for metric in HANDLER_DURATION.collect() for sample in metric.samples
                    if sample.name.endswith("_count") and sample.labels == {"action": action})

    for name in ("jobs.noop", "test.wait"):
        HANDLER_DURATION.labels(name)  # (a child to read before the first observation)
    before = {name: observed(name) for name in ("jobs.noop", "test.wait")}
    for i in range(3):
        store.enqueue("studio", f"noop-{i}")
    store.enqueue("studio", "wait", action="test.wait")
    run_until_idle(worker_id="w1", batch=2)
    assert observed("jobs.noop") - before["jobs.noop"] == 3
    assert observed("test.wait") - before["test.wait"] == 1
