"""The job state machine: the one place that says which transitions exist.

Every change of `Job.state` is one of the named transitions below. The Store
checks the table before it writes and puts the allowed source states into the
UPDATE's WHERE clause, so the database refuses a racing illegal change too.
"""

from dataclasses import dataclass

from django.db import models

from .errors import InvalidTransition


class State(models.TextChoices):
    READY = "READY", "Ready"
    LEASED = "LEASED", "Leased"
    WAITING_EXTERNAL = "WAITING_EXTERNAL", "Waiting (external)"
    WAITING_REVIEW = "WAITING_REVIEW", "Waiting (review)"
    DONE = "DONE", "Done"
    NEEDS_ATTENTION = "NEEDS_ATTENTION", "Needs attention"
    CANCELLED = "CANCELLED", "Cancelled"


WAITING = frozenset({State.WAITING_EXTERNAL, State.WAITING_REVIEW})
TERMINAL = frozenset({State.DONE, State.CANCELLED})


@dataclass(frozen=True)
class Transition:
    name: str
    sources: frozenset
    targets: frozenset
    fenced: bool  # a worker's write: conditional on (id, lease_epoch, worker_id)


def _t(name, sources, targets, *, fenced=False):
    return Transition(name, frozenset(sources), frozenset(targets), fenced)


_S = State
TRANSITIONS = {
    t.name: t
    for t in [
        _t("claim", [_S.READY], [_S.LEASED]),
        # An expired lease taken over by another worker: the epoch moves on.
        _t("takeover", [_S.LEASED], [_S.LEASED]),
        _t("renew", [_S.LEASED], [_S.LEASED], fenced=True),
        _t("finish", [_S.LEASED], [_S.DONE], fenced=True),
        _t("wait", [_S.LEASED], WAITING, fenced=True),
        # A failed attempt: retry later, ask a reviewer, or ask an operator.
        _t("fail", [_S.LEASED], [_S.READY, _S.WAITING_REVIEW, _S.NEEDS_ATTENTION], fenced=True),
        # A worker hands the job back untouched (shutdown before it started work).
        _t("release", [_S.LEASED], [_S.READY], fenced=True),
        # An expired lease found by the recovery sweep.
        _t("recover", [_S.LEASED], [_S.READY, _S.NEEDS_ATTENTION]),
        # A reply, a timer or a reviewer's approval ends a wait.
        _t("resume", WAITING, [_S.READY]),
        # Reviewer decisions: approve as is, approve a corrected
        # payload, or reject (closed, the note is the reason).
        _t("approve", [_S.WAITING_REVIEW], [_S.READY]),
        _t("correct", [_S.WAITING_REVIEW], [_S.READY]),
        _t("reject", [_S.WAITING_REVIEW], [_S.CANCELLED]),
        # Operator decisions (admin): retry, mark resolved with evidence, cancel.
        _t("retry", [_S.NEEDS_ATTENTION, _S.WAITING_REVIEW], [_S.READY]),
        _t("resolve", [_S.NEEDS_ATTENTION, _S.WAITING_REVIEW], [_S.DONE]),
        _t("escalate", [_S.READY, *WAITING], [_S.NEEDS_ATTENTION]),
        _t("cancel", [_S.READY, _S.NEEDS_ATTENTION, *WAITING], [_S.CANCELLED]),
    ]
}


def transition(name: str, source: str | None, target: str) -> Transition:
    """Return the named transition after checking `source → target` against the
    table (`source=None` checks only the target). Raises `InvalidTransition`."""
    try:
        t = TRANSITIONS[name]
    except KeyError:
        raise InvalidTransition(f"unknown transition {name!r}") from None
    if target not in t.targets:
        raise InvalidTransition(f"{name}: cannot move a job to {target}")
    if source is not None and source not in t.sources:
        raise InvalidTransition(f"{name}: a {source} job cannot move to {target}")
    return t
