"""Outcome callbacks (DESIGN §15): each event once, signed like the inbound
webhooks, delivered by its own job with an operation and a receipt; a
failing receiver retries and holds back nothing else; the destination is
checked on the address it resolves to when delivering."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.contrib.auth.models import Group

from company.services import tenant_ensure
from gateway.callbacks import DELIVER, callback_sweep
from gateway.models import Agent, CallbackEvent
from gateway.schemas import ProposalIn
from gateway.services import agent_create, proposal_propose
from jobs import interventions
from jobs.inbound import signature_for
from jobs.models import Job
from jobs.worker import Worker, WorkerConfig
from operations.models import Operation, Receipt

from tests.console.conftest import ensure_roles
from tests.factories import MembershipFactory

from .conftest import EMAIL
from .receiver import ThreadedReceiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def development(settings):
    settings.GATEWAY_CALLBACK_ALLOW_PRIVATE = True
    settings.GATEWAY_CALLBACK_REQUIRE_HTTPS = False
    settings.GATEWAY_CALLBACK_READ_TIMEOUT = 0.5
    return settings


@pytest.fixture
def receiver(tmp_path):
    started = []

    def start(**options):
        handle = ThreadedReceiver(tmp_path / f"received-{len(started)}.jsonl", **options)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


def settle(rounds: int = 6) -> None:
    """Run workers until no new callback event appears and none waits for delivery."""
    for _ in range(rounds):
        before = CallbackEvent.objects.count()
        Worker(WorkerConfig(until_idle=True, poll_interval=0.05, worker_id="w")).run()
        pending = Job.objects.filter(action=DELIVER, state__in=["READY", "LEASED"], next_attempt_at__isnull=True)
        if CallbackEvent.objects.count() == before and not pending.exists():
            return


def propose(agent, key="send-1", action="connectors.send_email", payload=None):
    return proposal_propose(agent=agent, proposal=ProposalIn(action=action, key=key, rationale="asked",
                                                             payload=EMAIL if payload is None else payload))


def make_agent(url: str, name="assistant", tenant="studio") -> Agent:
    agent, _ = agent_create(tenant=tenant_ensure(slug=tenant), name=name, actor="t", callback_url=url)
    return agent


def test_a_decision_and_the_outcome_reach_the_agent_signed_each_once(development, receiver, start_sim):
    sim = start_sim("idempotent")
    development.PROVIDER_URL = sim.url
    hook = receiver()
    agent = make_agent(hook.url)
    propose(agent)
    interventions.job_approve(tenant="studio", key="send-1", reason="looks right", actor="rita")
    # Two sweeps while the approved job still waits for a worker: the second
    # reads nothing new, so the decision is one event (not left to whether a
    # worker finishes the job before its first sweep).
    callback_sweep()
    callback_sweep()
    assert list(CallbackEvent.objects.values_list("type", flat=True)) == ["proposal.decided"]
    settle()

    got = hook.received()
    bodies = [json.loads(r["body"]) for r in got]
    assert [b["type"] for b in bodies] == ["proposal.decided", "proposal.done"]
    assert len({b["id"] for b in bodies}) == 2 and CallbackEvent.objects.count() == 2
    for record, body in zip(got, bodies):
        headers = record["headers"]
        assert headers["idempotency-key"] == body["id"]
        assert headers["x-signature"] == signature_for(secret=agent.callback_secret,
                                                       timestamp=headers["x-signature-timestamp"],
                                                       body=record["body"].encode())
        assert body["proposal"]["key"] == "send-1" and set(body) == {"id", "type", "created_at", "proposal"}
    assert bodies[1]["proposal"]["outcome"]["receipts"][0]["provider"] == "sim-idempotent"
    # Each delivery is a job of its own, with an operation and a receipt.
    deliveries = Job.objects.filter(action=DELIVER)
    assert {j.state for j in deliveries} == {"DONE"} and deliveries.count() == 2
    assert Receipt.objects.filter(operation__provider=f"callback:{agent.pk}").count() == 2
    # Reading the history again makes no second event.
    settle()
    assert len(hook.received()) == 2


def test_a_rejection_is_decided_then_cancelled(development, receiver):
    hook = receiver()
    propose(make_agent(hook.url))
    interventions.job_reject(tenant="studio", key="send-1", reason="not this customer", actor="rita")
    settle()
    bodies = [json.loads(r["body"]) for r in hook.received()]
    assert [b["type"] for b in bodies] == ["proposal.decided", "proposal.cancelled"]
    assert bodies[0]["proposal"]["decision"] == {"decision": "reject", "by": "rita", "at": bodies[0]["proposal"][
        "decision"]["at"], "note": "not this customer"}


def test_an_agent_without_a_callback_url_gets_no_events(development):
    agent, _ = agent_create(tenant=tenant_ensure(slug="studio"), name="quiet", actor="t")
    propose(agent)
    interventions.job_reject(tenant="studio", key="send-1", reason="no", actor="rita")
    settle()
    assert not CallbackEvent.objects.exists() and not Job.objects.filter(action=DELIVER).exists()


@pytest.mark.parametrize("fault", [{"status": 500}, {"stall": 2.0}])
def test_a_failing_receiver_is_retried_later_and_holds_back_nothing_else(development, receiver, fault):
    failing, working = receiver(**fault), receiver()
    propose(make_agent(failing.url, name="broken"), key="a-1")
    propose(make_agent(working.url, name="fine"), key="b-1")
    interventions.job_reject(tenant="studio", key="a-1", reason="no", actor="rita")
    interventions.job_reject(tenant="studio", key="b-1", reason="no", actor="rita")
    settle()
    assert [json.loads(r["body"])["type"] for r in working.received()] == ["proposal.decided", "proposal.cancelled"]
    stuck = Job.objects.filter(action=DELIVER, payload__agent=Agent.objects.get(name="broken").pk)
    # Unknown outcome (a 500, a timeout): retried after a backoff, under the same key, never given up at once.
    assert {j.state for j in stuck} == {"READY"} and all(j.next_attempt_at for j in stuck)
    assert {op.state for op in Operation.objects.filter(job__in=stuck)} == {"UNKNOWN"}


def test_a_redirect_is_not_followed_and_goes_to_an_operator(development, receiver):
    hook = receiver(status=302)
    propose(make_agent(hook.url))
    interventions.job_reject(tenant="studio", key="send-1", reason="no", actor="rita")
    settle()
    assert len(hook.received()) == 2  # one request per event: the redirect was not followed
    delivery = Job.objects.filter(action=DELIVER).first()
    assert delivery.state == "NEEDS_ATTENTION" and "redirects are not followed" in delivery.last_error


def test_a_callback_address_is_checked_when_delivering_not_only_when_saved(development, receiver):
    hook = receiver()
    agent = make_agent(hook.url)
    propose(agent)
    # Saved while development allowed it; the name now resolves to loopback.
    development.GATEWAY_CALLBACK_ALLOW_PRIVATE = False
    Agent.objects.filter(pk=agent.pk).update(callback_url=hook.url.replace("127.0.0.1", "localhost"))
    interventions.job_reject(tenant="studio", key="send-1", reason="no", actor="rita")
    settle()
    assert hook.received() == []
    refused = Job.objects.filter(action=DELIVER)
    assert {j.state for j in refused} == {"NEEDS_ATTENTION"}
    assert all("loopback" in j.last_error for j in refused)


def test_the_proposals_evidence_timeline_shows_its_callbacks(development, receiver, client):
    hook = receiver()
    propose(make_agent(hook.url))
    interventions.job_reject(tenant="studio", key="send-1", reason="no", actor="rita")
    settle()
    ensure_roles()
    operator = MembershipFactory(user__username="otto", user__groups=[Group.objects.get(name="operators")],
                                 tenant=tenant_ensure(slug="studio"), role="operator").user
    client.force_login(operator)
    job = Job.objects.get(key="send-1")
    page = client.get(f"/admin/console/jobs/{job.pk}/timeline/").content.decode()
    assert "callback proposal.decided to agent assistant: DONE" in page
    assert "callback proposal.cancelled to agent assistant: DONE" in page


def guide_function(name: str):
    """A function defined in a Python block of the receiver guide, as a reader would copy it."""
    guide = (Path(settings.BASE_DIR) / "docs" / "howto" / "connect-an-agent.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", guide, re.S) if f"def {name}(" in block)
    namespace: dict = {}
    exec(compile(code, "connect-an-agent.md", "exec"), namespace)
    return namespace


def test_the_guides_verification_accepts_a_delivered_callback_and_refuses_a_replay(development, receiver):
    hook = receiver()
    agent = make_agent(hook.url)
    propose(agent)
    interventions.job_reject(tenant="studio", key="send-1", reason="not this customer", actor="rita")
    settle()
    record = hook.received()[0]
    body = record["body"].encode()
    headers = {"X-Signature-Timestamp": record["headers"]["x-signature-timestamp"],
               "X-Signature": record["headers"]["x-signature"]}
    guide = guide_function("verified_event")
    verified_event = guide["verified_event"]

    event = verified_event(agent.callback_secret, headers, body)
    assert event["type"] == "proposal.decided" and event["id"] == record["headers"]["idempotency-key"]
    # One time format: RFC 3339, UTC, Z — the event's, the proposal's, the decision's.
    for moment in (event["created_at"], event["proposal"]["created_at"], event["proposal"]["decision"]["at"]):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", moment), moment
    assert event["proposal"]["links"]["console"].startswith("/admin/console/jobs/")

    # The same body and signature under a new timestamp: the signature covers it.
    replayed = {**headers, "X-Signature-Timestamp": str(int(headers["X-Signature-Timestamp"]) + 60)}
    with pytest.raises(ValueError, match="bad signature"):
        verified_event(agent.callback_secret, replayed, body)
    # The genuine request, replayed past the guide's tolerance.
    sent_at = int(headers["X-Signature-Timestamp"])
    guide["time"] = SimpleNamespace(time=lambda: sent_at + 301)
    with pytest.raises(ValueError, match="stale"):
        verified_event(agent.callback_secret, headers, body)
    guide["time"] = SimpleNamespace(time=lambda: sent_at + 299)
    assert verified_event(agent.callback_secret, headers, body)["id"] == event["id"]
