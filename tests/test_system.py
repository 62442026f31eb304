"""The system's invariants, checked together (DESIGN §19).

A model-based test over the public services of several parts at once: jobs
enqueued by code (`jobs.store.Store`), an agent's proposals
(`company.proposal_submit`) under a two-approver review policy, reviewers'
single decisions (`review.decisions`) and bulk decisions (`review.bulk`),
workers claiming and running jobs (the Store, the handlers, the outbox
relay, the timers), emails through the operation protocol to the provider
simulator (idempotent mode), invoices and their daily reminder plan
(`company.services`), retention sweeps with the clock advanced
(`jobs.retention`) — and a lost commit: the database rolled back to an
earlier snapshot of one job and its operations, as a failover to an
asynchronous replica does (rows created after the snapshot are gone, the
job row's columns are as they were; the provider keeps what it received).

After every step the outcomes are checked, never the implementation:
- one message at the provider per business intent (an email's recipient
  and subject, an invoice's reminder), whatever was rolled back or swept;
- a payload released under the two-approver policy was approved by two
  distinct reviewers of the current stay in review, each having seen that
  very payload (a correction restarts the approvals);
- a bulk batch that says it is done says what happened to each of its
  items, and "decided" counts the items it took out of the queue; a batch
  cut off half-way (the request killed on an item) can be taken again;
- every job has its search row, its state is the one its newest history
  row records (a claim and a successful end may keep their evidence on the
  row), and a finished job stays finished.

Rule groups can be chosen with SYSTEM_TEST_RULES (comma-separated, see
`GROUPS`), to check that each invariant is reached by its own rules.
Profiles (tests/conftest.py): `ci` is bounded, `make test-deep` explores far
longer; `make test-system` runs this file alone.
"""

import os
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.http import Http404
from django.utils import timezone
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from company.models import Invoice
from company.review_policy import review_policy_set
from company.services import (
    customer_ensure,
    invoice_issue,
    invoice_reminder_plan,
    proposal_submit,
    tenant_ensure,
)
from jobs.access import REVIEW_QUEUE, DecisionRefused
from jobs.errors import JobError
from jobs.models import DecisionBatch, Job, JobEvent, JobSearch
from jobs.outbox import outbox_relay
from jobs.retention import retention_sweep
from jobs.states import State
from jobs.store import Store
from jobs.timers import timer_fire_due
from operations.models import Operation, OperationEvent, Receipt
from review import bulk, decisions
from tests.company.support import run_one
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db

SEND_EMAIL = "connectors.send_email"
AGENT = "agent:system-test"
REVIEWERS = ("rita", "rosa", "remy")
FINISHED = (State.DONE, State.CANCELLED)
# Rule groups; SYSTEM_TEST_RULES picks some (default: all).
GROUPS = ("enqueue", "proposals", "corrections", "bulk", "lost_commit", "invoices", "retention")
_chosen = {g.strip() for g in os.environ.get("SYSTEM_TEST_RULES", "").split(",") if g.strip()}
if _chosen - set(GROUPS):
    raise pytest.UsageError(f"SYSTEM_TEST_RULES: unknown groups {sorted(_chosen - set(GROUPS))}; "
                            f"choose from {', '.join(GROUPS)}")
ENABLED = _chosen or set(GROUPS)


def enabled(group: str):
    return precondition(lambda self: group in ENABLED)


class Killed(BaseException):
    """The request deciding a bulk batch died (a killed process, a lost
    connection): nothing after it in that request runs."""


def killed_on_item(n: int):
    """Kill the bulk request when it reaches its `n`-th item (1-based): the
    items before it were decided in their own transactions, the rest never."""
    originals = {queue: dict(services) for queue, services in bulk.BULK_DECISIONS.items()}
    calls = Counter()

    def wrap(service):
        def dying(**kwargs):
            calls["items"] += 1
            if calls["items"] == n:
                raise Killed(f"the request died on item {n}")
            return service(**kwargs)
        return dying

    class Patch:
        def __enter__(self):
            for queue, services in bulk.BULK_DECISIONS.items():
                for name, service in services.items():
                    services[name] = wrap(service)

        def __exit__(self, *exc):
            for queue, services in originals.items():
                bulk.BULK_DECISIONS[queue].update(services)
            return isinstance(exc[1], Killed)

    return Patch()


