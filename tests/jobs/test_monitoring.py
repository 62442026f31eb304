"""/metrics, /healthz and /readyz as a scraper and a load balancer see them."""

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import Job, OutboxEvent
from operations.models import OperationState
from tests.factories import OperationFactory, OutboxEventFactory, UserFactory

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_reflect_a_known_set_of_jobs(client, store, settings):
    settings.METRICS_TOKEN = "scrape-secret"
    for n in range(3):
        store.enqueue("studio", f"ready-{n}")
    Job.objects.filter(key="ready-0").update(created_at=timezone.now() - timedelta(seconds=120))
    store.enqueue("atelier", "ready-a")
    store.enqueue("studio", "leased")
    store.claim("studio", "leased", "w1", now=time.time() - 600, ttl=30)  # expired long ago
    store.enqueue("studio", "done")
    epoch = store.claim("studio", "done", "w1")
    store.finish("studio", "done", "w1", epoch)
    waiting = store.enqueue("studio", "waiting")
    epoch = store.claim("studio", "waiting", "w1")
    store.wait("studio", "waiting", "w1", epoch, reason="reply")
    OperationFactory(job=waiting, request={}, state=OperationState.UNKNOWN)
    OutboxEventFactory(state="QUARANTINED")

    samples = scrape(client, HTTP_AUTHORIZATION="Bearer scrape-secret")

    assert samples[("durable_jobs", (("state", "READY"), ("tenant", "studio")))] == 3
    assert samples[("durable_jobs", (("state", "READY"), ("tenant", "atelier")))] == 1
    assert samples[("durable_jobs", (("state", "LEASED"), ("tenant", "studio")))] == 1
    assert samples[("durable_jobs", (("state", "WAITING_EXTERNAL"), ("tenant", "studio")))] == 1
    assert not any(name == "durable_jobs" and ("state", "DONE") in labels for name, labels in samples)
    assert samples[("durable_oldest_ready_age_seconds", ())] >= 100
    assert samples[("durable_leases_expired", ())] == 1
    assert samples[("durable_operations", (("state", "UNKNOWN"),))] == 1
    assert samples[("durable_operations", (("state", "INTENDED"),))] == 0
    assert samples[("durable_outbox_quarantined", ())] == 1
    assert samples[("durable_outbox_oldest_unpublished_age_seconds", ())] == 0
    assert samples[("durable_timers_overdue", ())] == 0


def test_metrics_are_refused_without_a_staff_session_or_the_token(client, settings):
    settings.METRICS_TOKEN = "scrape-secret"
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    settings.METRICS_TOKEN = ""  # no token configured: no token is accepted
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    client.force_login(UserFactory(username="viewer"))
    assert client.get("/metrics").status_code == 403
    # A staff member scoped to one tenant would read every tenant's figures.
    client.force_login(UserFactory(username="staff", staff=True))
    response = client.get("/metrics")
    assert response.status_code == 403 and "every tenant" in response.json()["error"]
    client.force_login(UserFactory(username="root", superuser=True))
    assert "durable_jobs" in client.get("/metrics").content.decode()


def test_readyz_turns_503_when_the_outbox_lag_passes_its_threshold(client, settings):
    settings.READYZ_MAX_OUTBOX_LAG_SECONDS = 60
    settings.METRICS_TOKEN = "scrape-secret"
    assert client.get("/readyz").json() == {"status": "ready"}
    OutboxEventFactory(aggregate_id="1", created_at=timezone.now() - timedelta(seconds=30))
    assert client.get("/readyz").status_code == 200
    OutboxEvent.objects.filter(aggregate_id="1").update(created_at=timezone.now() - timedelta(minutes=5))
    response = client.get("/readyz", HTTP_AUTHORIZATION="Bearer scrape-secret")
    assert response.status_code == 503
    assert response.json()["status"] == "not ready" and "outbox lag" in response.json()["reasons"][0]


def test_readyz_tells_its_reasons_only_to_the_metrics_token_or_a_staff_session(client, settings):
    settings.READYZ_MAX_OUTBOX_LAG_SECONDS = 60
    settings.METRICS_TOKEN = "scrape-secret"
    OutboxEventFactory(aggregate_id="1", created_at=timezone.now() - timedelta(minutes=5))

    anonymous = client.get("/readyz")
    assert (anonymous.status_code, anonymous.json()) == (503, {"status": "not ready"})
    wrong_token = client.get("/readyz", HTTP_AUTHORIZATION="Bearer guessed")
    assert (wrong_token.status_code, wrong_token.json()) == (503, {"status": "not ready"})
    client.force_login(UserFactory(username="not-staff"))
    assert client.get("/readyz").json() == {"status": "not ready"}

    with_token = client.get("/readyz", HTTP_AUTHORIZATION="Bearer scrape-secret").json()
    assert "outbox lag" in with_token["reasons"][0]
    client.force_login(UserFactory(username="staff", staff=True))
    staff = client.get("/readyz")
    assert staff.status_code == 503 and "outbox lag" in staff.json()["reasons"][0]


def test_healthz_tells_an_anonymous_caller_only_that_the_database_is_down():
    # A real connection refused by a PostgreSQL URL on which nothing listens:
    # its error text names the host and the port.
    script = (
        "from django.test import Client\n"
        "client = Client(HTTP_HOST='localhost')\n"
        "for headers in ({}, {'HTTP_AUTHORIZATION': 'Bearer probe-secret'}):\n"
        "    response = client.get('/healthz', **headers)\n"
        "    print(response.status_code, response.content.decode())\n"
    )
    with socket.socket() as held:  # a port nothing listens on, for the whole test
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        env = {**os.environ, "DATABASE_URL": f"postgres://secret_role@127.0.0.1:{port}/ledger",
               "METRICS_TOKEN": "probe-secret", "DJANGO_SETTINGS_MODULE": "durable.settings"}
        result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", script], env=env, cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
    anonymous, with_token = result.stdout.splitlines()[-2:]
    assert anonymous == '503 {"status": "unavailable"}', result.stdout + result.stderr
    assert with_token.startswith("503 ") and f"port {port} failed" in with_token


def test_healthz_answers_200_while_the_database_answers(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
