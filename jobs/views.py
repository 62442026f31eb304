"""HTTP entry points of the engine. Thin: authentication, recording and
resuming live in `jobs.inbound`."""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .inbound import InboundRejected, inbound_event_receive


@csrf_exempt  # authenticated by the provider's HMAC signature, not a browser session
@require_POST
def inbound_event_hook(request: HttpRequest, provider: str) -> JsonResponse:
    """`POST /hooks/<provider>/events` — see `jobs.inbound` for the signature
    scheme, the body and the status codes."""
    try:
        receipt = inbound_event_receive(
            provider=provider,
            body=request.body,
            timestamp=request.headers.get("X-Signature-Timestamp"),
            signature=request.headers.get("X-Signature"),
        )
    except InboundRejected as exc:
        return JsonResponse({"error": str(exc)}, status=exc.http_status)
    return JsonResponse(
        {"status": receipt.status, "inbound_event": receipt.event.pk},
        status=200 if receipt.status == "duplicate" else 202,
    )
