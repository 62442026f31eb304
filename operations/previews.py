"""What an email job will send, for the person deciding on it (`Preview`,
`jobs.actions`): the recipient, subject and body exactly as the connector
will take them — or, once the intent is recorded, the recorded request,
which is all a retry of that step ever sends (`operation_perform` compares
its digest)."""

from django.conf import settings

from jobs.actions import Preview, PreviewField

from .selectors import operation_for_step

DEFAULT_EMAIL_PROVIDER = "sim-idempotent"
# The labels of `handlers.EmailPayload`, so the preview and the correction
# form name each field alike.
EMAIL_FIELDS = (("to", "Recipient address", False), ("subject", "Subject", False), ("body", "Message", True))


def email_provider(payload) -> str:
    """The provider an email job sends through: its payload's, else the deployment's."""
    chosen = payload.get("provider") if isinstance(payload, dict) else None
    return chosen or getattr(settings, "OPERATIONS_DEFAULT_EMAIL_PROVIDER", DEFAULT_EMAIL_PROVIDER)


def email_preview(request: dict, *, provider: str, note: str = "") -> Preview:
    return Preview(
        summary=f"Sends this email through {provider}, once.",
        fields=tuple(PreviewField(name, label, str(request.get(name, "")), multiline)
                     for name, label, multiline in EMAIL_FIELDS),
        note=note,
    )


def recorded_or_rendered(job, *, step: str, render, rendered_note: str = "") -> Preview:
    """The email of `job`'s `step`: the request already recorded for it
    (sent exactly so on any retry), else `render()` as it would be now,
    with `rendered_note` saying when it is rendered again."""
    recorded = operation_for_step(job=job, step=step)
    if recorded is not None:
        return email_preview(recorded.request, provider=recorded.provider,
                             note=f"Recorded as operation {recorded.id} ({recorded.state}) when it was first "
                                  f"sent: every retry sends exactly this request.")
    return email_preview(render(), provider=email_provider(job.payload), note=rendered_note)
