"""Human decisions on jobs (DESIGN §14): reviewers approve, correct-and-approve
or reject `WAITING_REVIEW` items; operators retry, resolve with evidence or
cancel `NEEDS_ATTENTION` items.

Every decision here:
- is taken by a user, with a required note (and any evidence) of at most
  `NOTE_MAX_CHARS` characters, on the job *as that user saw it*
  (`seen_event`: the id of the newest history row on their page, required)
  — when the job has moved since, it is refused with "already decided by …
  at …" and nothing changes, so of two people deciding at once exactly one
  wins; a decision that does not say what its person saw is refused;
- is allowed only by `jobs.access` (permission + role in the job's tenant +
  the job's state) and by the guards other apps register for it (e.g. the
  app recording external calls refuses to resolve, cancel or reject a job
  whose call is in doubt);
- is one transition of `states.py` through the Store, and writes its
  `JobEvent` (actor, note, from → to, epoch) and an admin `LogEntry` in the
  same transaction.
"""

from collections.abc import Callable

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction

from durable.numbers import NumberRefused, whole_number

from . import access
from .access import DecisionRefused
from .actions import action_spec
from .models import Job
from .payloads import PayloadInvalid, correction_form_class, payload_validate
from .selectors import newest_event
from .store import Store

__all__ = ["AlreadyDecided", "DecisionRefused", "register_guard", "guard_refusal", "job_approve", "job_reject",
           "job_correct_and_approve", "job_retry", "job_resolve", "job_cancel", "decision_logged", "check_seen",
           "seen_event_from", "decision_text", "job_for_decision", "NOTE_MAX_CHARS"]

# The longest note or evidence a person may write on a decision: a few
# paragraphs and a pasted line or two of a provider's dashboard. Longer text
# is refused (forms show the limit) rather than stored into every history
# row, log entry and page that repeats it.
NOTE_MAX_CHARS = 4000

_NOT_SEEN = "the page you decided on did not say which state you saw; reload it"


class AlreadyDecided(DecisionRefused):
    """Someone (or a worker) changed the job after the deciding user saw it."""


# decision name → functions (job) -> "" or why the decision is refused.
_guards: dict[str, list[Callable[[Job], str]]] = {}


def register_guard(decision: str, guard: Callable[[Job], str]) -> None:
    """Let an app refuse a decision for reasons the engine cannot see (an
    operation in doubt, say). Registering the same function twice is harmless."""
    guards = _guards.setdefault(decision, [])
    if guard not in guards:
        guards.append(guard)


def guard_refusal(decision: str, job: Job) -> str:
    """Why a registered guard refuses `decision` on `job` now ("" when none
    does) — what the decision page says instead of offering it."""
    for guard in _guards.get(decision, []):
        reason = guard(job)
        if reason:
            return reason
    return ""


def decision_text(text: str | None, *, what: str = "note", required: bool = True) -> str:
    """A person's free text on a decision (a note, evidence), stripped:
    `DecisionRefused` when it is required and empty, or longer than
    `NOTE_MAX_CHARS` — the one check every decision service makes."""
    text = (text or "").strip()
    if required and not text:
        raise DecisionRefused(f"a {what} is required: say why")
    if len(text) > NOTE_MAX_CHARS:
        raise DecisionRefused(f"the {what} is {len(text):,} characters long; write at most {NOTE_MAX_CHARS} "
                              f"characters (link to a longer record instead)")
    return text


def seen_event_from(text) -> int:
    """The `seen_event` a decision form sent (the id of the newest history
    row its page showed), read strictly: `DecisionRefused` when it is
    missing or not an event id."""
    try:
        return whole_number(text, minimum=1)
    except NumberRefused:
        raise DecisionRefused(_NOT_SEEN) from None


def check_seen(job: Job, seen_event: int | None) -> None:
    """`AlreadyDecided` unless the job's newest history row is `seen_event`;
    `DecisionRefused` when the caller does not say which state it saw
    (None): every decision is conditional on it, a script's too."""
    if seen_event is None:
        raise DecisionRefused(_NOT_SEEN)
    newest = newest_event(job.pk)
    if newest is not None and newest.id != seen_event:
        who = newest.actor or newest.worker_id or "the engine"
        raise AlreadyDecided(
            f"already decided by {who} at {newest.created_at:%Y-%m-%d %H:%M:%S %Z} "
            f"({newest.kind}: {newest.from_state} → {newest.to_state}); nothing changed"
        )


def job_for_decision(job_id: int) -> Job:
    """The job, its row locked for a decision in the caller's transaction
    (what another app's decision on it — an operation's, say — holds while it
    checks what the person saw and writes). `Job.DoesNotExist` when gone."""
    return Job.objects.select_for_update().get(pk=job_id)


def decision_logged(*, user, obj, message: str) -> None:
    """The admin's History entry for a decision (same transaction as it)."""
    LogEntry.objects.log_actions(user.pk, [obj], CHANGE, change_message=message, single_object=True)


