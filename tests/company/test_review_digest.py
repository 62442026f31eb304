"""The reviewers' digest: at most one email per reviewer per
period, through the operation protocol — also when a worker is killed with
SIGKILL in the middle of sending it (acceptance: real worker processes, the
provider simulator, real HTTP)."""

import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group

from company.models import Tenant
from company.review_notify import NOTIFY_REVIEWER, review_digest_key, review_digests_plan
from company.services import tenant_policy_set
from connectors.simulator_process import running_simulator
from jobs.models import Job
from jobs.store import Store
from operations.models import Operation
from tests.console.conftest import ensure_roles
from tests.factories import MembershipFactory, TenantFactory
from tests.support import lease_expired, wait_for, work_to_do

from .support import run_one

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def reviewers(tenant):
    ensure_roles()
    group = Group.objects.get(name="reviewers")
    return [MembershipFactory(user__username=name, user__email=f"{name}@example.com", user__groups=[group],
                              tenant=tenant).user for name in ("rita", "rosa")]


def waiting_item(key="q-1"):
    Store().enqueue_once("studio", key, action="connectors.send_email",
                         payload={"to": "ada@example.com", "subject": "Your quote", "body": "Hello"},
                         actor="agent:rules", review="proposed by agent:rules")


def run_until_idle(store, *, tenant="studio"):
    while (job := store.claim_next("test-worker", tenants=[tenant], ttl=60)) is not None:
        run_one(store, job)


@pytest.mark.django_db
def test_each_reviewer_gets_one_digest_job_per_period_however_often_it_is_planned(settings):
    tenant = TenantFactory(slug="studio")
    rita, rosa = reviewers(tenant)
    tenant_policy_set(tenant=tenant, review_digest_every=timedelta(hours=6))
    waiting_item()
    store = Store()

    assert review_digests_plan(now=T0) == 1
    assert review_digests_plan(now=T0 + timedelta(hours=2, minutes=59)) == 0, "the same period: no second plan"
    plan = Job.objects.get(action="company.plan_review_digests")
    run_until_idle_plans = [run_one(store, store.claim_next("test-worker", actions=[plan.action], ttl=60))]
    # A plan that runs again (a worker died after it enqueued the digests) enqueues nothing new.
    from company.review_notify import plan_review_digests
    from jobs.actions import JobContext

    plan_review_digests(JobContext(job=Job.objects.get(pk=plan.pk), worker_id="again", store=store))
    keys = set(Job.objects.filter(action=NOTIFY_REVIEWER).values_list("key", flat=True))
    period = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)
    assert keys == {review_digest_key("studio", rita.pk, period), review_digest_key("studio", rosa.pk, period)}
    assert run_until_idle_plans[0]["waiting"] == 1

    assert review_digests_plan(now=T0 + timedelta(hours=3)) == 1, "the next period plans again"


@pytest.mark.django_db
def test_no_digest_is_planned_for_a_tenant_that_turned_it_off_or_when_nothing_waits(settings):
    tenant = TenantFactory(slug="studio")
    reviewers(tenant)
    tenant_policy_set(tenant=tenant, review_digest_every=None)
    waiting_item()
    assert review_digests_plan(now=T0) == 0
    tenant_policy_set(tenant=tenant, review_digest_every=timedelta(days=1))
    Job.objects.filter(state="WAITING_REVIEW").delete()
    assert review_digests_plan(now=T0) == 0, "nothing waits: no plan"
    waiting_item()
    assert review_digests_plan(now=T0) == 1
    Job.objects.filter(state="WAITING_REVIEW").delete()  # decided before the plan ran
    run_until_idle(Store())
    assert not Job.objects.filter(action=NOTIFY_REVIEWER).exists()


@pytest.mark.acceptance
def test_a_worker_killed_mid_send_leaves_one_digest_per_reviewer(manage, tmp_path):
    tenant = TenantFactory(slug="studio")
    rita, rosa = reviewers(tenant)
    tenant_policy_set(tenant=Tenant.objects.get(slug="studio"), review_digest_every=timedelta(days=1))
    waiting_item("q-1")
    waiting_item("q-2")
    with running_simulator("idempotent", db_path=tmp_path / "provider.sqlite3", stall_after_accept=10,
                           quiet=True) as sim:
        env = {"PROVIDER_URL": sim.url, "PROVIDER_READ_TIMEOUT": "3", "PROVIDER_CONNECT_TIMEOUT": "1",
               "OPERATIONS_DEFAULT_EMAIL_PROVIDER": "sim-idempotent"}
        # The worker plans the period's digests itself (its periodic task),
        # then sends; the provider accepts the first and stalls its answer.
        worker = manage.start("run_worker", "--worker-id", "w1", "--lease-ttl", "1.5", "--poll-interval", "0.1",
                              env=env)
        wait_for(sim.messages, timeout=60, what="the simulator to store the first digest")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        [in_doubt] = Operation.objects.filter(job__action=NOTIFY_REVIEWER)
        assert in_doubt.state == "INTENDED", "the worker died before it heard the answer"
        wait_for(lambda: lease_expired("studio", in_doubt.job.key), timeout=30, what="the dead worker's lease")

        deadline = time.monotonic() + 120
        for round_ in range(30):
            run = manage.start("run_worker", "--worker-id", f"w2-{round_}", "--lease-ttl", "1.5", "--poll-interval",
                               "0.1", "--until-idle", env={**env, "PROVIDER_READ_TIMEOUT": "0.5"})
            output, _ = run.communicate(timeout=max(1, deadline - time.monotonic()))
            assert run.returncode == 0, output
            digests = Job.objects.filter(action=NOTIFY_REVIEWER)
            if digests.count() == 2 and all(job.state == "DONE" for job in digests):
                break
            for job in digests.exclude(state="DONE"):
                wait_for(lambda job=job: work_to_do("studio", job.key) or Job.objects.get(pk=job.pk).state == "DONE",
                         timeout=max(1, deadline - time.monotonic()), what="the digest to be due again")
        messages = sim.messages()

    digests = list(Job.objects.filter(action=NOTIFY_REVIEWER).order_by("key"))
    assert [job.state for job in digests] == ["DONE", "DONE"]
    assert sorted(m["to"] for m in messages) == ["rita@example.com", "rosa@example.com"], "one each, never two"
    assert all("2 items wait for your review (studio)" == m["subject"] for m in messages)
    operations = list(Operation.objects.filter(job__action=NOTIFY_REVIEWER))
    assert len(operations) == 2
    assert all(op.state == "ACCEPTED" and op.receipt is not None for op in operations)
    assert all("q-1" in op.request["body"] and "q-2" in op.request["body"] for op in operations)
    assert {op.receipt.provider_reference for op in operations} == {m["id"] for m in messages}
    assert in_doubt.job.key in {job.key for job in digests}
