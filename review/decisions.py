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

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q

from durable.numbers import NumberRefused, whole_number
from jobs import access, interventions
from jobs.access import DecisionRefused, decision_logged
from jobs.actions import action_spec
from jobs.clock import db_now
from jobs.models import Job, JobEvent, ReviewDeadline, Timer
from jobs.payloads import PayloadInvalid, correction_form_class, payload_validate
from jobs.selectors import newest_event
from jobs.states import State
from jobs.store import Conflict
from jobs.timers import timer_cancel_for_job

from .due import SUBJECT as REVIEW_SUBJECT
from .due import review_clock_start
from .policy import POLICY_ACTOR, review_terms

__all__ = ["AlreadyDecided", "DecisionRefused", "register_guard", "guard_refusal", "job_approve", "job_reject",
           "job_correct_and_approve", "CorrectionInvalid", "line_breaks_normalised", "job_retry", "job_resolve",
           "job_cancel", "check_seen", "seen_event_from", "decision_text", "job_for_decision",
           "NOTE_MAX_CHARS", "proposer_of", "approvals_so_far", "job_approval_given_before", "job_reject_by_policy", "APPROVAL_KINDS", "job_timers",
           "timer_run_now", "timer_reschedule", "job_cancel_wait"]

# The longest note or evidence a person may write on a decision: a few
# paragraphs and a pasted line or two of a provider's dashboard. Longer text
# is refused (forms show the limit) rather than stored into every history
# row, log entry and page that repeats it.
NOTE_MAX_CHARS = 4000

EVIDENCE_MISSING = ("evidence is required: say what showed you it is done (a provider's reference, a line of its "
                    "dashboard, a ticket)")
_NOT_SEEN = "the page you decided on did not say which state you saw; reload it"


class AlreadyDecided(DecisionRefused):
    """Someone (or a worker) changed the job after the deciding user saw it."""


