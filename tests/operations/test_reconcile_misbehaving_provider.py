"""Reconciliation never adopts a message that is not this operation's (two
messages for one reference need a person, not a guess), the settle window is
measured on the database's clock, not the sending host's, and a provider's
Retry-After is capped by its declared ceiling. The provider is scripted
(tests.connectors.fakeprovider): it can answer what the simulator never
would."""

from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from jobs.errors import NeedsAttention, TransientError
from operations.models import Operation
from tests.connectors.fakeprovider import FakeProvider, message, reply_json

from .support import attempt, enqueue_email, job

pytestmark = pytest.mark.django_db(transaction=True)


class Script:
    """POSTs answer from `posts` in turn; a lookup answers `lookup(reference)`."""

    def __init__(self, posts, lookup):
        self.posts, self.lookup = list(posts), lookup

    def __call__(self, handler, method, path, body):
        if method == "POST":
            status = self.posts.pop(0)
            if status == 201:
                import json

                reference = json.loads(body)["client_reference"]
                return reply_json(handler, 201, message(reference, f"msg-sent-{len(self.posts)}"))
            if status == 429:
                # A provider asking for three million years of patience.
                handler.send_response(429)
                handler.send_header("Retry-After", "99999999999999")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return None
            return reply_json(handler, status, {"error": "server_error"})
        reference = parse_qs(urlsplit(path).query)["client_reference"][0]
        return reply_json(handler, 200, {"data": self.lookup(reference)})


@pytest.fixture
def scripted(provider):
    started = []

    def start(script):
        fake = FakeProvider(script).start()
        started.append(fake)
        provider(fake.url)
        return fake

    yield start
    for fake in started:
        fake.stop()


def posts(fake):
    return [r for r in fake.requests if r[0] == "POST"]


def test_a_lookup_that_ignores_its_filter_does_not_mark_the_operation_sent(store, scripted, settings):
    settings.OPERATIONS_LOOKUP_SETTLE_SECONDS = 0
    # The first send answers 500 (may have arrived); the provider's lookup
    # then lists somebody else's message whatever reference is asked for.
    fake = scripted(Script([500, 201], lambda reference: [message("another-operation", "msg-not-ours")]))
    enqueue_email(store, mode="lookup")
    assert isinstance(attempt(store), TransientError)

    result = attempt(store)

    op = Operation.objects.get()
    assert op.state == "ACCEPTED"
    assert op.receipt.provider_reference == "msg-sent-0" != "msg-not-ours"
    assert result["provider_reference"] == "msg-sent-0"
    assert len(posts(fake)) == 2  # the lookup missed, so the message really was sent


def test_two_messages_for_one_reference_need_investigation_not_a_guess(store, scripted, settings):
    settings.OPERATIONS_LOOKUP_SETTLE_SECONDS = 0
    fake = scripted(Script([500], lambda reference: [message(reference, "msg-a"), message(reference, "msg-b")]))
    enqueue_email(store, mode="lookup")
    assert isinstance(attempt(store), TransientError)

    outcome = attempt(store)

    assert isinstance(outcome, NeedsAttention)
    op = Operation.objects.get()
    assert op.state == "NEEDS_INVESTIGATION"
    assert "msg-a" in op.last_error and "msg-b" in op.last_error
    assert job().state == "NEEDS_ATTENTION"
    assert len(posts(fake)) == 1  # never resent


@pytest.mark.postgres  # on SQLite the database's clock is this host's clock
def test_a_sender_with_a_slow_clock_does_not_shorten_the_settle_window(store, scripted, monkeypatch):
    fake = scripted(Script([500, 201], lambda reference: []))
    enqueue_email(store, mode="lookup")
    real_now = timezone.now
    with monkeypatch.context() as skewed:
        # The sending worker's host clock runs a minute slow.
        skewed.setattr("django.utils.timezone.now", lambda: real_now() - timedelta(seconds=60))
        assert isinstance(attempt(store, worker="slow-clock"), TransientError)

    too_soon = attempt(store, worker="right-clock")

    # The request left moments ago (by the database's clock): it may still
    # arrive, so the other worker waits instead of sending a second copy.
    assert isinstance(too_soon, TransientError) and "may still arrive" in str(too_soon)
    assert len(posts(fake)) == 1


def test_a_providers_absurd_retry_after_is_capped_by_its_declared_ceiling(store, scripted):
    fake = scripted(Script([429], lambda reference: []))
    enqueue_email(store, mode="lookup")

    throttled = attempt(store)

    assert isinstance(throttled, TransientError)
    retry = job()
    # sim-lookup declares a 30 s retry ceiling: the job retries within it.
    assert retry.state == "READY"
    assert retry.next_attempt_at <= timezone.now() + timedelta(seconds=31)
    assert len(posts(fake)) == 1
