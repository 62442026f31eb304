"""The provider simulator as the outside world: real subprocess, raw HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from connectors.simulator import PROJECT_ROOT
from tests.connectors.support import LISTING_KEYS, message, raw_request
from tests.support import wait_for


def post(sim, body, *, key=None, headers=None, timeout=5.0, **kwargs):
    headers = {**({"Idempotency-Key": key} if key else {}), **(headers or {})}
    return raw_request(sim.url, "POST", "/v1/messages", body=body, headers=headers, timeout=timeout, **kwargs)


def test_health_answers_ok(start_sim):
    sim = start_sim("lookup")

    answer = raw_request(sim.url, "GET", "/health", auth=False)

    assert answer.status == 200
    assert answer.body["mode"] == "lookup"


def test_accepted_message_is_answered_201_and_can_be_fetched_by_id(start_sim):
    sim = start_sim()

    accepted = post(sim, message("quote-1"), key="op-1")

    assert accepted.status == 201
    assert accepted.body["id"].startswith("msg_")
    assert accepted.body["client_reference"] == "quote-1"
    assert accepted.body["idempotency_key"] == "op-1"
    assert accepted.body["accepted_at"].endswith("Z")
    assert accepted.headers["Request-Id"].startswith("req_")
    fetched = raw_request(sim.url, "GET", f"/v1/messages/{accepted.body['id']}")
    assert fetched.status == 200
    assert fetched.body == accepted.body
    assert raw_request(sim.url, "GET", "/v1/messages/msg_nope").status == 404


def test_listing_shows_every_message_with_exactly_the_customer_visible_keys(start_sim):
    sim = start_sim("bare")
    post(sim, message("quote-1"), key="op-1")
    post(sim, message("quote-2"))

    listing = raw_request(sim.url, "GET", "/v1/messages", auth=False)

    assert listing.status == 200
    assert [m["client_reference"] for m in listing.body] == ["quote-1", "quote-2"]
    assert all(set(m) == LISTING_KEYS for m in listing.body)
    assert [m["idempotency_key"] for m in listing.body] == ["op-1", None]


def test_post_without_authorization_is_401_and_stores_nothing(start_sim):
    sim = start_sim()

    answer = post(sim, message("quote-1"), auth=False)

    assert answer.status == 401
    assert answer.body == {"error": "unauthorized"}
    assert post(sim, message("quote-1"), headers={"Authorization": "Bearer "}).status == 401
    assert sim.messages() == []


def test_reject_auth_answers_401_to_every_provider_request(start_sim):
    sim = start_sim(reject_auth=True)

    assert post(sim, message("quote-1")).status == 401
    assert raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-1").status == 401
    answer = raw_request(sim.url, "GET", "/v1/messages/msg_x")
    assert answer.status == 401
    assert answer.body == {"error": "unauthorized"}
    # The listing is the tests' window, not the provider API: it stays open.
    assert sim.messages() == []


@pytest.mark.parametrize(
    "body",
    [
        message("quote-1", to="not-an-address"),
        message("quote-1", subject=None),
        message("quote-1", body=42),
        message(""),
        {k: v for k, v in message("quote-1").items() if k != "client_reference"},
        ["not", "an", "object"],
    ],
    ids=["to-without-at", "subject-null", "body-number", "empty-reference", "no-reference", "not-an-object"],
)
def test_invalid_message_is_422_validation_error_and_not_stored(start_sim, body):
    sim = start_sim()

    answer = post(sim, body)

    assert answer.status == 422
    assert answer.body["error"] == "validation_error"
    assert answer.body["detail"]
    assert sim.messages() == []


def test_malformed_json_is_400(start_sim):
    sim = start_sim()

    answer = post(sim, None, raw_body=b"{not json")

    assert answer.status == 400
    assert sim.messages() == []


def test_idempotent_mode_replays_the_original_answer_for_the_same_key_and_body(start_sim):
    sim = start_sim("idempotent")
    first = post(sim, message("quote-1"), key="op-1")

    again = post(sim, message("quote-1"), key="op-1")

    assert again.status == first.status == 201
    assert again.body == first.body
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert len(sim.messages()) == 1


def test_idempotent_mode_refuses_a_reused_key_with_a_different_body(start_sim):
    sim = start_sim("idempotent")
    post(sim, message("quote-1"), key="op-1")

    answer = post(sim, message("quote-1", subject="Something else"), key="op-1")

    assert answer.status == 422
    assert answer.body["error"] == "idempotency_error"
    assert len(sim.messages()) == 1


def test_idempotent_mode_answers_409_while_the_first_request_is_still_in_progress(start_sim):
    sim = start_sim("idempotent", stall_after_accept=1.5)
    with pytest.raises(TimeoutError):
        post(sim, message("quote-1"), key="op-1", timeout=0.3)

    during_stall = post(sim, message("quote-1"), key="op-1")

    assert during_stall.status == 409
    assert during_stall.body["error"] == "idempotency_conflict"
    assert len(sim.messages()) == 1


def test_stall_after_accept_commits_the_message_before_holding_the_answer(start_sim):
    sim = start_sim("bare", stall_after_accept=1.5)

    with pytest.raises(TimeoutError):
        post(sim, message("quote-1"), timeout=0.3)

    assert [m["client_reference"] for m in sim.messages()] == ["quote-1"]


def test_stalled_answer_arrives_when_the_client_waits(start_sim):
    sim = start_sim("idempotent", stall_after_accept=0.5)
    started = time.monotonic()

    answer = post(sim, message("quote-1"), key="op-1", timeout=3)

    assert answer.status == 201
    assert time.monotonic() - started >= 0.5


@pytest.mark.parametrize("mode", ["lookup", "bare"])
def test_non_idempotent_modes_record_the_key_but_a_resend_is_a_second_message(start_sim, mode):
    sim = start_sim(mode)

    first = post(sim, message("quote-1"), key="op-1")
    again = post(sim, message("quote-1"), key="op-1")

    assert first.status == again.status == 201
    assert first.body["id"] != again.body["id"]
    assert "Idempotent-Replayed" not in again.headers
    assert [m["idempotency_key"] for m in sim.messages()] == ["op-1", "op-1"]


@pytest.mark.parametrize("mode", ["idempotent", "lookup"])
def test_lookup_by_client_reference_finds_only_that_reference(start_sim, mode):
    sim = start_sim(mode)
    accepted = post(sim, message("quote-1"))
    post(sim, message("quote-2"))

    found = raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-1")
    missing = raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-9")

    assert found.status == 200
    assert found.body == {"data": [accepted.body]}
    assert missing.body == {"data": []}


@pytest.mark.parametrize(("fault", "status"), [("500", 500), ("429", 429), ("401", 401)])
def test_a_lookup_fault_answers_every_lookup_with_its_status_while_sends_still_work(start_sim, fault, status):
    sim = start_sim("idempotent", lookup_fault=fault, retry_after=7)
    accepted = post(sim, message("quote-1"))

    answer = raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-1")

    assert accepted.status == 201
    assert answer.status == status
    assert (answer.headers.get("Retry-After") == "7") == (status == 429)
    assert len(sim.messages()) == 1


def test_a_stalled_lookup_answers_only_after_its_stall(start_sim):
    sim = start_sim("lookup", lookup_stall=2)
    post(sim, message("quote-1"))

    with pytest.raises(TimeoutError):
        raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-1", timeout=0.3)
    assert len(raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-1", timeout=10).body["data"]) == 1


def test_a_lookup_that_ignores_the_reference_answers_with_every_message(start_sim):
    sim = start_sim("lookup", lookup_ignores_reference=True)
    post(sim, message("quote-1"))
    post(sim, message("quote-2"))

    answer = raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-9")

    assert [m["client_reference"] for m in answer.body["data"]] == ["quote-1", "quote-2"]


def test_an_unknown_lookup_fault_is_refused():
    from connectors.simulator import SimulatorConfig

    with pytest.raises(ValueError, match="lookup_fault must be one of 500, 429, 401"):
        SimulatorConfig(lookup_fault="503")


def test_bare_mode_has_no_lookup_route(start_sim):
    sim = start_sim("bare")
    post(sim, message("quote-1"))

    answer = raw_request(sim.url, "GET", "/v1/messages?client_reference=quote-1")

    assert answer.status == 404
    assert answer.body == {"error": "not_found"}


def test_throttled_post_is_429_with_retry_after_and_stores_nothing(start_sim):
    sim = start_sim(throttle_rate=1.0, retry_after=7)

    answer = post(sim, message("quote-1"), key="op-1")

    assert answer.status == 429
    assert answer.headers["Retry-After"] == "7"
    assert sim.messages() == []


def test_error_rate_answers_500_without_storing(start_sim):
    sim = start_sim(error_rate=1.0)

    answer = post(sim, message("quote-1"), key="op-1")

    assert answer.status == 500
    assert sim.messages() == []


def test_auth_is_checked_before_faults(start_sim):
    sim = start_sim(error_rate=1.0, throttle_rate=1.0)

    assert post(sim, message("quote-1"), auth=False).status == 401


def test_seed_makes_fault_decisions_reproducible(start_sim):
    def statuses(db_name):
        sim = start_sim("bare", db_name=db_name, error_rate=0.5, seed=42)
        result = [post(sim, message(f"quote-{i}")).status for i in range(12)]
        sim.stop()
        return result

    first, second = statuses("a.sqlite3"), statuses("b.sqlite3")

    assert first == second
    assert set(first) == {201, 500}


def test_storage_and_idempotency_records_survive_a_restart_on_the_same_db(start_sim):
    sim = start_sim("idempotent")
    original = post(sim, message("quote-1"), key="op-1")
    sim.stop()

    restarted = start_sim("idempotent")
    replay = post(restarted, message("quote-1"), key="op-1")

    assert restarted.messages() == [original.body]
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.body == original.body


def test_sigterm_stops_the_simulator_cleanly_even_during_a_stall(start_sim):
    sim = start_sim(stall_after_accept=30)

    def send_and_wait():
        try:
            post(sim, message("quote-1"), timeout=10)
        except OSError:
            pass  # the simulator goes away mid-stall; that is the point

    threading.Thread(target=send_and_wait, daemon=True).start()
    wait_for(sim.messages, timeout=20, what="the simulator to accept the message and stall")

    started = time.monotonic()
    status = sim.stop(timeout=5)

    assert status == 0
    assert time.monotonic() - started < 3


def test_management_command_runs_the_simulator(tmp_path):
    db_path = tmp_path / "nested" / "provider.sqlite3"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_provider_simulator", "--port", "0", "--db", str(db_path), "--mode", "bare"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "durable.settings"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("provider-simulator listening on http://127.0.0.1:")
        assert f"mode=bare db={db_path}" in line
        url = line.split()[3]
        assert raw_request(url, "GET", "/health", auth=False).status == 200
        assert db_path.exists()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        process.stdout.close()
