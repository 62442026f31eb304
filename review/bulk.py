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
nothing, and each decided job's event names the batch.
"""

import secrets

from django.db import transaction
from django.db.models import Max, QuerySet
from django.http import Http404
from django.utils import timezone

from jobs.access import ATTENTION_QUEUE, REVIEW_QUEUE, DecisionRefused
from jobs.errors import JobError
from jobs.models import DecisionBatch, JobEvent

from . import decisions

__all__ = ["BULK_MAX", "BULK_DECISIONS", "batch_preview", "batch_take", "BatchRefused"]

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


def _claim(*, token: str, user, decision: str, note: str) -> DecisionBatch:
    with transaction.atomic(durable=True):
        batch = DecisionBatch.objects.select_for_update().filter(token=token or "-").first()
        # Another user's token is refused like an unknown one: the set, the
        # state it was seen in and the scope it was chosen in are theirs.
        if batch is None or batch.user_id != user.pk:
            raise BatchRefused("no such bulk preview; open the preview again")
        if batch.status != DecisionBatch.Status.PREVIEWED:
            raise BatchRefused(f"this preview was already used (batch {batch.pk}: {batch.decision} at "
                               f"{batch.taken_at:%Y-%m-%d %H:%M:%S %Z}); open the preview again")
        if decision not in BULK_DECISIONS[batch.queue]:
            raise BatchRefused(f"{decision!r} is not a bulk decision of this queue; choose "
                               f"{' or '.join(BULK_DECISIONS[batch.queue])}")
        batch.status, batch.decision, batch.note, batch.taken_at = (
            DecisionBatch.Status.DONE, decision, note, timezone.now())
        batch.save(update_fields=["status", "decision", "note", "taken_at"])
    return batch


def batch_take(*, token: str, user, decision: str, note: str) -> DecisionBatch:
    """Decide every item of the previewed batch `token` with `decision` and
    `note`, each through its single-decision service as `user`, conditional
    on the history row the preview recorded. Returns the batch with
    `decided`, `skipped` (moved since the preview), `refused` and the
    per-item `outcome`. Raises `BatchRefused` (nothing decided) for an
    unknown, used or foreign token, a decision the queue does not offer, or
    an empty or over-long note."""
    note = decisions.decision_text(note)
    batch = _claim(token=token, user=user, decision=decision, note=note)
    service = BULK_DECISIONS[batch.queue][decision]
    outcome: dict[str, str] = {}
    for job_id, seen_event in batch.items:
        try:
            service(job_id=job_id, user=user, note=note, seen_event=seen_event, batch=batch.pk)
        except decisions.AlreadyDecided as exc:
            outcome[str(job_id)] = f"moved: {exc}"
        except (DecisionRefused, JobError) as exc:
            outcome[str(job_id)] = f"refused: {exc}"
        except Http404:
            outcome[str(job_id)] = "refused: no such job in your tenants"
        else:
            outcome[str(job_id)] = "decided"
    batch.outcome = outcome
    batch.decided = sum(1 for o in outcome.values() if o == "decided")
    batch.skipped = sum(1 for o in outcome.values() if o.startswith("moved"))
    batch.refused = len(outcome) - batch.decided - batch.skipped
    batch.save(update_fields=["outcome", "decided", "skipped", "refused"])
    return batch