def _decide(decision: str, *, job_id: int, user, note: str, seen_event: int | None, run) -> Job:
    """Lock the job, check what the user saw, who they are and the guards,
    then `run(job, actor, note)` (one Store transition) and log it."""
    note = decision_text(note)
    # The outermost transaction: a decision nested in another one could be
    # rolled back after the person was told it was taken.
    with transaction.atomic(durable=True):
        job = access.get_visible_or_404(Job.objects.select_for_update(), user, pk=job_id)
        check_seen(job, seen_event)
        access.require(user, decision, job)
        reason = guard_refusal(decision, job)
        if reason:
            raise DecisionRefused(reason)
        changed = run(job, user.get_username(), note)
        decision_logged(user=user, obj=changed,
                        message=f"{access.DECISIONS[decision].label}: {job.state} → {changed.state}. {note}")
    return changed


def _detail(decision: str, batch: int | None) -> dict:
    """The decision's event detail; a bulk decision's names its batch
    (`jobs.bulk`), so the job's timeline links to it."""
    return {"decision": decision, **({"batch": batch} if batch is not None else {})}


def job_approve(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """A reviewer approves a job waiting for review: READY at once, its
    payload unchanged. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _decide("approve", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: Store().approve(job.tenant, job.key, reason=note, actor=actor,
                                                                detail=_detail("approve", batch)))


def job_reject(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """A reviewer rejects a job waiting for review: CANCELLED, with the note
    as its reason (refused by a registered guard while an external call of
    the job is in doubt). Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _decide("reject", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: Store().reject(job.tenant, job.key, reason=note, actor=actor,
                                                               detail=_detail("reject", batch)))


def correction_form(job: Job, data=None):
    """The form of the fields a reviewer may correct on `job` (the job's
    action declares it), bound to `data` or filled from the payload; None
    when the action declares none."""
    form_class = correction_form_class(job.action)
    if form_class is None:
        return None
    payload = job.payload if isinstance(job.payload, dict) else {}
    return form_class(data=data, initial={name: payload.get(name) for name in form_class.base_fields},
                      prefix="correct")


def job_correct_and_approve(*, job_id: int, user, note: str, seen_event: int | None, data) -> Job:
    """A reviewer corrects the fields the job's action lets them edit (its
    `review_form`, validated) and approves: READY with the corrected payload.

    The correction is recorded on the job's event (`detail["correction"]`:
    field → before/after) and the payload's `revision` goes up by one, so the
    handler performs the corrected request as a new operation (a new id);
    earlier ones stay as evidence. Refused (by the guards other apps
    register) while any external call of the job may have reached the
    provider. Raises `DecisionRefused` (also for invalid or unchanged
    fields), `AlreadyDecided`, `Http404`.
    """

    def run(job, actor, note):
        form = correction_form(job, data)
        if form is None:
            raise DecisionRefused(f"action {job.action} declares no correctable fields; approve or reject it")
        if not form.is_valid():
            problems = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
            raise DecisionRefused(f"the correction is not valid: {problems}")
        before = job.payload if isinstance(job.payload, dict) else {}
        correction = {name: {"before": before.get(name), "after": value}
                      for name, value in form.cleaned_data.items() if before.get(name) != value}
        if not correction:
            raise DecisionRefused("nothing was corrected; approve it as it is, or change a field")
        revision = int(before.get("revision") or 1) + 1
        payload = {**before, **{name: c["after"] for name, c in correction.items()}, "revision": revision}
        spec = action_spec(job.action)
        if spec is not None and spec.schema is not None:
            # The action's one schema has the last word on the whole payload.
            try:
                payload = payload_validate(job.action, payload)
            except PayloadInvalid as exc:
                raise DecisionRefused(f"the correction is not valid: {exc}") from None
        return Store().correct(job.tenant, job.key, payload=payload, reason=note, actor=actor,
                               detail={"decision": "correct", "correction": correction, "revision": revision})

    return _decide("correct", job_id=job_id, user=user, note=note, seen_event=seen_event, run=run)


def job_retry(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """An operator sends a job that needs attention back to work now, with a
    fresh attempt budget. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _decide("retry", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: Store().retry(job.tenant, job.key, reason=note, actor=actor,
                                                              detail=_detail("retry", batch)))


def job_resolve(*, job_id: int, user, note: str, seen_event: int | None, evidence: str = "") -> Job:
    """An operator marks a job that needs attention fulfilled (DONE), with
    the note and the evidence they looked at. Refused (by a registered
    guard) while one of its external calls is in doubt: that goes through
    the decision on the call, so none is ever stranded. Raises `DecisionRefused`/`AlreadyDecided`,
    `Http404`."""
    evidence = decision_text(evidence, what="evidence", required=False)
    return _decide("resolve", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: Store().resolve(job.tenant, job.key, reason=note, actor=actor,
                                                                detail={"decision": "resolve",
                                                                        "evidence": evidence}))


def job_cancel(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """An operator cancels a job that needs attention, the note as its
    reason. Refused (by a registered guard) while one of its external calls
    is in doubt, as resolving is: the decision on the call can cancel the
    job too. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _decide("cancel", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: Store().cancel(job.tenant, job.key, reason=note, actor=actor,
                                                               detail=_detail("cancel", batch)))
