"""A customer's reply to a quote as the mail provider delivers it: a signed
inbound event (`POST /hooks/<provider>/events`, see `jobs.inbound`).

The demo and the tests play the provider with this; a real provider signs
the same way with the secret in `INBOUND_WEBHOOK_SECRETS`.
"""

import json
import time

from jobs.inbound import signature_for

from .names import quote_send_key


def quote_reply_request(*, secret: str, tenant: str, quote_number: str, decision: str, event_id: str,
                        job_key: str | None = None, timestamp: int | None = None) -> tuple[bytes, dict]:
    """The body and headers of a reply event for a quote. It correlates by
    the key of the job waiting for the reply (`send-quote-<number>` unless
    `job_key` names the follow-up's job)."""
    body = json.dumps({
        "id": event_id,
        "type": "message.reply",
        "tenant": tenant,
        "correlation": {"job_key": job_key or quote_send_key(quote_number)},
        "data": {"quote": quote_number, "decision": decision},
    }).encode()
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    headers = {"X-Signature-Timestamp": stamp, "X-Signature": signature_for(secret=secret, timestamp=stamp, body=body)}
    return body, headers


def quote_reply_post(*, provider: str, secret: str, tenant: str, quote_number: str, decision: str, event_id: str,
                     job_key: str | None = None):
    """Deliver a reply through this project's own webhook view (in process,
    the same code path as a provider's POST); returns the HTTP response."""
    from django.test import Client

    body, headers = quote_reply_request(secret=secret, tenant=tenant, quote_number=quote_number, decision=decision,
                                        event_id=event_id, job_key=job_key)
    return Client(SERVER_NAME="localhost").post(f"/hooks/{provider}/events", body, content_type="application/json",
                                                headers=headers)
