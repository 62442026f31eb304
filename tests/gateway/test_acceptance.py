"""Acceptance: real worker processes, a real callback receiver process, real
HTTP, real `kill -9` (DESIGN §12, §15).

A worker is killed while the receiver holds a callback it received; a new
worker, once the lease expired, delivers it again under the same
`Idempotency-Key`, so the receiver — deduplicating by it — takes the event
once, and the event has one delivery job, one operation and one receipt.
Also: a paused agent's jobs are held at dispatch by real workers, and run
once it is resumed.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from company.services import tenant_ensure, tenant_policy_set
from gateway.callbacks import DELIVER
from gateway.models import CallbackEvent
from gateway.schemas import ProposalIn
from gateway.services import agent_create, agent_holds_release, agent_pause, agent_unpause, proposal_propose
from jobs import interventions
from jobs.models import Job
from operations.models import DispatchHold, Operation, Receipt
from tests.conftest import ROOT
from tests.support import lease_expired, wait_for

from .conftest import EMAIL
from .receiver import received

pytestmark = [pytest.mark.acceptance]

DEVELOPMENT = {"GATEWAY_CALLBACK_ALLOW_PRIVATE": "1", "GATEWAY_CALLBACK_REQUIRE_HTTPS": "0"}


@pytest.fixture
def receiver_process(tmp_path):
    started = []

    def start(*options):
        log = tmp_path / f"received-{len(started)}.jsonl"
        process = subprocess.Popen([sys.executable, "-m", "tests.gateway.receiver", "--log", str(log), *options],
                                   cwd=ROOT, stdout=subprocess.PIPE, text=True)
        url = process.stdout.readline().split()[-1] + "/hooks/durable"
        started.append(process)
        return url, log

    yield start
    for process in started:
        process.kill()
        process.wait()


def run_worker(manage, name: str, *extra: str, env: dict | None = None):
    return manage.start("run_worker", "--worker-id", name, "--lease-ttl", "1.5", "--poll-interval", "0.1", *extra,
                        env={**DEVELOPMENT, "GATEWAY_CALLBACK_READ_TIMEOUT": "3", **(env or {})})


def propose(agent, key: str):
    return proposal_propose(agent=agent, proposal=ProposalIn(action="connectors.send_email", key=key,
                                                             rationale="asked", payload=EMAIL))


def test_a_callback_is_delivered_once_after_its_worker_is_killed_mid_delivery(manage, transactional_db,
                                                                               receiver_process, settings):
    settings.GATEWAY_CALLBACK_ALLOW_PRIVATE, settings.GATEWAY_CALLBACK_REQUIRE_HTTPS = True, False
    url, log = receiver_process("--stall", "10", "--stall-once")
    agent, _ = agent_create(tenant=tenant_ensure(slug="studio"), name="assistant", actor="t", callback_url=url)
    propose(agent, "send-1")
    interventions.job_reject(tenant="studio", key="send-1", reason="not now", actor="rita")  # decided + cancelled, nothing to send

    first = run_worker(manage, "w1")
    wait_for(lambda: received(log), timeout=60, what="the receiver to get the first callback")
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed = json.loads(received(log)[0]["body"])["id"]
    delivery = Job.objects.get(key=f"callback-{killed}")
    assert delivery.state == "LEASED" and Operation.objects.get(job=delivery).state == "INTENDED"

    wait_for(lambda: lease_expired("studio", delivery.key), timeout=30, what="the dead worker's lease to expire")
    clean = run_worker(manage, "w2", "--until-idle")
    output, _ = clean.communicate(timeout=120)
    assert clean.returncode == 0, output
    deadline = time.monotonic() + 60
    while Job.objects.filter(action=DELIVER).exclude(state="DONE").exists() and time.monotonic() < deadline:
        again = run_worker(manage, "w3", "--until-idle")  # a retry's backoff may still have been running
        again.communicate(timeout=120)

    records = received(log)
    ids = [json.loads(r["body"])["id"] for r in records]
    assert sorted(set(ids)) == sorted(str(e) for e in CallbackEvent.objects.values_list("id", flat=True))
    assert CallbackEvent.objects.count() == 2
    # The killed delivery came again under the same key; the receiver takes each id once.
    resent = [r for r in records if json.loads(r["body"])["id"] == killed]
    assert len(resent) == 2 and {r["headers"]["idempotency-key"] for r in resent} == {killed}
    assert resent[0]["body"] == resent[1]["body"]
    assert {j.state for j in Job.objects.filter(action=DELIVER)} == {"DONE"}
    op = Operation.objects.get(job__key=f"callback-{killed}")
    assert op.state == "ACCEPTED" and Receipt.objects.filter(operation=op).count() == 1


def test_pausing_an_agent_holds_its_undispatched_jobs_and_resuming_sends_them_once(manage, transactional_db,
                                                                                   start_sim):
    sim = start_sim("idempotent")
    tenant = tenant_ensure(slug="studio")
    tenant_policy_set(tenant=tenant, runs_without_review=["connectors.send_email"])
    agent, _ = agent_create(tenant=tenant, name="assistant", actor="t")
    other, _ = agent_create(tenant=tenant, name="other", actor="t")
    propose(agent, "held-1")
    propose(agent, "held-2")
    propose(other, "free-1")
    agent_pause(agent=agent, reason="runaway", actor="otto")

    worker = run_worker(manage, "w1", "--until-idle", env={"PROVIDER_URL": sim.url})
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output
    states = dict(Job.objects.values_list("key", "state"))
    assert states == {"held-1": "WAITING_EXTERNAL", "held-2": "WAITING_EXTERNAL", "free-1": "DONE"}
    held = Job.objects.get(key="held-1")
    assert "agent assistant of tenant studio is paused (runaway)" in held.wait_reason and held.attempts == 0
    assert [m["to"] for m in sim.messages()] == [EMAIL["to"]]  # only the other agent's
    assert DispatchHold.objects.count() == 2

    # Resumed as the admin's decision does it: the pause lifted, then the held jobs released.
    agent = agent_unpause(agent=agent, actor="otto")
    released = agent_holds_release(agent=agent, actor="otto", note="fixed")
    assert released == 2
    worker = run_worker(manage, "w2", "--until-idle", env={"PROVIDER_URL": sim.url})
    worker.communicate(timeout=120)
    assert set(Job.objects.values_list("state", flat=True)) == {"DONE"}
    assert len(sim.messages()) == 3 and not DispatchHold.objects.exists()
