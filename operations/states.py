"""The operation state machine: the one place that says how an operation's
state may change, and the one function that changes it with its history row.

    INTENDED ──accept──▶ ACCEPTED            (the provider holds it; terminal)
       │  ├──unknown──▶ UNKNOWN ──resend/lookup miss──▶ INTENDED
       │  │      (a lookup miss before the handler decides whether to send
       │  │       at all — `protocol.operation_settle` — ──▶ FAILED)
       │  ├──reject───▶ REJECTED ──send again after review──▶ INTENDED
       │  ├──fail─────▶ FAILED ──send again──▶ INTENDED
       │  └──investigate──▶ NEEDS_INVESTIGATION ──human──▶ ACCEPTED | FAILED
       └── (resend recorded) ──▶ INTENDED

An event that changes no state (a failed lookup, a refused lookup) is always
allowed: it only adds evidence.
"""

from .errors import OperationStateError
from .models import Operation, OperationEvent, OperationState

S = OperationState

TRANSITIONS: dict[str, frozenset[str]] = {
    S.INTENDED: frozenset({S.INTENDED, S.ACCEPTED, S.UNKNOWN, S.REJECTED, S.FAILED, S.NEEDS_INVESTIGATION}),
    S.UNKNOWN: frozenset({S.INTENDED, S.ACCEPTED, S.NEEDS_INVESTIGATION, S.FAILED}),
    S.REJECTED: frozenset({S.INTENDED}),
    S.FAILED: frozenset({S.INTENDED}),
    S.NEEDS_INVESTIGATION: frozenset({S.ACCEPTED, S.FAILED}),
    S.ACCEPTED: frozenset(),
}


def operation_transition(
    operation: Operation,
    kind: str,
    *,
    to_state: str = "",
    actor: str,
    epoch: int = 0,
    reason: str = "",
    detail: dict | None = None,
    **changes,
) -> None:
    """Change `operation` (inside the caller's transaction) and append its
    event. `to_state=""` records evidence without a state change.

    Raises `OperationStateError` for a change the table does not allow;
    nothing is written then."""
    from_state = operation.state
    if to_state and to_state not in TRANSITIONS[from_state]:
        raise OperationStateError(f"operation {operation.id}: {kind} cannot move it from {from_state} to {to_state}")
    if to_state:
        operation.state = to_state
    for field, value in changes.items():
        setattr(operation, field, value)
    operation.save(update_fields=["state", "updated_at", *changes])
    OperationEvent.objects.create(operation=operation, kind=kind, from_state=from_state, to_state=operation.state,
                                  actor=actor, epoch=epoch, reason=reason, detail=detail or {})
