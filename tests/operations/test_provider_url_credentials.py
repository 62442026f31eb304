"""A provider URL's credentials (`https://user:pass@host`) never reach what
is stored or shown: the operation's last error and evidence, the job's last
error and history, the connector's repr — whatever the failure."""

import json

import pytest

from connectors.base import redact_credentials
from connectors.registry import build_http_connector
from jobs.models import Job, JobEvent
from operations.models import Operation, OperationEvent

from .support import attempt, enqueue_email

pytestmark = pytest.mark.django_db

PASSWORD = "hunter2-provider-password"


def with_credentials(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://mailer-account:{PASSWORD}@{rest}"


def everything_stored() -> str:
    rows = [*Operation.objects.values("last_error", "request"), *OperationEvent.objects.values("reason", "detail"),
            *Job.objects.values("last_error", "result", "wait_reason"), *JobEvent.objects.values("reason", "detail")]
    return json.dumps(rows, default=str)


def test_credentials_in_the_url_of_an_unreachable_provider_are_not_stored(store, provider, refused_url):
    provider(with_credentials(refused_url))
    enqueue_email(store)

    attempt(store)

    stored = everything_stored()
    assert "cannot connect" in stored and refused_url.removeprefix("http://") in stored
    assert PASSWORD not in stored and "mailer-account" not in stored


def test_credentials_in_the_url_of_a_provider_whose_answer_is_lost_are_not_stored(store, provider, start_sim):
    sim = start_sim("idempotent", stall_after_accept=3, stall_probability=1.0)
    provider(with_credentials(sim.url), read_timeout=0.3)
    enqueue_email(store)

    attempt(store)  # accepted, the answer lost: UNKNOWN
    assert Operation.objects.get().state == "UNKNOWN"

    stored = everything_stored()
    assert "outcome unknown" in stored
    assert PASSWORD not in stored and "mailer-account" not in stored


def test_a_connector_never_shows_the_credentials_of_its_url(refused_url):
    connector = build_http_connector("sim-idempotent", base_url=with_credentials(refused_url), connect_timeout=1,
                                     read_timeout=1)
    assert PASSWORD not in repr(connector) and PASSWORD not in connector.base_url
    with pytest.raises(ValueError) as refused:
        build_http_connector("sim-idempotent", base_url=f"ftp://a:{PASSWORD}@host", connect_timeout=1,
                             read_timeout=1)
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("text, shown", [
    ("https://user:pass@mail.example.com/v1", "https://***@mail.example.com/v1"),
    ("cannot connect to http://u:p@ss@127.0.0.1:9/: refused", "cannot connect to http://***@127.0.0.1:9/: refused"),
    ("https://mail.example.com/v1 (ops@example.com)", "https://mail.example.com/v1 (ops@example.com)"),
    ({"request": ["POST https://k@h/x", 3]}, {"request": ["POST https://***@h/x", 3]}),
])
def test_redact_credentials_hides_every_urls_userinfo_and_nothing_else(text, shown):
    assert redact_credentials(text) == shown
