"""Generic actions that reach the outside world through the operation protocol.

`connectors.send_email` lives here, not in `connectors/`, because connectors
know nothing about jobs (DESIGN §2); the engine imports every installed app's
`handlers` module at start-up, which registers it.
"""

from django import forms
from django.conf import settings

from jobs.actions import JobContext, action
from jobs.errors import PermanentError
from jobs.retry import RetryPolicy

from .protocol import EMAIL_SEND, operation_perform

DEFAULT_EMAIL_PROVIDER = "sim-idempotent"

# Short first retries (an UNKNOWN outcome is usually reconciled at once), a
# ceiling in line with what providers ask for on 429, and few enough attempts
# that a provider outage reaches an operator within minutes.
SEND_EMAIL_RETRY = RetryPolicy(initial_interval=0.5, max_interval=30.0, max_attempts=8)




class EmailCorrection(forms.Form):
    """What a reviewer may correct on an email the provider rejected."""

    to = forms.EmailField(label="Recipient address", max_length=254)
    subject = forms.CharField(label="Subject", max_length=200)
    body = forms.CharField(label="Message", widget=forms.Textarea(attrs={"rows": 6}))


def send_step(payload: dict) -> str:
    """The operation step of this payload's revision: a reviewer's
    correction (`jobs.review.job_correct_and_approve`) raises `revision`, so
    the corrected request is a new operation with a new id, and the rejected
    one stays as evidence."""
    revision = payload.get("revision") or 1
    return "send" if revision == 1 else f"send-r{revision}"


@action("connectors.send_email", retry=SEND_EMAIL_RETRY, timeout=300, review_form=EmailCorrection)
def send_email(ctx: JobContext) -> dict:
    """Send one email, at most once per job, through the operation protocol.

    Payload: `to`, `subject`, `body` (strings) and optionally `provider`
    (default: the `OPERATIONS_DEFAULT_EMAIL_PROVIDER` setting, else
    "sim-idempotent") and `revision` (set by a reviewer's correction). Returns the receipt's summary as the job's result.
    Raises `PermanentError` for a malformed payload (→ review, nothing
    recorded) and whatever `operation_perform` raises.
    """
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    # No business record to re-check: `operation_perform` itself reconciles
    # a step in doubt before anything else (`operation_settle` is for the
    # actions that may decide not to send). The payload cannot change under
    # an operation: a correction is a new step (`send_step`).
    problems = [name for name in ("to", "subject", "body") if not isinstance(payload.get(name), str)]
    if problems:
        raise PermanentError(f"the payload needs {', '.join(problems)} as text; nothing was sent")
    provider = payload.get("provider") or getattr(settings, "OPERATIONS_DEFAULT_EMAIL_PROVIDER", DEFAULT_EMAIL_PROVIDER)
    request = {"to": payload["to"], "subject": payload["subject"], "body": payload["body"]}
    receipt = operation_perform(ctx, step=send_step(payload), provider=provider, kind=EMAIL_SEND, request=request)
    return {
        "operation": str(receipt.operation_id),
        "provider": provider,
        "provider_reference": receipt.provider_reference,
        "receipt": receipt.how,
    }
