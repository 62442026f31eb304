"""Effect limits and pauses, checked where every operation is dispatched.

`operations.protocol` asks `dispatch_gate` under the job's fence before it
records a new intent — the one path by which anything reaches a provider —
so nothing goes around it:

- a registered dispatch guard (an app above: "this agent is paused") or a
  paused `ActionLimit` *holds* the job: it waits (WAITING_EXTERNAL, the
  reason visible on the job) and a `DispatchHold` row remembers why, so
  lifting the pause resumes it at once (`dispatch_holds_release`); it also
  re-checks by itself every `OPERATIONS_HOLD_RECHECK_SECONDS`;
- an `ActionLimit` whose rolling window is full makes the job wait until the
  oldest operation counted leaves the window.

Either way the job is `Deferred`: the attempt is handed back, nothing is
sent, nothing is dropped; an operation already recorded (in doubt, to be
reconciled) is never held — it may already be at the provider.

Counts come from the operations table itself (durable across restarts): is
there a `max_effects`-th newest intent of (tenant, action) since the window
began? The index `operation_effect_limit` answers it walking at most
`max_effects` entries, however many operations the table holds. The
`ActionLimit` row is locked while counting and recording the intent (lock
order: the job's row — the fence — then the limit's), so N concurrent
workers admit exactly `max_effects`.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.errors import Deferred, InvalidTransition, JobNotFound
from jobs.selectors import job_locked
from jobs.states import State
from jobs.store import Store

from .models import ActionLimit, DispatchHold, Operation

__all__ = ["Hold", "register_dispatch_guard", "dispatch_gate", "dispatch_holds_release", "action_limit_set",
           "action_pause", "action_resume", "action_paused", "window_full_since"]


@dataclass(frozen=True)
class Hold:
    """A dispatch guard's answer: hold this job. `cause` names what holds it
    (released together by `dispatch_holds_release`), `reason` is shown on the job."""

    cause: str
    reason: str


# function(job) -> Hold | None, asked before each new intent (in the fence's transaction).
_guards: list[Callable] = []


def register_dispatch_guard(guard: Callable) -> None:
    """Let an app above hold jobs back from dispatch for reasons operations
    cannot see (an agent paused by its operator). Registering twice is harmless."""
    if guard not in _guards:
        _guards.append(guard)


def _recheck_at():
    return timezone.now() + timedelta(seconds=float(getattr(settings, "OPERATIONS_HOLD_RECHECK_SECONDS", 300)))


def _hold(job, hold: Hold) -> Deferred:
    DispatchHold.objects.update_or_create(tenant=job.tenant, job_key=job.key,
                                          defaults={"cause": hold.cause, "reason": hold.reason})
    # Asked when the worker records the wait (the job's row locked first,
    # then the hold's, as here): a pause lifted since deleted the hold and
    # could not resume a job still LEASED, so the job must not wait.
    still = DispatchHold.objects.select_for_update().filter(tenant=job.tenant, job_key=job.key, cause=hold.cause)
    return Deferred(hold.reason, wake_at=_recheck_at(), held=lambda: still.first() is not None)


def window_full_since(limit: ActionLimit, *, now):
    """When the window of `limit` filled up — the creation time of the
    `max_effects`-th newest intent counted in it — or None while there is
    room. The database walks at most `max_effects` entries of the index
    `operation_effect_limit` (newest first) and returns one row, however
    many operations the table holds."""
    since = now - timedelta(seconds=limit.window_seconds)
    if limit.max_effects == 0:
        return since  # nothing is ever allowed (`dispatch_gate` holds the job instead)
    recent = (Operation.objects.filter(tenant=limit.tenant, action=limit.action, created_at__gt=since)
              .order_by("-created_at").values_list("created_at", flat=True))
    return recent[limit.max_effects - 1 : limit.max_effects].first()


def dispatch_gate(job) -> Deferred | None:
    """Whether `job` may record a new intent now: None, or the `Deferred` to
    raise once the caller's transaction (the fence's) has committed — with
    a hold recorded in it. Must run inside that transaction."""
    for guard in _guards:
        hold = guard(job)
        if hold is not None:
            return _hold(job, hold)
    limit = ActionLimit.objects.select_for_update().filter(tenant=job.tenant, action=job.action).first()
    if limit is not None and limit.paused:
        why = f": {limit.paused_reason}" if limit.paused_reason else ""
        return _hold(job, Hold(f"action:{job.action}",
                               f"held: action {job.action} is paused for tenant {job.tenant}{why}; nothing was "
                               f"sent. It goes on when an operator resumes the action."))
    if limit is not None and limit.max_effects == 0:
        # None allowed: no window ever opens, so the job is held (waiting
        # once, not claimed again and again) until the limit is raised.
        return _hold(job, Hold(_none_allowed(job.action),
                               f"held: tenant {job.tenant} allows no {job.action} (its effect limit is 0); nothing "
                               f"was sent. It goes on when an operator raises the limit."))
    if limit is not None and limit.max_effects is not None:
        now = timezone.now()
        full_since = window_full_since(limit, now=now)
        if full_since is not None:
            opens = max(full_since + timedelta(seconds=limit.window_seconds), now)
            return Deferred(f"effect limit: tenant {job.tenant} allows {limit.max_effects} {job.action} per "
                            f"{_span(limit.window_seconds)} and the window is full; nothing was sent. Waits until "
                            f"{opens:%Y-%m-%d %H:%M:%S} UTC, when the oldest counted one leaves the window.",
                            wake_at=opens)
    # Admitted: whatever held it before no longer does.
    DispatchHold.objects.filter(tenant=job.tenant, job_key=job.key).delete()
    return None


def _span(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def dispatch_holds_release(*, tenant: str, cause: str, actor: str, reason: str) -> int:
    """Resume the jobs `cause` holds in `tenant` (the pause was lifted);
    returns how many were resumed. A held job that is no longer waiting on
    its hold (it moved on meanwhile, e.g. to wait for a reply) is left
    alone; the hold is forgotten either way. A job its worker still holds
    is not waiting yet: its worker finds the hold gone when it records the
    wait and hands the job back at once instead (`Store.defer`). Each job
    is its own short transaction, its row locked before its hold's (the
    order of the fence and `dispatch_gate`), so the job cannot move on
    between the check and the resume."""
    resumed = 0
    for hold in DispatchHold.objects.filter(tenant=tenant, cause=cause).order_by("id").iterator():
        with transaction.atomic():
            job = job_locked(tenant=tenant, key=hold.job_key)
            if not DispatchHold.objects.filter(pk=hold.pk, cause=cause).delete()[0]:
                continue  # held again by something else, or released meanwhile
            if job is None or job.state != State.WAITING_EXTERNAL or job.wait_reason != hold.reason[:500]:
                continue
            try:
                Store().resume(tenant, hold.job_key, reason=reason, actor=actor, detail={"released": cause})
            except (InvalidTransition, JobNotFound):
                continue  # it moved on between the read and the resume
            resumed += 1
    return resumed


# ---------------------------------------------------------------- services


def _locked_limit(tenant: str, action: str) -> ActionLimit:
    limit, _ = ActionLimit.objects.select_for_update().get_or_create(tenant=tenant, action=action)
    return limit


def _none_allowed(action: str) -> str:
    """The hold cause of a limit of 0 on `action`."""
    return f"limit:{action}"


def action_limit_set(*, tenant: str, action: str, max_effects: int | None, window_seconds: int = 24 * 3600,
                     actor: str) -> ActionLimit:
    """At most `max_effects` new operations of `action` per rolling
    `window_seconds` for `tenant` (None: no limit; 0: none at all, the jobs
    are held). A limit above 0, or none, resumes the jobs a limit of 0
    held. Raises `ValueError` for a negative limit or a window under one
    second."""
    if max_effects is not None and max_effects < 0:
        raise ValueError(f"max_effects must be 0 or more, not {max_effects}")
    if window_seconds < 1:
        raise ValueError(f"window_seconds must be at least 1, not {window_seconds}")
    with transaction.atomic():
        limit = _locked_limit(tenant, action)
        limit.max_effects, limit.window_seconds, limit.updated_by = max_effects, window_seconds, actor
        limit.save()
    if max_effects != 0:
        shown = "no limit" if max_effects is None else f"{max_effects} per {_span(window_seconds)}"
        dispatch_holds_release(tenant=tenant, cause=_none_allowed(action), actor=actor,
                               reason=f"effect limit of {action} raised to {shown} by {actor}")
    return limit


@transaction.atomic
def action_pause(*, tenant: str, action: str, reason: str, actor: str) -> ActionLimit:
    """Hold every job of `action` in `tenant` that has not dispatched yet;
    what has is reconciled as usual."""
    limit = _locked_limit(tenant, action)
    limit.paused, limit.paused_reason, limit.updated_by = True, reason.strip(), actor
    limit.save()
    return limit


def action_resume(*, tenant: str, action: str, actor: str, note: str = "") -> tuple[ActionLimit, int]:
    """Lift the pause and resume the jobs it held; returns the limit and how
    many jobs were resumed."""
    with transaction.atomic():
        limit = _locked_limit(tenant, action)
        limit.paused, limit.paused_reason, limit.updated_by = False, "", actor
        limit.save()
    released = dispatch_holds_release(tenant=tenant, cause=f"action:{action}", actor=actor,
                                      reason=f"action {action} resumed by {actor}{': ' + note if note else ''}")
    return limit, released


def action_paused(*, tenant: str, action: str) -> bool:
    """Is `action` paused for `tenant` (constraint `action_limit_unique`)?"""
    return ActionLimit.objects.filter(tenant=tenant, action=action, paused=True).exists()
