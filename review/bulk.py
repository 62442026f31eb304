"""Bulk decisions over a queue's query (DESIGN §16): a preview fixes the
set, then each item is decided through the single-decision service.

- `batch_preview` takes the oldest `BULK_MAX` items of the query the caller
  built (already narrowed to the user's tenants) and records each with the
  newest history row it had then — the state the person is shown. It
  returns the batch, whose `token` the preview page's form carries.
- `batch_take` decides each recorded item with `decisions.job_approve` /
  `job_reject` / `job_retry` / `job_cancel`, passing the recorded history
  row as `seen_event`: the very checks of a single decision (permission,
  role and tenant of *this* user, the item's state, the guards, the note)
  run for every item, so a bulk path can never skip one. An item that moved
  since the preview is skipped (`AlreadyDecided`), one the rules refuse is
  counted as refused with the reason; neither changes anything.

Each item is its own transaction (a decision is `atomic(durable=True)`):
the batch is claimed first, so a second POST of the same token decides
nothing while the first runs, and each decided job's event names the batch.
What became of each item is recorded as it is taken, and read back from the
items' histories (the events naming the batch) at each take and at its end,
so a batch cut off half-way says which items it decided, and its user takes
it again for the rest. Under a two-approver policy, an approval that is the
first of two is counted as such (`first_approvals`), not as decided.
"""

import secrets
from datetime import timedelta

from django.db import DatabaseError, transaction
from django.db.models import Max, QuerySet
from django.http import Http404
from django.utils import timezone

from jobs.access import ATTENTION_QUEUE, REVIEW_QUEUE, DecisionRefused
from jobs.errors import JobError
from jobs.models import DecisionBatch, JobEvent

from . import decisions

__all__ = ["BULK_MAX", "BULK_DECISIONS", "BULK_STALE", "batch_preview", "batch_take", "BatchRefused"]

# The most items one bulk decision takes: a page a person can still sample
# and a run that ends within a request (~500 single decisions). A larger
# match is cut to its oldest BULK_MAX and the preview says so.
BULK_MAX = 500

# queue (the state of its items) → decision → the single-decision service.
BULK_DECISIONS = {
    REVIEW_QUEUE: {"approve": decisions.job_approve, "reject": decisions.job_reject},
    ATTENTION_QUEUE: {"retry": decisions.job_retry, "cancel": decisions.job_cancel},
}


class BatchRefused(DecisionRefused):
    """The batch cannot be taken (unknown or used token, another user's
    preview, a decision its queue does not offer). Nothing was decided."""


def batch_preview(*, user, queue: str, jobs: QuerySet, query: dict) -> tuple[DecisionBatch, int]:
    """Fix the set of `jobs` (the queue's filtered items, oldest first, in
    the user's scope) for a bulk decision: its oldest `BULK_MAX` items, each
    with the id of its newest history row. Returns the batch and how many
    items matched in all (more than `BULK_MAX` means the batch is cut)."""
    if queue not in BULK_DECISIONS:
        raise BatchRefused(f"no bulk decisions on {queue} items")
    matched = jobs.count()
    ids = list(jobs.order_by("updated_at", "id").values_list("id", flat=True)[:BULK_MAX])
    # The newest history row of each (index jobevent_job_id), one query.
    seen = dict(JobEvent.objects.filter(job_id__in=ids).values("job_id").annotate(newest=Max("id"))
                .values_list("job_id", "newest"))
    items = [[job_id, seen.get(job_id)] for job_id in ids]
    tenants = sorted(set(jobs.model.objects.filter(pk__in=ids).values_list("tenant", flat=True)))
    batch = DecisionBatch.objects.create(token=secrets.token_urlsafe(32), user=user, queue=queue, query=query,
                                         items=items, tenants=tenants)
    return batch, matched


# The outcomes an item can have; an item without one was not taken yet.
DECIDED, FIRST_APPROVAL, MOVED, REFUSED, INTERRUPTED = (
    "decided", "first approval recorded", "moved", "refused", "interrupted")

# How long a batch being taken may go without finishing an item before its
# user may take it again (the request that took it is then taken to be dead:
# a single decision ends well within it, lock waits included).
BULK_STALE = timedelta(seconds=60)


