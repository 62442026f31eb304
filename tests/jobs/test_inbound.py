"""Inbound events: `POST /hooks/<provider>/events` (DESIGN §7)."""

import json
import multiprocessing
import time

import pytest
from django.db import connections

from jobs import inbound
from jobs.health import inbound_health
from jobs.inbound import (
    InboundError,
    JobRef,
    inbound_event_receive,
    inbound_event_resolve,
    signature_for,
)
from jobs.models import InboundEvent, Job, JobEvent

SECRET = "s3cret-for-tests"
URL = "/hooks/sim/events"


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.INBOUND_WEBHOOK_SECRETS = {"sim": SECRET}
    settings.INBOUND_PROVIDER_TENANTS = {"sim": ["studio"]}
    settings.INBOUND_MAX_SKEW_SECONDS = 300


def reply(event_id="evt-1", key="send-quote-017", **extra) -> dict:
    return {"id": event_id, "type": "message.reply", "tenant": "studio", "correlation": {"job_key": key},
            "data": {"text": "Yes, go ahead"}, **extra}


def post(client, body, *, timestamp=None, secret=SECRET, signature=None, url=URL):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    timestamp = str(int(time.time())) if timestamp is None else str(timestamp)
    headers = {"X-Signature-Timestamp": timestamp,
               "X-Signature": signature or signature_for(secret=secret, timestamp=timestamp, body=raw)}
    return client.post(url, data=raw, content_type="application/json", headers=headers)


def waiting_job(store, key="send-quote-017", state="WAITING_EXTERNAL"):
    store.enqueue("studio", key)
    epoch = store.claim("studio", key, "w")
    store.wait("studio", key, "w", epoch, state=state, reason="customer reply", provider="sim")
    return Job.objects.get(tenant="studio", key=key)


def resumes(job) -> int:
    return JobEvent.objects.filter(job=job, kind="resume").count()


pytestmark = pytest.mark.django_db


def test_a_valid_reply_resumes_the_waiting_job_with_the_event_in_its_history(client, store):
    job = waiting_job(store)
    response = post(client, reply())
    assert response.status_code == 202
    assert response.json()["status"] == "applied"
    job.refresh_from_db()
    assert job.state == "READY"
    resumed = JobEvent.objects.get(job=job, kind="resume")
    assert resumed.actor == "inbound:sim"
    assert resumed.detail["event_id"] == "evt-1"
    assert resumed.detail["data"] == {"text": "Yes, go ahead"}
    event = InboundEvent.objects.get()
    assert (event.state, event.job_id, event.event_type) == ("APPLIED", job.pk, "message.reply")
    assert resumed.detail["inbound_event"] == event.pk


def test_a_redelivered_event_is_acknowledged_and_not_applied_twice(client, store):
    job = waiting_job(store)
    assert post(client, reply()).status_code == 202
    # The job waits again (a later step); the redelivery must not resume it.
    epoch = store.claim("studio", job.key, "w")
    store.wait("studio", job.key, "w", epoch, reason="next reply")
    again = post(client, reply())
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    assert InboundEvent.objects.count() == 1
    assert resumes(job) == 1
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"


@pytest.mark.parametrize(
    "signature",
    [None, "sha256=" + "0" * 64, "garbage"],
    ids=["signed-with-another-secret", "wrong-digest", "not-a-signature"],
)
def test_a_bad_signature_is_refused_and_nothing_is_applied(client, store, signature):
    job = waiting_job(store)
    response = post(client, reply(), secret="not-the-secret", signature=signature)
    assert response.status_code == 401
    assert "signature" in response.json()["error"]
    assert InboundEvent.objects.count() == 0
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"


def test_missing_signature_headers_are_refused(client, store):
    waiting_job(store)
    response = client.post(URL, data=json.dumps(reply()), content_type="application/json")
    assert response.status_code == 401
    assert "required" in response.json()["error"]
    response = post(client, reply(), timestamp="yesterday")
    assert response.status_code == 401
    assert InboundEvent.objects.count() == 0


@pytest.mark.parametrize("offset", [-3600, 3600], ids=["too-old", "from-the-future"])
def test_a_stale_timestamp_is_refused_even_with_a_valid_signature(client, store, offset):
    # Far outside the window: the server reads its own clock a moment after
    # this one, and the answer must not depend on how long that moment is.
    job = waiting_job(store)
    response = post(client, reply(), timestamp=int(time.time()) + offset)
    assert response.status_code == 400
    assert "clock" in response.json()["error"]
    assert InboundEvent.objects.count() == 0
    assert resumes(job) == 0


@pytest.mark.parametrize(("offset", "accepted"), [(-301, False), (-300, True), (300, True), (301, False)])
def test_the_allowed_clock_skew_is_exact_in_both_directions(store, offset, accepted):
    # The server's time is injected, so the boundary is exact.
    from jobs.inbound import StaleRequest

    job = waiting_job(store)
    now = 1_900_000_000
    body = json.dumps(reply()).encode()
    receive = lambda: inbound_event_receive(  # noqa: E731
        provider="sim", body=body, timestamp=str(now + offset),
        signature=signature_for(secret=SECRET, timestamp=now + offset, body=body), now=now)
    if accepted:
        assert receive().status == "applied"
        assert resumes(job) == 1
    else:
        with pytest.raises(StaleRequest):
            receive()
        assert InboundEvent.objects.count() == 0 and resumes(job) == 0


