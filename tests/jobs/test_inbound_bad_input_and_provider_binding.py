"""The inbound webhook answers bad input with 400, never 500, and a
provider's secret acts only for its tenants and its own waits: an authentic
body the database cannot store (NaN, NUL, a lone surrogate, deep nesting) is
refused and nothing is recorded, so is a 400-digit timestamp, and an event
resumes only a job of a tenant its provider is bound to
(INBOUND_PROVIDER_TENANTS) that waits on that provider (contracts C2, C3)."""

import json
import time

import pytest
from django.contrib.auth.models import Group

from jobs.actions import Wait
from jobs.inbound import signature_for
from jobs.models import InboundEvent, Job
from tests.factories import MembershipFactory, TenantFactory

SECRET = "s3cret-for-tests"
OTHER_SECRET = "another-providers-secret"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def bindings(settings):
    settings.INBOUND_WEBHOOK_SECRETS = {"sim": SECRET, "mailer": OTHER_SECRET, "unbound": "x" * 16}
    settings.INBOUND_PROVIDER_TENANTS = {"sim": ["studio"], "mailer": ["*"]}
    settings.INBOUND_MAX_SKEW_SECONDS = 300


def post(client, raw: bytes, *, provider="sim", secret=SECRET, timestamp=None):
    timestamp = str(int(time.time())) if timestamp is None else timestamp
    return client.post(f"/hooks/{provider}/events", data=raw, content_type="application/json",
                       headers={"X-Signature-Timestamp": timestamp,
                                "X-Signature": signature_for(secret=secret, timestamp=timestamp, body=raw)})


def event(key="send-quote-017", tenant="studio", **extra) -> bytes:
    return json.dumps({"id": f"evt-{key}-{tenant}", "type": "message.reply", "tenant": tenant,
                       "correlation": {"job_key": key}, "data": {"text": "yes"}, **extra}).encode()


def waiting(store, *, tenant="studio", key="send-quote-017", provider="sim") -> Job:
    store.enqueue(tenant, key)
    epoch = store.claim(tenant, key, "w")
    wait = Wait.external("customer reply", provider=provider)
    store.wait(tenant, key, "w", epoch, reason=wait.reason, provider=wait.provider)
    return Job.objects.get(tenant=tenant, key=key)


AUTHENTIC_BUT_MALFORMED = {
    "NaN": b'{"id": "e1", "type": "t", "data": {"x": NaN}}',
    "Infinity": b'{"id": "e1", "type": "t", "data": {"x": -Infinity}}',
    "a NUL character": b'{"id": "e1", "type": "t", "data": {"x": "a\\u0000b"}}',
    "a lone surrogate": b'{"id": "e1", "type": "t", "data": {"x": "\\ud800"}}',
    "100,000 levels of nesting": b'{"id": "e1", "type": "t", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "100 levels of nesting": b'{"id": "e1", "type": "t", "data": ' + b"[" * 100 + b"]" * 100 + b"}",
}


@pytest.mark.parametrize("case", list(AUTHENTIC_BUT_MALFORMED))
def test_an_authentic_body_that_cannot_be_stored_is_a_400(client, case):
    response = post(client, AUTHENTIC_BUT_MALFORMED[case])
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]
    assert not InboundEvent.objects.exists()


def test_a_400_digit_timestamp_is_a_400(client):
    response = post(client, event(), timestamp="9" * 400)
    assert response.status_code == 400
    assert "clock" in response.json()["error"]


@pytest.mark.parametrize("shape", ["underscores", "a plus sign", "a superscript"])
def test_a_signed_timestamp_that_is_not_plain_digits_is_refused_and_nothing_is_recorded(client, store, shape):
    # A number from a request is read strictly (int()
    # alone would take "1_700…" and "+1700…"; "²" passes str.isdigit()).
    now = str(int(time.time()))
    timestamp = {"underscores": f"{now[:4]}_{now[4:]}", "a plus sign": f"+{now}", "a superscript": f"{now}²"}[shape]
    job = waiting(store)

    response = post(client, event(), timestamp=timestamp)

    assert response.status_code == 401 and "digits 0-9" in response.json()["error"]
    assert not InboundEvent.objects.exists()
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"


