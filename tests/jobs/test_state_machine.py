"""Random sequences of Store calls against a simple model of the transition
table: legal calls land exactly as the model says; illegal ones (a stale
fence, a transition not in the table) raise and change nothing."""

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from jobs.errors import Conflict, InvalidTransition
from jobs.models import Job, JobEvent
from jobs.retry import DEFAULT_POLICY
from jobs.store import Store

KEYS = ["k0", "k1"]
WORKERS = ["w1", "w2"]
TENANT = "t"
MAX_ATTEMPTS = 3


@dataclass
class ModelJob:
    state: str = "READY"
    epoch: int = 0
    worker: str = ""
    attempts: int = 0
    recoveries: int = 0
    lease_until: float | None = None
    next_attempt_at: float | None = None  # None: at once
    history: int = 1  # events written (enqueue)

    def due(self, now):
        return self.state == "READY" and (self.next_attempt_at is None or self.next_attempt_at <= now)

    def holds(self, worker, epoch):
        return self.state == "LEASED" and self.worker == worker and self.epoch == epoch


def row(key):
    job = Job.objects.get(tenant=TENANT, key=key)
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields if f.attname != "updated_at"}


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        Job.objects.all().delete()
        self.store = Store()
        self.now = 1000.0
        self.jobs: dict[str, ModelJob] = {}

    # ---- helpers
    def expect_refused(self, key, exc, call):
        before = (row(key), JobEvent.objects.count())
        with pytest.raises(exc):
            call()
        assert (row(key), JobEvent.objects.count()) == before

    def lease(self, key, worker, ttl):
        m = self.jobs[key]
        m.state, m.epoch, m.worker = "LEASED", m.epoch + 1, worker
        m.attempts += 1
        m.lease_until = self.now + ttl
        m.history += 1

    # ---- rules
    @rule(dt=st.sampled_from([0.5, 5, 20, 40]))
    def advance_clock(self, dt):
        self.now += dt

    @rule(key=st.sampled_from(KEYS))
    def enqueue(self, key):
        self.store.enqueue(TENANT, key, max_attempts=MAX_ATTEMPTS, now=self.now)
        self.jobs.setdefault(key, ModelJob())

    @rule(key=st.sampled_from(KEYS), worker=st.sampled_from(WORKERS), ttl=st.sampled_from([10, 30]))
    def claim(self, key, worker, ttl):
        if key not in self.jobs:
            return
        m = self.jobs[key]
        expired = m.state == "LEASED" and m.lease_until <= self.now
        epoch = self.store.claim(TENANT, key, worker, now=self.now, ttl=ttl)
        if m.due(self.now) or expired:
            assert epoch == m.epoch + 1
            if expired:
                m.recoveries += 1
            self.lease(key, worker, ttl)
        else:
            assert epoch is None

    @rule(worker=st.sampled_from(WORKERS))
    def claim_next(self, worker):
        job = self.store.claim_next(worker, now=self.now, ttl=30)
        eligible = [k for k, m in self.jobs.items() if m.due(self.now)]
        if not eligible:
            assert job is None
            return
        assert job is not None and job.key in eligible
        self.lease(job.key, worker, 30)
        assert job.lease_epoch == self.jobs[job.key].epoch

    @rule(key=st.sampled_from(KEYS), fence=st.sampled_from(["holder", "holder", "holder", "stale", "other"]),
          op=st.sampled_from(["renew", "finish", "wait_external", "wait_review", "fail_transient",
                              "fail_permanent", "fail_auth", "release"]))
    def fenced_write(self, key, fence, op):
        if key not in self.jobs:
            return
        m = self.jobs[key]
        worker = m.worker or "w1"
        epoch = m.epoch - 1 if fence == "stale" else m.epoch
        if fence == "other":
            worker = next(w for w in WORKERS if w != worker)
        s, now = self.store, self.now
        calls = {
            "renew": lambda: s.renew(TENANT, key, worker, epoch, ttl=30, now=now),
            "finish": lambda: s.finish(TENANT, key, worker, epoch, now=now),
            "wait_external": lambda: s.wait(TENANT, key, worker, epoch, reason="reply", now=now),
            "wait_review": lambda: s.wait(TENANT, key, worker, epoch, state="WAITING_REVIEW", reason="r", now=now),
            "fail_transient": lambda: s.fail(TENANT, key, worker, epoch, error="e", now=now),
            "fail_permanent": lambda: s.fail(TENANT, key, worker, epoch, error="e", failure="permanent", now=now),
            "fail_auth": lambda: s.fail(TENANT, key, worker, epoch, error="e", failure="auth", now=now),
            "release": lambda: s.release(TENANT, key, worker, epoch, reason="shutdown", now=now),
        }
        if not m.holds(worker, epoch):
            self.expect_refused(key, Conflict, calls[op])
            return
        calls[op]()
        if op == "renew":
            m.lease_until = now + 30
            return
        m.history += 1
        m.lease_until = None
        if op == "finish":
            m.state = "DONE"
        elif op == "wait_external":
            m.state = "WAITING_EXTERNAL"
        elif op == "wait_review" or op == "fail_permanent":
            m.state = "WAITING_REVIEW"
        elif op == "fail_auth":
            m.state = "NEEDS_ATTENTION"
        elif op == "release":
            m.state, m.attempts, m.next_attempt_at = "READY", m.attempts - 1, None
        elif op == "fail_transient":
            if m.attempts >= MAX_ATTEMPTS:
                m.state = "NEEDS_ATTENTION"
            else:
                m.state = "READY"
                actual = Job.objects.get(tenant=TENANT, key=key).next_attempt_at.timestamp()
                assert now <= actual <= now + DEFAULT_POLICY.backoff_cap(m.attempts) + 1e-3
                m.next_attempt_at = actual

    @rule(key=st.sampled_from(KEYS), worker=st.sampled_from(WORKERS),
          op=st.sampled_from(["fail_transient"] * 3 + ["finish", "wait_external", "fail_permanent", "fail_auth"]))
    def work_cycle(self, key, worker, op):
        """What a worker does: time passes, it claims the job and reports."""
        self.advance_clock(5)
        self.claim(key, worker, 30)
        if key in self.jobs and self.jobs[key].state == "LEASED":
            self.fenced_write(key, "holder", op)

    # Terminal decisions are drawn less often so sequences reach deep states.
    @rule(key=st.sampled_from(KEYS),
          op=st.sampled_from(["resume"] * 4 + ["retry"] * 2 + ["resolve", "cancel", "escalate"]))
    def decision(self, key, op):
        if key not in self.jobs:
            return
        m = self.jobs[key]
        allowed = {
            "resume": ({"WAITING_EXTERNAL", "WAITING_REVIEW"}, "READY"),
            "retry": ({"NEEDS_ATTENTION", "WAITING_REVIEW"}, "READY"),
            "resolve": ({"NEEDS_ATTENTION", "WAITING_REVIEW"}, "DONE"),
            "cancel": ({"READY", "NEEDS_ATTENTION", "WAITING_EXTERNAL", "WAITING_REVIEW"}, "CANCELLED"),
            "escalate": ({"READY", "WAITING_EXTERNAL", "WAITING_REVIEW"}, "NEEDS_ATTENTION"),
        }
        sources, target = allowed[op]
        call = lambda: getattr(self.store, op)(TENANT, key, reason="test", actor="op", now=self.now)  # noqa: E731
        if m.state not in sources:
            self.expect_refused(key, InvalidTransition, call)
            return
        call()
        m.state, m.history = target, m.history + 1
        if target == "READY":
            m.next_attempt_at = None
        if op == "retry":
            m.attempts = m.recoveries = 0

    @rule()
    def recover(self):
        recovered = {r.key: r.to_state for r in self.store.recover_expired(limit=10, now=self.now)}
        expected = {}
        for key, m in self.jobs.items():
            if m.state == "LEASED" and m.lease_until <= self.now:
                m.recoveries += 1
                spent = m.attempts >= MAX_ATTEMPTS or m.recoveries > DEFAULT_POLICY.max_recoveries
                m.state = "NEEDS_ATTENTION" if spent else "READY"
                m.next_attempt_at, m.lease_until = None, None
                m.history += 1
                expected[key] = m.state
        assert recovered == expected

    @invariant()
    def database_matches_model(self):
        for key, m in self.jobs.items():
            actual = row(key)
            assert actual["state"] == m.state, key
            assert actual["lease_epoch"] == m.epoch, key
            assert actual["attempts"] == m.attempts, key
            if m.state == "LEASED":
                assert actual["worker_id"] == m.worker
                assert actual["lease_until"].timestamp() == pytest.approx(m.lease_until)
            assert JobEvent.objects.filter(job_id=actual["id"]).count() == m.history, key


@pytest.mark.django_db
def test_random_store_call_sequences_follow_the_transition_table():
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