def newest_event(job_id: int) -> JobEvent | None:
    return JobEvent.objects.filter(job_id=job_id).order_by("-id").first()


def stays_in_review(job_id: int) -> int:
    """How many times the job entered review (each entry starts a stay)."""
    return (JobEvent.objects.filter(job_id=job_id, to_state=State.WAITING_REVIEW)
            .exclude(from_state=State.WAITING_REVIEW).count())


class SystemMachine(RuleBasedStateMachine):
    snapshots = Bundle("snapshots")

    def __init__(self):
        super().__init__()
        SystemMachine.examples += 1
        self.tenant_slug = f"sys{SystemMachine.examples}"
        self.offset = timedelta(0)
        self.proposed = 0
        self.invoices: list[int] = []
        # job id → {reviewer: the payload they approved} of the current stay, since the last correction
        self.approvals: dict[int, dict[str, dict]] = {}
        self.stay: dict[int, int] = {}
        self.finished: dict[int, str] = {}  # job id → the terminal state it reached
        self.interrupted: list[str] = []  # tokens of bulk batches cut off half-way
        self.rolled_back: set[int] = set()  # jobs a lost commit took back to an earlier snapshot
        self.store = Store()

    examples = 0
    sim = None  # the provider simulator (set by the test)

    # ------------------------------------------------------------ set-up

    @initialize()
    def set_up(self):
        self.tenant = tenant_ensure(slug=self.tenant_slug)
        review_policy_set(tenant=self.tenant, action=SEND_EMAIL, approvals=2)
        reviewers = Group.objects.get(name="reviewers")
        self.users = [MembershipFactory(user__username=f"{self.tenant_slug}-{name}", user__groups=[reviewers],
                                        tenant=self.tenant).user for name in REVIEWERS]

    def now(self):
        return timezone.now() + self.offset

    def jobs(self, **filters):
        return list(Job.objects.filter(tenant=self.tenant_slug, **filters).order_by("id"))

    # ------------------------------------------------------------ proposals and decisions

    @enabled("proposals")
    @rule()
    def propose(self):
        self.proposed += 1
        n = self.proposed
        proposal_submit(tenant=self.tenant, proposed_by=AGENT, action=SEND_EMAIL, job_key=f"mail-{n}",
                        rationale="the customer asked for it",
                        payload={"to": f"c{n}@{self.tenant_slug}.example", "subject": f"Hello {n}",
                                 "body": "Your order shipped."})

    @enabled("enqueue")
    @rule(target=snapshots)
    def enqueue(self):
        """Code (not an agent) enqueues an email: it runs without review. A
        replica that has the job as it was just now is kept (a snapshot)."""
        self.proposed += 1
        n = self.proposed
        self.store.enqueue(self.tenant_slug, f"mail-{n}", action=SEND_EMAIL,
                           payload={"to": f"c{n}@{self.tenant_slug}.example", "subject": f"Hello {n}",
                                    "body": "Your invoice is attached."})
        return self._snapshot(Job.objects.get(tenant=self.tenant_slug, key=f"mail-{n}"))

    def _reviewing(self, job: Job) -> dict[str, dict]:
        stay = stays_in_review(job.pk)
        if self.stay.get(job.pk) != stay:
            self.stay[job.pk], self.approvals[job.pk] = stay, {}
        return self.approvals[job.pk]

    def _decide(self, which: int, reviewer: int, decide) -> None:
        waiting = self.jobs(state=State.WAITING_REVIEW, action=SEND_EMAIL)
        if not waiting:
            return
        job = waiting[which % len(waiting)]
        approvals = self._reviewing(job)
        seen = newest_event(job.pk)
        user = self.users[reviewer]
        try:
            decide(job, user, seen.id if seen else None, approvals)
        except (DecisionRefused, JobError, Http404):
            return
        self._released(job.pk)

    def _released(self, job_id: int) -> None:
        """A job that left review by an approval: two distinct reviewers of
        this stay approved exactly the payload it now carries."""
        job = Job.objects.get(pk=job_id)
        if job.state == State.WAITING_REVIEW or job.state in FINISHED and job.state != State.DONE:
            return
        approvers = sorted(u for u, payload in self.approvals[job_id].items() if payload == job.payload)
        assert len(set(approvers)) >= 2, (
            f"{job.key} was released with payload {job.payload} under a two-approver policy, approved by "
            f"{approvers or 'nobody'} (approvals this stay: {self.approvals[job_id]})")

    @enabled("proposals")
    @rule(which=st.integers(0, 3), reviewer=st.integers(0, len(REVIEWERS) - 1))
    def approve(self, which, reviewer):
        def run(job, user, seen, approvals):
            decisions.job_approve(job_id=job.pk, user=user, note="looks right", seen_event=seen)
            approvals[user.get_username()] = job.payload

        self._decide(which, reviewer, run)

    @enabled("proposals")
    @rule(which=st.integers(0, 3), reviewer=st.integers(0, len(REVIEWERS) - 1))
    def reject(self, which, reviewer):
        def run(job, user, seen, approvals):
            decisions.job_reject(job_id=job.pk, user=user, note="not needed", seen_event=seen)

        self._decide(which, reviewer, run)

    @enabled("corrections")
    @rule(which=st.integers(0, 3), reviewer=st.integers(0, len(REVIEWERS) - 1))
    def correct(self, which, reviewer):
        def run(job, user, seen, approvals):
            payload = job.payload
            # The subject names the correction: each corrected email is its own intent at the provider.
            subject = f"{payload['subject']} (corrected by {user.get_username()})"
            changed = decisions.job_correct_and_approve(
                job_id=job.pk, user=user, note="a clearer subject", seen_event=seen,
                data={"correct-to": payload["to"], "correct-subject": subject, "correct-body": payload["body"]})
            # A correction restarts the approvals: only its author has seen the new payload.
            approvals.clear()
            approvals[user.get_username()] = changed.payload

        self._decide(which, reviewer, run)

    @enabled("bulk")
    @rule(reviewer=st.integers(0, len(REVIEWERS) - 1), decision=st.sampled_from(["approve", "reject"]),
          kill_on=st.one_of(st.none(), st.integers(1, 3)))
    def bulk_decide(self, reviewer, decision, kill_on):
        user = self.users[reviewer]
        waiting = Job.objects.filter(tenant=self.tenant_slug, state=REVIEW_QUEUE)
        for job in waiting:
            self._reviewing(job)
        seen_payloads = {job.pk: job.payload for job in waiting}
        batch, _ = bulk.batch_preview(user=user, queue=REVIEW_QUEUE, jobs=waiting, query={})
        if not batch.items:
            return
        if kill_on is not None and kill_on <= len(batch.items):
            with killed_on_item(kill_on):
                self._take(batch.token, user, decision, seen_payloads)
            self.interrupted.append((batch.token, reviewer, decision, seen_payloads))
        else:
            self._take(batch.token, user, decision, seen_payloads)

    def _take(self, token, user, decision, seen_payloads):
        try:
            batch = bulk.batch_take(token=token, user=user, decision=decision, note="bulk: checked the list")
        finally:
            self._bulk_approvals(token, user, decision, seen_payloads)
        return batch

    def _bulk_approvals(self, token, user, decision, seen_payloads):
        """What the batch's approvals recorded, item by item, from the jobs' history."""
        if decision != "approve":
            return
        batch = DecisionBatch.objects.get(token=token)
        for event in JobEvent.objects.filter(job_id__in=[i for i, _ in batch.items], actor=user.get_username(),
                                             kind__in=("approval", "approve")):
            if (event.detail or {}).get("batch") == batch.pk and event.job_id in self.approvals:
                self.approvals[event.job_id][user.get_username()] = seen_payloads[event.job_id]
        for job_id, _ in batch.items:
            if job_id in self.approvals:
                self._released(job_id)

    @enabled("bulk")
    @precondition(lambda self: self.interrupted)
    @rule()
    def bulk_take_again(self):
        token, reviewer, decision, seen_payloads = self.interrupted.pop(0)
        # A request killed mid-batch leaves it "being taken"; its user takes it
        # again once it has stood still for BULK_STALE (its page says so).
        DecisionBatch.objects.filter(token=token, status=DecisionBatch.Status.TAKING).update(
            progress_at=timezone.now() - bulk.BULK_STALE - timedelta(seconds=1))
        try:
            self._take(token, self.users[reviewer], decision, seen_payloads)
        except bulk.BatchRefused as exc:
            raise AssertionError(f"a bulk batch cut off half-way cannot be taken again: {exc}") from None

    # ------------------------------------------------------------ workers

    @rule()
    def work(self):
        """Relay the outbox, fire due timers and run the tenant's jobs until
        nothing moves, as workers do (a retry's backoff is skipped)."""
        for _ in range(40):
            Job.objects.filter(tenant=self.tenant_slug, state=State.READY).update(next_attempt_at=None)
            moved = outbox_relay() + timer_fire_due(now=self.now())
            job = self.store.claim_next("system-worker", tenants=[self.tenant_slug], ttl=60)
            if job is not None:
                run_one(self.store, job, "system-worker")
            elif not moved:
                return

    @enabled("proposals")
    @rule(which=st.integers(0, 3))
    def worker_sends_back_to_review(self, which):
        """A worker's attempt ends in a permanent error: the job starts a new stay in review."""
        ready = self.jobs(state=State.READY, action=SEND_EMAIL)
        if not ready:
            return
        job = ready[which % len(ready)]
        epoch = self.store.claim(self.tenant_slug, job.key, "system-worker", ttl=60)
        if epoch is not None:
            self.store.fail(self.tenant_slug, job.key, "system-worker", epoch,
                            error="the provider refused the address", failure="permanent")

    # ------------------------------------------------------------ a lost commit

    @enabled("lost_commit")
    @rule(target=snapshots, which=st.integers(0, 5))
    def snapshot(self, which):
        jobs = [j for j in self.jobs() if j.state != State.LEASED]
        if not jobs:
            return None
        return self._snapshot(jobs[which % len(jobs)])

    def _snapshot(self, job: Job) -> dict:
        newest = newest_event(job.pk)
        return {
            "job": Job.objects.filter(pk=job.pk).values().get(),
            "operations": set(Operation.objects.filter(job_id=job.pk).values_list("id", flat=True)),
            "newest_event": newest.id if newest else 0,
            "approvals": dict(self.approvals.get(job.pk, {})),
            "stay": self.stay.get(job.pk),
            "finished": self.finished.get(job.pk),
        }

    @enabled("lost_commit")
    @rule(snapshot=consumes(snapshots))
    def lose_commits(self, snapshot):
        """Fail over to a replica that had the job as in `snapshot`: what was
        committed on the job and its operations since is gone; the provider
        keeps whatever it received. The workers reconnect and go on."""
        if snapshot is None:
            return
        values = dict(snapshot["job"])
        job_id = values.pop("id")
        if not Job.objects.filter(pk=job_id).exists():
            return
        later = Operation.objects.filter(job_id=job_id).exclude(id__in=snapshot["operations"])
        OperationEvent.objects.filter(operation__in=later).delete()
        Receipt.objects.filter(operation__in=later).delete()
        later.delete()
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {JobEvent._meta.db_table} WHERE job_id = %s AND id > %s",
                           [job_id, snapshot["newest_event"]])
        Job.objects.filter(pk=job_id).update(**values)
        self.rolled_back.add(job_id)
        self.approvals[job_id] = dict(snapshot["approvals"])
        if snapshot["stay"] is None:
            self.stay.pop(job_id, None)
        else:
            self.stay[job_id] = snapshot["stay"]
        if snapshot["finished"] is None:
            self.finished.pop(job_id, None)
        else:
            self.finished[job_id] = snapshot["finished"]
        self.work()

    # ------------------------------------------------------------ business records, retention

    @enabled("invoices")
    @rule()
    def issue_invoice(self):
        n = len(self.invoices) + 1
        customer = customer_ensure(tenant=self.tenant, email=f"payer{n}@{self.tenant_slug}.example", name=f"Payer {n}")
        invoice = invoice_issue(tenant=self.tenant, number=f"INV-{n}", customer=customer, amount=Decimal("500.00"),
                                due_date=timezone.now().date() - timedelta(days=40), terms="Net 30", actor="office")
        self.invoices.append(invoice.pk)

    @enabled("invoices")
    @rule()
    def plan_reminders(self):
        """The daily plan: every open invoice has its reminder planned."""
        for invoice in Invoice.objects.filter(pk__in=self.invoices):
            invoice_reminder_plan(invoice=invoice)

    @enabled("retention")
    @rule(days=st.sampled_from([1, 31]))
    def days_pass(self, days):
        """The clock moves on and the calendar runs what it runs each day:
        retention deletes what finished long ago, the daily plan makes sure
        every open invoice has its reminder, and the workers go on."""
        self.offset += timedelta(days=days)
        retention_sweep(now=self.now(), retention_days=30, redact_after_days=7, budget_seconds=0, pause_ratio=0)
        gone = set(self.finished) - set(Job.objects.filter(pk__in=list(self.finished)).values_list("pk", flat=True))
        for job_id in gone:
            del self.finished[job_id]
            self.approvals.pop(job_id, None)
        self.plan_reminders()
        self.work()

    # ------------------------------------------------------------ invariants

    @invariant()
    def one_message_per_intent(self):
        messages = [m for m in self.sim.messages() if m["to"].endswith(f"@{self.tenant_slug}.example")]
        # An email's intent is its recipient and subject (each proposal and
        # each correction has its own); an invoice's reminder is its invoice.
        per_intent = Counter((m["to"], m["subject"]) for m in messages)
        twice = {intent: n for intent, n in per_intent.items() if n > 1}
        assert not twice, f"an effect reached the provider more than once per business intent: {twice}"

    @invariant()
    def bulk_batches_count_what_happened(self):
        for batch in DecisionBatch.objects.filter(tenants=[self.tenant_slug], status=DecisionBatch.Status.DONE):
            ids = [job_id for job_id, _ in batch.items]
            if Job.objects.filter(pk__in=ids).count() < len(ids) or self.rolled_back.intersection(ids):
                # Retention removed some of its jobs, and their histories with them; or a lost commit took
                # an item's history back while the batch's own row (on another table) stayed.
                continue
            moved = {e.job_id for e in JobEvent.objects.filter(job_id__in=ids).exclude(from_state="")
                     if (e.detail or {}).get("batch") == batch.pk and e.from_state != e.to_state}
            assert sorted(batch.outcome) == sorted(str(i) for i in ids), (
                f"bulk batch {batch.pk} is done, but says what happened to {len(batch.outcome)} of its "
                f"{len(ids)} items (decided={batch.decided}, outcome {batch.outcome})")
            assert batch.decided == len(moved), (
                f"bulk batch {batch.pk} reports {batch.decided} decided, but {len(moved)} of its items left the "
                f"queue by it (outcome {batch.outcome})")

    @invariant()
    def every_job_has_its_search_row_and_history(self):
        jobs = self.jobs()
        searched = set(JobSearch.objects.filter(job_id__in=[j.pk for j in jobs]).values_list("job_id", flat=True))
        for job in jobs:
            assert job.pk in searched, f"{job.key} has no search row"
            if job.state in (State.LEASED, State.DONE):
                continue  # a claim and a successful end keep their evidence on the job row
            newest = newest_event(job.pk)
            assert newest is not None and newest.to_state == job.state, (
                f"{job.key} is {job.state} but its newest history row says "
                f"{newest.kind + ' → ' + newest.to_state if newest else 'nothing'}")

    @invariant()
    def finished_stays_finished(self):
        jobs = {j.pk: j for j in self.jobs()}
        for job_id, state in self.finished.items():
            if job_id in jobs:
                assert jobs[job_id].state == state, f"{jobs[job_id].key} was {state} and is now {jobs[job_id].state}"
        for job in jobs.values():
            if job.state in FINISHED:
                self.finished[job.pk] = job.state


@pytest.fixture
def simulator(start_sim, settings):
    sim = start_sim("idempotent")
    settings.PROVIDER_URL = sim.url
    settings.OPERATIONS_DEFAULT_EMAIL_PROVIDER = "sim-idempotent"
    return sim


DEEP = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "deep"


# A passing `ci` run is bounded by its profile; one that found a seam spends
# longer shrinking it to its shortest steps. The deep run has no limit.
@pytest.mark.timeout(0 if DEEP else 900)
def test_the_systems_invariants_hold_together(simulator):
    SystemMachine.sim = simulator
    # No "explain" phase: tracing every line of a failing example's replay
    # costs minutes here; the shrunk steps are what a reader needs.
    # One failure, shrunk, is reported: a seam found is a test of its own.
    profile = settings(phases=[p for p in settings().phases if p != Phase.explain], report_multiple_bugs=False)
    # Each step is real work (HTTP to the simulator, sweeps): far fewer
    # examples than the Store's machine, in both profiles.
    profile = settings(profile, max_examples=100, stateful_step_count=60) if DEEP else (
        settings(profile, max_examples=25, stateful_step_count=30))
    run_state_machine_as_test(SystemMachine, settings=profile)