def _claim(*, token: str, user, decision: str, note: str) -> DecisionBatch:
    """Mark the batch TAKING for `user` (a preview, or a batch that was
    interrupted or stalled, with the decision it was taken with)."""
    with transaction.atomic(durable=True):
        batch = DecisionBatch.objects.select_for_update().filter(token=token or "-").first()
        # Another user's token is refused like an unknown one: the set, the
        # state it was seen in and the scope it was chosen in are theirs.
        if batch is None or batch.user_id != user.pk:
            raise BatchRefused("no such bulk preview; open the preview again")
        if batch.status == DecisionBatch.Status.DONE:
            raise BatchRefused(f"this preview was already used (batch {batch.pk}: {batch.decision} at "
                               f"{batch.taken_at:%Y-%m-%d %H:%M:%S %Z}); open the preview again")
        if decision not in BULK_DECISIONS[batch.queue]:
            raise BatchRefused(f"{decision!r} is not a bulk decision of this queue; choose "
                               f"{' or '.join(BULK_DECISIONS[batch.queue])}")
        now = timezone.now()
        if batch.status != DecisionBatch.Status.PREVIEWED:
            if decision != batch.decision:
                raise BatchRefused(f"batch {batch.pk} was taken with {batch.decision!r}; take it again with "
                                   f"{batch.decision!r} for the items left, or open a new preview")
            if batch.status == DecisionBatch.Status.TAKING and batch.progress_at > now - BULK_STALE:
                raise BatchRefused(f"batch {batch.pk} is being taken now (an item was finished at "
                                   f"{batch.progress_at:%Y-%m-%d %H:%M:%S %Z}); its page shows how far it got")
        else:
            batch.decision, batch.note, batch.taken_at = decision, note, now
        batch.status, batch.progress_at = DecisionBatch.Status.TAKING, now
        batch.save(update_fields=["status", "decision", "note", "taken_at", "progress_at"])
    return batch


def _taken(*, stayed: bool) -> str:
    # A decision that left the item in its queue's state recorded a first
    # approval of two; any other released or closed it.
    return FIRST_APPROVAL if stayed else DECIDED


def _outcome_from_history(batch: DecisionBatch) -> dict[str, str]:
    """The batch's outcome with what its items' histories say it decided
    (each decided job's event names the batch): true also for an item whose
    decision committed though the request that took it died before it could
    record it, or that another take of the batch decided."""
    outcome = dict(batch.outcome)
    events = JobEvent.objects.filter(job_id__in=[job_id for job_id, _ in batch.items], detail__batch=batch.pk)
    for job_id, from_state, to_state in events.values_list("job_id", "from_state", "to_state"):
        outcome[str(job_id)] = _taken(stayed=from_state == to_state)
    return outcome


def _record(batch: DecisionBatch, outcome: dict[str, str], *, final: bool) -> DecisionBatch:
    """Write `outcome` on the batch with its counts. Still TAKING unless
    `final`: then DONE once every item has a final outcome, INTERRUPTED
    while one was cut off by an error."""
    kinds = [o.split(":")[0] for o in outcome.values()]
    batch.outcome = outcome
    batch.decided, batch.first_approvals = kinds.count(DECIDED), kinds.count(FIRST_APPROVAL)
    batch.skipped, batch.refused = kinds.count(MOVED), kinds.count(REFUSED)
    if final:
        batch.status = DecisionBatch.Status.INTERRUPTED if batch.unfinished else DecisionBatch.Status.DONE
    batch.progress_at = timezone.now()
    batch.save(update_fields=["outcome", "decided", "first_approvals", "skipped", "refused", "status",
                              "progress_at"])
    return batch


def batch_take(*, token: str, user, decision: str, note: str) -> DecisionBatch:
    """Decide every item of the previewed batch `token` with `decision` and
    `note`, each through its single-decision service as `user`, conditional
    on the history row the preview recorded. Returns the batch with
    `decided`, `first_approvals` (a two-approver policy's first of two: the
    item stays in review), `skipped` (moved since the preview), `refused`
    and the per-item `outcome`, recorded as each item is taken.

    An item cut off by a database error (a deadlock, a lost connection) is
    recorded `interrupted` and the batch ends INTERRUPTED; a request that
    dies leaves it TAKING. Either way its user may take the same token again
    (a TAKING one once it stalled for `BULK_STALE`) with the same decision:
    the items left are decided, with the note the batch was first taken
    with; those decided before are not touched again. Raises `BatchRefused`
    (nothing decided) for an unknown, used or foreign token, a decision the
    queue does not offer (or another than the batch was taken with), a batch
    being taken now, or an empty or over-long note."""
    note = decisions.decision_text(note)
    batch = _claim(token=token, user=user, decision=decision, note=note)
    service = BULK_DECISIONS[batch.queue][decision]
    outcome = _outcome_from_history(batch)
    for job_id, seen_event in batch.items:
        if outcome.get(str(job_id), INTERRUPTED).split(":")[0] != INTERRUPTED:
            continue  # taken before: decided, moved or refused
        try:
            changed = service(job_id=job_id, user=user, note=batch.note, seen_event=seen_event, batch=batch.pk)
        except decisions.AlreadyDecided as exc:
            outcome[str(job_id)] = f"{MOVED}: {exc}"
        except (DecisionRefused, JobError) as exc:
            outcome[str(job_id)] = f"{REFUSED}: {exc}"
        except Http404:
            outcome[str(job_id)] = f"{REFUSED}: no such job in your tenants"
        except DatabaseError as exc:
            outcome[str(job_id)] = f"{INTERRUPTED}: {exc}; take the batch again to decide it"
        else:
            outcome[str(job_id)] = _taken(stayed=changed.state == batch.queue)
        # What became of the item, before the next: a request cut off after
        # this leaves the batch true up to here.
        _record(batch, outcome, final=False)
    return _record(batch, _outcome_from_history(batch), final=True)
