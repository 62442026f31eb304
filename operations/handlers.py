"""Generic actions that reach the outside world through the operation protocol.

`connectors.send_email` lives here, not in `connectors/`, because connectors
know nothing about jobs (DESIGN §2); the engine imports every installed app's
`handlers` module at start-up, which registers it.
"""

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from connectors.registry import provider_known

from jobs.actions import JobContext, action
from jobs.errors import PermanentError
from jobs.retry import RetryPolicy

from .previews import email_provider, recorded_or_rendered
from .protocol import EMAIL_SEND, operation_perform

# Short first retries (an UNKNOWN outcome is usually reconciled at once), a
# ceiling in line with what providers ask for on 429, and few enough attempts
# that a provider outage reaches an operator within minutes.
SEND_EMAIL_RETRY = RetryPolicy(initial_interval=0.5, max_interval=30.0, max_attempts=8)

# An address as Django's EmailValidator (a reviewer's form) takes it, written
# as a pattern a client can check first: an ASCII local part of at most 64
# characters (RFC 5321), then host labels and a top-level domain of letters.
EMAIL_PATTERN = (r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-](?:[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{0,62}[A-Za-z0-9!#$%&'*+/=?^_`{|}~-])?"
                 r"@([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}$")
# Text a person reads: no NUL (nothing can store it) or other control
# characters but tab and line breaks.
TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
PROVIDER_PATTERN = r"^[a-z0-9][a-z0-9:._-]{0,99}$"
# One line a person reads (an email's subject): no control characters at all,
# so no line break that would start another header.
LINE_PATTERN = r"^[^\x00-\x1f\x7f]*$"


def _provider_known(name: str) -> str:
    # Refused when proposed, not after a reviewer approved it: an unknown
    # provider would only send the approved job back to review.
    if not provider_known(name):
        raise ValueError(f"no provider named {name!r} is configured here")
    return name


# An email payload's chosen provider (None: the deployment's default).
# `x-provider` marks it for documents that list the providers configured
# when they are served (the gateway's OpenAPI).
ProviderChoice = Annotated[str, Field(pattern=PROVIDER_PATTERN, json_schema_extra={"x-provider": True}),
                           AfterValidator(_provider_known)] | None


class EmailPayload(BaseModel):
    """One email to one recipient."""

    model_config = ConfigDict(extra="forbid", strict=True, title="Email")

    to: str = Field(title="Recipient address", max_length=254, pattern=EMAIL_PATTERN,
                    json_schema_extra={"format": "email", "x-correctable": True})
    subject: str = Field(title="Subject", min_length=1, max_length=200, pattern=LINE_PATTERN,
                         json_schema_extra={"x-correctable": True})
    body: str = Field(title="Message", min_length=1, max_length=50_000, pattern=TEXT_PATTERN,
                      json_schema_extra={"x-correctable": True, "x-multiline": True})
    provider: ProviderChoice = Field(None, title="Provider",
                                 description="The email provider (default: the deployment's).")
    revision: int | None = Field(None, title="Revision", ge=1, le=10_000,
                                 description="Set by a reviewer's correction; leave it out.")


def send_step(payload: dict) -> str:
    """The operation step of this payload's revision: a reviewer's
    correction (`review.decisions.job_correct_and_approve`) raises `revision`, so
    the corrected request is a new operation with a new id, and the rejected
    one stays as evidence."""
    revision = payload.get("revision") or 1
    return "send" if revision == 1 else f"send-r{revision}"


def send_email_preview(job):
    """The email this job's payload (its current revision) sends."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    return recorded_or_rendered(job, step=send_step(payload), render=lambda: payload)


def _request(payload: dict) -> dict:
    return {"to": payload["to"], "subject": payload["subject"], "body": payload["body"]}


# The recipient is personal data: a viewer reads the story without it.
@action("connectors.send_email", retry=SEND_EMAIL_RETRY, timeout=300, schema=EmailPayload,
        searchable=("to", "subject"),
        description="Send one email (to, subject, body) through the email provider, at most once.",
        preview=send_email_preview, sensitive=("to",))
def send_email(ctx: JobContext) -> dict:
    """Send one email, at most once per job, through the operation protocol.

    Payload (`EmailPayload`, the one schema the API, the MCP tools and the
    reviewer's correction form use): `to`, `subject`, `body` and optionally
    `provider` (default: the `OPERATIONS_DEFAULT_EMAIL_PROVIDER` setting, else
    "sim-idempotent") and `revision` (set by a reviewer's correction).
    A proposal's payload is checked against the schema before its job
    exists; a job enqueued by code is checked here only for what sending
    needs (the provider validates the rest: a refusal goes to review).
    Returns the receipt's summary as the job's result. Raises
    `PermanentError` for a malformed payload (→ review, nothing recorded)
    and whatever `operation_perform` raises.
    """
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    # No business record to re-check: `operation_perform` itself reconciles
    # a step in doubt before anything else (`operation_settle` is for the
    # actions that may decide not to send). The payload cannot change under
    # an operation: a correction is a new step (`send_step`).
    problems = [name for name in ("to", "subject", "body") if not isinstance(payload.get(name), str)]
    if problems:
        raise PermanentError(f"the payload needs {', '.join(problems)} as text; nothing was sent")
    provider = email_provider(payload)
    request = _request(payload)
    receipt = operation_perform(ctx, step=send_step(payload), provider=provider, kind=EMAIL_SEND, request=request)
    return {
        "operation": str(receipt.operation_id),
        "provider": provider,
        "provider_reference": receipt.provider_reference,
        "receipt": receipt.how,
    }