def test_an_unknown_provider_is_answered_as_a_bad_signature_and_logged(client, caplog):
    response = post(client, reply(), url="/hooks/nobody/events")
    assert response.status_code == 401
    assert response.json() == post(client, reply(), secret="wrong").json()
    assert "nobody" not in response.json()["error"]
    unknown = [r for r in caplog.records if r.getMessage() == "inbound.unknown_provider"]
    assert unknown and unknown[0].fields["provider"] == "nobody"


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps({"type": "message.reply"}).encode(), "'id' is required"),
        (json.dumps({"id": "e", "type": ""}).encode(), "'type' is required"),
        (json.dumps({"id": "e", "type": "t", "correlation": ["send-quote-017"]}).encode(), "'correlation' must be"),
        (json.dumps({"id": "e", "type": "t", "data": "text"}).encode(), "'data' must be"),
        (json.dumps({"id": "e", "type": "t", "tenant": 7}).encode(), "'tenant' must be"),
    ],
)
def test_a_malformed_body_is_refused_with_a_clear_message(client, store, body, message):
    job = waiting_job(store)
    response = post(client, body)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert InboundEvent.objects.count() == 0
    assert resumes(job) == 0


def test_an_event_matching_no_job_is_kept_and_flagged_for_an_operator(client):
    response = post(client, reply(key="no-such-job"))
    assert response.status_code == 202
    assert response.json()["status"] == "unmatched"
    event = InboundEvent.objects.get()
    assert event.state == "UNMATCHED"
    assert "no job studio/no-such-job" in event.note
    assert inbound_health().unmatched == 1

    inbound_event_resolve(event_pk=event.pk, actor="ops@example.com", note="customer wrote about an old quote")
    event.refresh_from_db()
    assert (event.state, event.resolved_by) == ("RESOLVED", "ops@example.com")
    assert inbound_health().unmatched == 0
    with pytest.raises(InboundError):
        inbound_event_resolve(event_pk=event.pk, actor="ops@example.com", note="again")


def test_an_event_without_correlation_is_kept_unmatched(client):
    body = {"id": "evt-9", "type": "delivery.report", "data": {"status": "bounced"}}
    assert post(client, body).json()["status"] == "unmatched"
    assert InboundEvent.objects.get().body["data"] == {"status": "bounced"}


@pytest.mark.parametrize("state", ["READY", "WAITING_REVIEW"])
def test_a_reply_for_a_job_not_waiting_for_one_is_kept_unmatched(client, store, state):
    if state == "READY":
        store.enqueue("studio", "send-quote-017")
        job = Job.objects.get()
    else:
        job = waiting_job(store, state=state)  # a reply must not bypass a reviewer
    assert post(client, reply()).json()["status"] == "unmatched"
    event = InboundEvent.objects.get()
    assert (event.state, event.job_id) == ("UNMATCHED", job.pk)
    assert f"is {state}, not waiting for an external event" in event.note
    assert Job.objects.get(pk=job.pk).state == state


def test_a_registered_correlator_matches_by_client_reference(client, store, monkeypatch):
    job = waiting_job(store)
    operations = {"op-7f3a": JobRef("studio", job.key)}

    def by_client_reference(*, provider, tenant, correlation, data):
        return operations.get(correlation.get("client_reference"))

    monkeypatch.setattr(inbound, "_correlators", [])
    inbound.register_correlator(by_client_reference)
    body = {"id": "dlv-1", "type": "delivery.report", "correlation": {"client_reference": "op-7f3a"}}
    assert post(client, body).json()["status"] == "applied"
    assert Job.objects.get(pk=job.pk).state == "READY"


def test_a_failing_correlator_leaves_the_event_kept_for_an_operator(client, store, monkeypatch):
    def broken(**kwargs):
        raise LookupError("operations table unavailable")

    monkeypatch.setattr(inbound, "_correlators", [broken])
    body = {"id": "dlv-1", "type": "delivery.report", "correlation": {"client_reference": "op-7f3a"}}
    assert post(client, body).json()["status"] == "unmatched"
    assert "operations table unavailable" in InboundEvent.objects.get().note


def test_only_post_is_allowed(client):
    assert client.get(URL).status_code == 405


def test_the_service_can_be_called_without_http(store):
    job = waiting_job(store)
    body = json.dumps(reply()).encode()
    now = 1_900_000_000
    receipt = inbound_event_receive(provider="sim", body=body, timestamp=str(now),
                                    signature=signature_for(secret=SECRET, timestamp=now, body=body), now=now + 5)
    assert receipt.status == "applied"
    assert receipt.event.received_at.timestamp() == now + 5
    assert Job.objects.get(pk=job.pk).state == "READY"


# ---------------------------------------------------------------- concurrent redeliveries in real processes


def _deliver(body: bytes) -> str:
    from django.conf import settings

    settings.INBOUND_WEBHOOK_SECRETS = {"sim": SECRET}
    timestamp = str(int(time.time()))
    try:
        return inbound_event_receive(provider="sim", body=body, timestamp=timestamp,
                                     signature=signature_for(secret=SECRET, timestamp=timestamp, body=body)).status
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_concurrent_redeliveries_apply_the_event_once(store):
    job = waiting_job(store)
    body = json.dumps(reply()).encode()
    connections.close_all()
    with multiprocessing.get_context("fork").Pool(6) as pool:
        outcomes = pool.map(_deliver, [body] * 6)
    assert sorted(outcomes) == ["applied"] + ["duplicate"] * 5
    assert InboundEvent.objects.count() == 1
    assert resumes(job) == 1
