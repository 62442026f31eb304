"""The gateway's walls (DESIGN §15): an agent cannot reach into the keys the
system makes for itself nor read another agent's work; what it sends is
refused with a problem document before anything is written; keys are kept
only as hashes; a signature covers its timestamp."""

import hashlib
import json
import time

import pytest

from company.models import Proposal
from connectors.webhook import address_problem
from gateway.callbacks import callback_sweep, delivery_key, event_id
from gateway.keys import key_parse
from gateway.models import AgentProposal, ApiKey, CallbackEvent
from gateway.services import agent_create
from jobs import interventions
from jobs.inbound import signature_for
from jobs.models import Job, JobEvent
from jobs.selectors import newest_event

from .conftest import EMAIL
from .test_api import problem


@pytest.fixture
def development(settings):
    settings.GATEWAY_CALLBACK_ALLOW_PRIVATE = True
    settings.GATEWAY_CALLBACK_REQUIRE_HTTPS = False
    return settings


def test_an_agent_cannot_squat_the_key_of_another_agents_callback_delivery(api, tenant, development):
    victim, victim_issued = agent_create(tenant=tenant, name="victim", actor="t", callback_url="http://127.0.0.1:9/hook")
    assert api.propose("send-1", api_key=victim_issued.key).status_code == 201
    job = Job.objects.get(tenant="studio", key="send-1")
    # The decision's history row is among the next ones the engine writes:
    # its id, the tenant and the key are all a squatter needs for the event id.
    newest = newest_event(job.pk).id
    guesses = [event_id(tenant="studio", key="send-1", history_id=newest + n, type_="proposal.decided")
               for n in range(1, 4)]
    squats = [key for guess in guesses for key in (delivery_key(guess), f"callback-{guess}")]
    for squat in squats:
        refused = problem(api.propose(squat), 422)
        assert refused["errors"][0]["loc"] == ["body", "key"]
    assert not Job.objects.filter(key__in=squats).exists()

    interventions.job_approve(tenant="studio", key="send-1", reason="ok", actor="rita")
    callback_sweep()
    event = CallbackEvent.objects.get()
    assert event.id in guesses and event.agent_id == victim.pk
    delivery = Job.objects.get(tenant="studio", key=event.job_key)
    assert delivery.action == "gateway.deliver_callback" and delivery.payload["agent"] == victim.pk


@pytest.mark.parametrize("key", ["review-overdue-1-r1", "timer-1", "task-0123456789abcdef0123456789abcdef"])
def test_the_keys_of_other_system_jobs_are_refused_too(api, key):
    problem(api.propose(key), 422)
    assert not Job.objects.exists()


def test_an_agent_reads_and_lists_only_its_own_proposals_not_its_tenants_other_agents(api, tenant, development):
    other, other_issued = agent_create(tenant=tenant, name="other", actor="t", callback_url="http://127.0.0.1:9/hook")
    other_key = other_issued.key
    assert api.propose("theirs", api_key=other_key).status_code == 201
    interventions.job_approve(tenant="studio", key="theirs", reason="ok", actor="rita")
    callback_sweep()
    delivery = CallbackEvent.objects.get().job_key
    problem(api.get("/proposals/theirs"), 404)
    problem(api.get(f"/proposals/{delivery}"), 404)
    problem(api.get(f"/proposals/{delivery}", key=other_key), 404)  # a delivery job is nobody's proposal
    assert api.get("/proposals").json() == {"items": [], "next": None}
    # The same key and content again is not a way to read it either.
    refused = problem(api.propose("theirs"), 409)
    assert "theirs" not in json.dumps({k: v for k, v in refused.items() if k != "detail"})
    assert AgentProposal.objects.count() == 1
    # Its owner reads it.
    assert api.get("/proposals/theirs", key=other_key).json()["state"] in ("READY", "LEASED", "DONE")


def test_a_body_over_djangos_own_limit_is_413_problem_json(api, settings):
    settings.GATEWAY_MAX_BODY_BYTES = 4 * 1024 * 1024  # past DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB)
    big = {**EMAIL, "body": "x" * (3 * 1024 * 1024)}
    problem(api.propose("send-1", payload=big), 413)
    settings.GATEWAY_MAX_BODY_BYTES = 512 * 1024
    problem(api.propose("send-1", payload=big), 413)
    assert not Job.objects.exists()