class CorrectionInvalid(DecisionRefused):
    """A correction's fields do not pass the form or the action's schema:
    `errors` maps each field name ("" for the whole payload) to its
    messages, for the page to show beside the field."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("the correction is not valid: " + "; ".join(
            f"{name or 'payload'}: {' '.join(messages)}" for name, messages in errors.items()))


def line_breaks_normalised(value):
    """Text with every line break as LF. A browser sends a textarea's breaks
    as CRLF (HTML's form encoding); the payloads we store and the emails we
    send use LF, so a field the reviewer did not touch compares equal, and
    a corrected body is sent with the breaks every other email has."""
    if isinstance(value, str):
        return value.replace("\r\n", "\n").replace("\r", "\n")
    return value


# decision name → functions (job) -> "" or why the decision is refused.
_guards: dict[str, list[Callable[[Job], str]]] = {}


def register_guard(decision: str, guard: Callable[[Job], str]) -> None:
    """Let an app refuse a decision for reasons the review layer cannot see (an
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


def decision_text(text: str | None, *, what: str = "note", required: bool = True, missing: str = "") -> str:
    """A person's free text on a decision (a note, evidence), stripped:
    `DecisionRefused` when it is required and empty, or longer than
    `NOTE_MAX_CHARS` — the one check every decision service makes."""
    text = (text or "").strip()
    if required and not text:
        raise DecisionRefused(missing or f"a {what} is required: say why")
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
        who = newest.by or "the engine"
        raise AlreadyDecided(
            f"already decided by {who} at {newest.created_at:%Y-%m-%d %H:%M:%S %Z} "
            f"({newest.kind}: {newest.from_state} → {newest.to_state}); nothing changed"
        )


def job_for_decision(job_id: int) -> Job:
    """The job, its row locked for a decision in the caller's transaction
    (what another app's decision on it — an operation's, say — holds while it
    checks what the person saw and writes). `Job.DoesNotExist` when gone."""
    return Job.objects.select_for_update().get(pk=job_id)


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
    (`review.bulk`), so the job's timeline links to it."""
    return {"decision": decision, **({"batch": batch} if batch is not None else {})}



# A first approval of two, as is or corrected: the job stays in review.
APPROVAL_KINDS = ("approval", "correction")


def proposer_of(job: Job) -> str:
    """Who proposed the job: the proposal's `proposed_by` in its creation
    event (contract C1), else that event's actor ("" when nobody is named)."""
    created = JobEvent.objects.filter(job_id=job.pk, kind="enqueue").order_by("id").first()
    if created is None:
        return ""
    proposal = (created.detail or {}).get("proposal") if isinstance(created.detail, dict) else None
    return str((proposal or {}).get("proposed_by") or created.actor or "")


def approvals_so_far(job: Job) -> list[JobEvent]:
    """The first approvals that count towards releasing the job as it is
    now, oldest first: of its current stay in review (events of
    `APPROVAL_KINDS` after the newest one that brought it into review,
    index `jobevent_job_id`), none older than the newest correction (a
    correction restarts the approvals: its own author is the first approver
    of the payload it made), and only by people who may still approve the
    job (a reviewer whose role was revoked, deactivated or deleted since no
    longer counts)."""
    entered = (JobEvent.objects.filter(job_id=job.pk, to_state=State.WAITING_REVIEW)
               .exclude(from_state=State.WAITING_REVIEW).order_by("-id").values_list("id", flat=True).first())
    if entered is None:
        return []
    since_correction: list[JobEvent] = []
    for event in JobEvent.objects.filter(job_id=job.pk, id__gt=entered, kind__in=APPROVAL_KINDS).order_by("-id"):
        since_correction.append(event)
        if event.kind == "correction":
            break
    approvers = {u.get_username(): u for u in get_user_model().objects.filter(
        is_active=True, **{f"{get_user_model().USERNAME_FIELD}__in": {e.actor for e in since_correction}})}
    return [e for e in reversed(since_correction)
            if e.actor in approvers and access.may(approvers[e.actor], "approve", job)]


def job_approval_given_before(*, tenant: str, key: str, actor: str, reason: str, required: int,
                              detail: dict | None = None) -> Job:
    """Record an approval `actor` gave before the job existed, on the
    business record whose approval caused it (a quote's, for its email), as
    the first approval of the job's stay in review: the policy of the job's
    action counts it like one given in the console (while `actor` may
    approve), and another person's approval releases the job. The caller
    created the job in WAITING_REVIEW, in its transaction."""
    return interventions.job_note(tenant=tenant, key=key, kind="approval", state=State.WAITING_REVIEW, actor=actor,
                                  reason=reason, detail={"decision": "approve", **(detail or {}),
                                                         "approvals": [actor], "required": required, "approval": 1})


def _approval_stage(job: Job, user, *, correcting: bool = False) -> tuple[int, list[JobEvent]]:
    """(approvals the policy requires, first approvals that count so far),
    after the four-eyes rules: the proposer never approves their own
    proposal, and nobody approves one payload twice. A correction starts the
    count again (`correcting`: no earlier approval is of its payload).
    Raises `DecisionRefused`."""
    username = user.get_username()
    proposer = proposer_of(job)
    if proposer and proposer == username:
        raise DecisionRefused(f"you proposed this item ({proposer}); another reviewer must approve it")
    required = max(1, review_terms(job).approvals)
    earlier = approvals_so_far(job) if required > 1 and not correcting else []
    for event in earlier:
        if event.actor == username:
            raise DecisionRefused(
                f"you approved this item already at {event.created_at:%Y-%m-%d %H:%M:%S %Z}; it needs "
                f"{required} approvals by different people, so the next must come from another reviewer")
    return required, earlier


def _approvals_detail(earlier: list[JobEvent], username: str, required: int) -> dict:
    return {"approvals": [*(e.actor for e in earlier), username], "required": required}


def job_approve(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """A reviewer approves a job waiting for review: READY at once, its
    payload unchanged — or, when the tenant's policy requires two approvals
    and this is the first, recorded as the first approval (the job stays in
    review). The proposer may not approve their own proposal, nor one person
    twice. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""

    def run(job, actor, note):
        required, earlier = _approval_stage(job, user)
        detail = {**_detail("approve", batch), **_approvals_detail(earlier, actor, required)}
        if len(earlier) + 1 < required:
            return interventions.job_note(tenant=job.tenant, key=job.key, kind="approval", state=State.WAITING_REVIEW, reason=note,
                                actor=actor, detail={**detail, "approval": len(earlier) + 1})
        return interventions.job_approve(tenant=job.tenant, key=job.key, reason=note, actor=actor, detail=detail)

    return _decide("approve", job_id=job_id, user=user, note=note, seen_event=seen_event, run=run)


def job_reject_by_policy(*, job_id: int, round: int, due=None) -> dict:
    """The tenant's review policy rejects an item left undecided past its
    second period: the reviewers' `reject` (CANCELLED, the reason on it),
    with the same guards as a person's (an external call in doubt holds it
    back: then it is recorded and left to people), only while the review
    round it was set for still runs. The history row's actor is the policy."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        deadline = ReviewDeadline.objects.filter(job_id=job_id).first()
        if job is None or job.state != State.WAITING_REVIEW or deadline is None or deadline.round != round:
            return {"skipped": "the review ended or its clock restarted"}
        overdue = f"{deadline.overdue_at:%Y-%m-%d %H:%M:%S %Z}" if deadline.overdue_at else "its due time"
        reason = guard_refusal("reject", job)
        if reason:
            interventions.job_note(tenant=job.tenant, key=job.key, kind="policy_reject_held", state=State.WAITING_REVIEW,
                         actor=POLICY_ACTOR, reason=f"not rejected by the review policy: {reason}",
                         detail={"round": round})
            return {"held": reason}
        terms = review_terms(job)
        changed = interventions.job_reject(
            tenant=job.tenant, key=job.key, actor=POLICY_ACTOR,
            reason=f"rejected by the review policy: not decided in time (overdue since {overdue})",
            detail={"decision": "reject", "policy": terms.source, "round": round,
                    "overdue_at": deadline.overdue_at.isoformat() if deadline.overdue_at else None})
    return {"rejected": changed.key}


def job_reject(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """A reviewer rejects a job waiting for review: CANCELLED, with the note
    as its reason (refused by a registered guard while an external call of
    the job is in doubt). Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _decide("reject", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: interventions.job_reject(tenant=job.tenant, key=job.key, reason=note, actor=actor,
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
    provider. Under a two-approval policy a correction restarts the
    approvals: it is the first approval of the payload it makes (the job
    stays in review with it, whoever approved the payload before), and
    another reviewer's approval of the corrected payload releases it.
    Raises `DecisionRefused` (also for invalid or unchanged fields, the
    proposer's own proposal),
    `AlreadyDecided`, `Http404`.
    """

    def run(job, actor, note):
        required, earlier = _approval_stage(job, user, correcting=True)
        form = correction_form(job, data)
        if form is None:
            raise DecisionRefused(f"action {job.action} declares no correctable fields; approve or reject it")
        if not form.is_valid():
            raise CorrectionInvalid({name: list(errors) for name, errors in form.errors.items()})
        before = job.payload if isinstance(job.payload, dict) else {}
        after = {name: line_breaks_normalised(value) for name, value in form.cleaned_data.items()}
        correction = {name: {"before": before.get(name), "after": value}
                      for name, value in after.items() if before.get(name) != value}
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
                errors: dict[str, list[str]] = {}
                for error in exc.errors:
                    errors.setdefault(error["loc"][0] if error["loc"] else "", []).append(error["msg"])
                raise CorrectionInvalid(errors) from None
        detail = {"decision": "correct", "correction": correction, "revision": revision,
                  **_approvals_detail(earlier, actor, required)}
        if len(earlier) + 1 < required:
            # The first approval of the corrected payload: it waits for a
            # second person; the clock goes on unless the policy restarts it.
            changed = interventions.job_note(tenant=job.tenant, key=job.key, kind="correction", state=State.WAITING_REVIEW,
                                   reason=note, actor=actor, payload=payload,
                                   detail={**detail, "approval": len(earlier) + 1})
            if review_terms(job).reset_on_correction:
                review_clock_start(job=changed, at=changed.events.order_by("-id").first().created_at,
                                   reason="corrected")
            return changed
        return interventions.job_correct(tenant=job.tenant, key=job.key, payload=payload, reason=note, actor=actor, detail=detail)

    return _decide("correct", job_id=job_id, user=user, note=note, seen_event=seen_event, run=run)


def job_retry(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """An operator sends a job that needs attention back to work now, with a
    fresh attempt budget. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _decide("retry", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: interventions.job_retry(tenant=job.tenant, key=job.key, reason=note, actor=actor,
                                                              detail=_detail("retry", batch)))


def job_resolve(*, job_id: int, user, note: str, seen_event: int | None, evidence: str) -> Job:
    """An operator marks a job that needs attention fulfilled (DONE), with
    the note and the evidence they looked at. Refused (by a registered
    guard) while one of its external calls is in doubt: that goes through
    the decision on the call, so none is ever stranded. The evidence is
    required: "resolved" without what showed it is no evidence. Raises
    `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    evidence = decision_text(evidence, what="evidence", missing=EVIDENCE_MISSING)
    return _decide("resolve", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: interventions.job_resolve(tenant=job.tenant, key=job.key, reason=note, actor=actor,
                                                                detail={"decision": "resolve",
                                                                        "evidence": evidence}))


def job_cancel(*, job_id: int, user, note: str, seen_event: int | None, batch: int | None = None) -> Job:
    """An operator cancels a job that needs attention, the note as its
    reason. Refused (by a registered guard) while one of its external calls
    is in doubt, as resolving is: the decision on the call can cancel the
    job too. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _decide("cancel", job_id=job_id, user=user, note=note, seen_event=seen_event,
                   run=lambda job, actor, note: interventions.job_cancel(tenant=job.tenant, key=job.key, reason=note, actor=actor,
                                                               detail=_detail("cancel", batch)))


# ---------------------------------------------------------------- waits and timers (operators)


def job_timers(job: Job):
    """The pending timers that may wake or act on `job`: its own (a wait's
    wake-up) and its review's (`review.due`), soonest first (among the
    PENDING timers only: partial indexes `timer_pending_due`, `timer_pending_subject`)."""
    return (Timer.objects.filter(state=Timer.Status.PENDING, tenant=job.tenant)
            .filter(Q(job_id=job.pk) | Q(subject_type=REVIEW_SUBJECT, subject_id=str(job.pk)))
            .order_by("scheduled_for", "id"))


def _timer_of(job: Job, timer_id: int) -> Timer:
    # Locked after the job (the order every path takes: job, then its
    # timers), so a sweep that holds it is waited for and its outcome seen.
    timer = job_timers(job).select_for_update().filter(pk=timer_id).first()
    if timer is None:
        raise AlreadyDecided(f"timer {timer_id} of this job is no longer pending (it fired or was cancelled); "
                             f"nothing changed")
    return timer


def _move_timer(decision: str, *, job_id: int, timer_id: int, user, note: str, seen_event: int | None,
                scheduled_for, kind: str) -> Job:
    def run(job, actor, note):
        timer = _timer_of(job, timer_id)
        before = timer.scheduled_for
        timer.scheduled_for = scheduled_for or db_now()
        timer.save(update_fields=["scheduled_for"])
        try:
            return interventions.job_note(tenant=job.tenant, key=job.key, kind=kind, state=job.state, actor=actor, reason=note,
                                detail={"timer": timer.pk, "reason": timer.reason, "before": before.isoformat(),
                                        "after": timer.scheduled_for.isoformat()})
        except Conflict as exc:
            raise AlreadyDecided(str(exc)) from None

    return _decide(decision, job_id=job_id, user=user, note=note, seen_event=seen_event, run=run)


def timer_run_now(*, job_id: int, timer_id: int, user, note: str, seen_event: int | None) -> Job:
    """An operator makes one of the job's pending timers due now (the next
    sweep of any worker fires it, re-reading its subject as always); the job
    stays as it is until then. Audited on the job (`timer_run_now`, actor,
    before → after). Refused when the job moved since the operator's page,
    or the timer is no longer pending. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    return _move_timer("run_timer", job_id=job_id, timer_id=timer_id, user=user, note=note,
                       seen_event=seen_event, scheduled_for=None, kind="timer_run_now")


def timer_reschedule(*, job_id: int, timer_id: int, user, note: str, seen_event: int | None, scheduled_for) -> Job:
    """An operator moves one of the job's pending timers to `scheduled_for`
    (an aware datetime, not in the past: a timer fires at the time it
    names, and what it marks is dated by it), audited as `timer_rescheduled`;
    refused as `timer_run_now` is. Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""
    if scheduled_for is None or scheduled_for.tzinfo is None:
        raise DecisionRefused("say when the timer should fire (a date and time, UTC)")
    if scheduled_for < db_now():
        raise DecisionRefused(f"{scheduled_for:%Y-%m-%d %H:%M} UTC has passed: choose a later time, "
                              f"or run the timer now")
    return _move_timer("reschedule_timer", job_id=job_id, timer_id=timer_id, user=user, note=note,
                       seen_event=seen_event, scheduled_for=scheduled_for, kind="timer_rescheduled")


def job_cancel_wait(*, job_id: int, user, note: str, seen_event: int | None) -> Job:
    """An operator ends a job's external wait (a reply or a timer that will
    not come, or is no longer wanted): CANCELLED with the note as its reason,
    its pending timers cancelled in the same transaction. Refused while an
    external call of the job is in doubt (the guards registered for
    `cancel`). Raises `DecisionRefused`/`AlreadyDecided`, `Http404`."""

    def run(job, actor, note):
        reason = guard_refusal("cancel", job)
        if reason:
            raise DecisionRefused(reason)
        changed = interventions.job_cancel(tenant=job.tenant, key=job.key, reason=note, actor=actor, detail={"decision": "cancel_wait"})
        timer_cancel_for_job(job_id=job.pk, reason=f"the wait was cancelled by {actor}: {note}")
        return changed

    return _decide("cancel_wait", job_id=job_id, user=user, note=note, seen_event=seen_event, run=run)