def test_an_event_resumes_a_job_waiting_on_its_provider_in_a_bound_tenant(client, store):
    job = waiting(store)
    assert post(client, event()).json()["status"] == "applied"
    assert Job.objects.get(pk=job.pk).state == "READY"


def test_a_signed_event_for_another_tenants_job_does_not_resume_it(client, store):
    other = waiting(store, tenant="bakery")
    response = post(client, event(tenant="bakery"))
    assert (response.status_code, response.json()["status"]) == (202, "unmatched")
    assert Job.objects.get(pk=other.pk).state == "WAITING_EXTERNAL"
    kept = InboundEvent.objects.get()
    assert "may not act for tenant 'bakery'" in kept.note
    assert kept.job_id is None  # nothing of the other tenant's job is linked


def test_a_provider_with_a_secret_but_no_binding_acts_for_no_tenant(client, store):
    job = waiting(store, provider="unbound")
    assert post(client, event(), provider="unbound", secret="x" * 16).json()["status"] == "unmatched"
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"


def test_an_event_from_another_provider_does_not_end_the_wait(client, store):
    job = waiting(store, provider="sim")
    # mailer may act for any tenant, but this job waits on sim.
    assert post(client, event(), provider="mailer", secret=OTHER_SECRET).json()["status"] == "unmatched"
    assert Job.objects.get(pk=job.pk).state == "WAITING_EXTERNAL"
    assert "waits on provider 'sim', not on 'mailer'" in InboundEvent.objects.get().note


def test_a_wildcard_binding_acts_for_any_tenant(client, store):
    job = waiting(store, tenant="bakery", provider="mailer")
    assert post(client, event(tenant="bakery"), provider="mailer", secret=OTHER_SECRET).json()["status"] == "applied"
    assert Job.objects.get(pk=job.pk).state == "READY"


def test_the_binding_is_read_from_the_environment(monkeypatch):
    import importlib

    import durable.settings as module

    monkeypatch.setenv("INBOUND_PROVIDER_TENANTS", "sim=demo|studio,mailer=*")
    try:
        reloaded = importlib.reload(module)
        assert reloaded.INBOUND_PROVIDER_TENANTS == {"sim": ["demo", "studio"], "mailer": ["*"]}
    finally:
        monkeypatch.delenv("INBOUND_PROVIDER_TENANTS")
        importlib.reload(module)


@pytest.mark.parametrize("correlation", [{"job_key": "send-quote-017"}, {}])
def test_an_event_naming_a_tenant_its_provider_is_not_bound_to_is_not_filed_under_that_tenant(client, store,
                                                                                             correlation):
    # sim is bound to studio; it names bakery, whose operators must not see it.
    waiting(store, tenant="bakery")
    body = json.dumps({"id": "evt-1", "type": "message.reply", "tenant": "bakery", "correlation": correlation,
                       "data": {}}).encode()
    assert post(client, body).json()["status"] == "unmatched"
    kept = InboundEvent.objects.get()
    assert kept.tenant == "" and kept.job_id is None
    assert "may not act for tenant 'bakery'" in kept.note

    operator = MembershipFactory(tenant=TenantFactory(slug="bakery"), role="operator",
                                 user__groups=[Group.objects.get(name="operators")]).user
    client.force_login(operator)
    assert "evt-1" not in client.get("/admin/jobs/inboundevent/").content.decode()
    assert client.get(f"/admin/jobs/inboundevent/{kept.pk}/change/").status_code == 404


def test_an_event_its_provider_may_send_is_filed_under_the_tenant_of_the_job_it_resumed(client, store):
    job = waiting(store)
    body = json.dumps({"id": "evt-2", "type": "message.reply", "correlation": {"job_key": job.key},
                       "tenant": "studio", "data": {}}).encode()
    assert post(client, body).json()["status"] == "applied"
    assert InboundEvent.objects.get().tenant == "studio"