@pytest.mark.parametrize("path", ["/nothing-here", "/proposals/a/b", "/"])
def test_an_unrouted_path_under_the_api_is_a_problem_404(api, client, path):
    problem(api.get(path), 404)
    problem(client.get(f"/api/v1{path}"), 404)
    problem(api.post(path, {"a": 1}), 404)


def test_a_proposal_naming_an_unknown_provider_is_refused_at_proposal(api):
    refused = problem(api.propose("send-1", payload={**EMAIL, "provider": "no-such-provider"}), 422)
    assert refused["errors"][0]["loc"] == ["body", "payload", "provider"]
    # A family's name (another agent's callback receiver) is not an email provider either.
    problem(api.propose("send-1", payload={**EMAIL, "provider": "callback:1"}), 422)
    assert not Job.objects.exists() and not Proposal.objects.exists()
    assert api.propose("send-1", payload={**EMAIL, "provider": "sim-idempotent"}).status_code == 201


@pytest.mark.parametrize("subject", ["Hello\r\nBcc: all@example.com", "Hello\nthere", "Hello\rthere"])
def test_a_line_break_in_an_email_subject_is_refused(api, subject):
    refused = problem(api.propose("send-1", payload={**EMAIL, "subject": subject}), 422)
    assert refused["errors"][0]["loc"] == ["body", "payload", "subject"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(("address", "why"), [
    ("2002:7f00:1::1", "loopback"),                          # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", "link-local"),                     # 6to4 of 169.254.169.254
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),    # Teredo, client 127.0.0.1
    ("2001:0:a9fe:a9fe::1", "link-local"),                   # Teredo, server 169.254.169.254
    ("::ffff:127.0.0.1", "loopback"),
])
def test_ipv6_addresses_that_embed_a_refused_ipv4_address_are_refused(address, why):
    assert why in (address_problem(address) or "")


def test_a_6to4_address_of_a_public_ipv4_address_passes():
    assert address_problem("2002:808:808::1") is None


def test_an_api_key_is_stored_only_as_its_sha256_never_in_clear(tenant):
    agent, issued = agent_create(tenant=tenant, name="keeper", actor="t")
    prefix, secret = key_parse(issued.key)
    stored = ApiKey.objects.get(agent=agent)
    assert stored.prefix == prefix and stored.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    for row in ApiKey.objects.values():
        assert not any(secret in str(value) for value in row.values())
    for row in JobEvent.objects.values():
        assert secret not in json.dumps(row, default=str)


def test_an_inbound_webhooks_signature_covers_its_timestamp(client, settings, db):
    settings.INBOUND_WEBHOOK_SECRETS = {"sim": "s3cret"}
    settings.INBOUND_PROVIDER_TENANTS = {"sim": ["studio"]}
    settings.INBOUND_MAX_SKEW_SECONDS = 300
    body = json.dumps({"id": "evt-1", "type": "message.reply", "tenant": "studio",
                       "correlation": {"job_key": "k"}, "data": {"text": "yes"}}).encode()
    now = int(time.time())
    signed_then = signature_for(secret="s3cret", timestamp=now - 60, body=body)
    replayed = client.post("/hooks/sim/events", data=body, content_type="application/json",
                           headers={"X-Signature-Timestamp": str(now), "X-Signature": signed_then})
    assert replayed.status_code == 401
    honest = client.post("/hooks/sim/events", data=body, content_type="application/json",
                         headers={"X-Signature-Timestamp": str(now - 60), "X-Signature": signed_then})
    assert honest.status_code in (200, 202)


@pytest.mark.parametrize(("to", "accepted"), [
    ("a.b+c@mail.example.org", True), ("ana-s@studio.example", True),
    ("úÀ@example.com", False), ("x" * 65 + "@example.com", False), ("0@0.a", False), ("a@b", False),
])
def test_a_recipient_is_an_email_address_as_the_document_says(api, to, accepted):
    answer = api.propose("send-1", payload={**EMAIL, "to": to})
    if accepted:
        assert answer.status_code == 201
    else:
        assert problem(answer, 422)["errors"][0]["loc"] == ["body", "payload", "to"]
