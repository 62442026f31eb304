"""Writing one checked transition of a job and its history row.

`states.py` says which transitions exist; this module writes them: the job's
row changes under a condition on the state and epoch it was read with, and
its history row (a `JobEvent`) is appended in the same transaction. The
Store's claims, recovery and waits and the decisions of `jobs.interventions`
all write through here; a worker's fenced writes (`Store._fenced`) build
their single statement from the same pieces.

Every row appended here tells the hooks registered with `on_review_change`
when a job enters or leaves WAITING_REVIEW, in the transaction of the change."""

import json
import math
from datetime import datetime

from django.db import connection, transaction

from . import notify
from .clock import Clock, adapt
from .errors import Conflict, JobNotFound
from .models import Job, JobSearch
from .search import search_text_for
from .sql import fill, query
from .states import State, transition
from .validation import json_problem, storable_text

__all__ = ["on_review_change", "review_changed", "review_hooked", "job_locked", "job_found", "transition_write",
           "history_append", "decide_on", "detail_json", "db_value"]

_TRANSITION_WRITE = query("transition_write")
_HISTORY_APPEND = query("history_append")

# Told, in the transaction of the change, that a job entered or left
# WAITING_REVIEW: `hook(job_id=…, entered=…, clock=…)`. The review layer's
# deadlines register here, so every path into or out of review —
# a proposal, a handler's wait, a failure, a decision — plans or ends them.
_review_hooks: list = []


def on_review_change(hook) -> None:
    """Register `hook` (see `_review_hooks`); registering it twice is harmless."""
    if hook not in _review_hooks:
        _review_hooks.append(hook)


def review_hooked() -> bool:
    """Whether any hook listens for moves into and out of review."""
    return bool(_review_hooks)


def review_changed(job_id: int, from_state: str, to_state: str, clock: Clock) -> None:
    entered = to_state == State.WAITING_REVIEW
    if entered == (from_state == State.WAITING_REVIEW):
        return
    for hook in _review_hooks:
        hook(job_id=job_id, entered=entered, clock=clock)


def detail_json(value) -> str:
    """An event's detail as JSON text. Details are evidence, not data a
    caller reads back as typed values: what strict JSON cannot hold (NaN, a
    datetime, a NUL) is written as readable text instead of failing the write
    that records what happened."""
    value = value if value is not None else {}
    if json_problem(value) is None:
        return json.dumps(value, sort_keys=True)
    return json.dumps(_storable(value), sort_keys=True)


def _storable(value):
    """`value` with whatever strict JSON cannot hold turned into text."""
    if isinstance(value, dict):
        return {storable_text(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    if value is None or isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return storable_text(value if isinstance(value, str) else repr(value))


def db_value(value):
    """A column's new value as the database takes it."""
    if isinstance(value, datetime):
        return adapt(value)
    if isinstance(value, dict):
        return detail_json(value)
    if isinstance(value, str):
        return storable_text(value)
    return value


def job_found(job: Job | None, tenant: str, key: str) -> Job:
    """`job`, or `JobNotFound` for `tenant`/`key` when there is none."""
    if job is None:
        raise JobNotFound(f"no job {tenant}/{key}")
    return job


def job_locked(tenant: str, key: str) -> Job:
    """The job, row-locked for the rest of the transaction (SQLite: the
    immediate transaction already holds the database's write lock)."""
    try:
        return Job.objects.select_for_update().by_key(tenant, key).get()
    except Job.DoesNotExist:
        raise JobNotFound(f"no job {tenant}/{key}") from None


def transition_write(job: Job, name: str, target: str, clock: Clock, changes: dict, *, actor="", reason="",
                     detail=None, log=True) -> None:
    """Apply a checked transition to a row locked by the caller, and append
    its history row (unless `log` is false: a claim's row is written when
    its attempt ends). A transition out of LEASED ends the attempt: its row
    carries that attempt's worker, epoch and claim."""
    now_sql, now_params = clock.sql()
    sets, params = ["state = %s", f"updated_at = {now_sql}"], [str(target), *now_params]
    for column, value in changes.items():
        expr, values = value if isinstance(value, tuple) else ("%s", [db_value(value)])
        sets.append(f"{column} = {expr}")
        params += values
    with connection.cursor() as cursor:
        # (The state in WHERE: writes.sql, transition_write.)
        cursor.execute(fill(_TRANSITION_WRITE, sets=", ".join(sets)), [*params, job.id, job.state, job.lease_epoch])
        if cursor.rowcount != 1:
            raise Conflict(f"{job.tenant}/{job.key} changed while it was being updated")
    if not log:
        return
    # The row names the job's epoch and worker as they were: out of
    # LEASED, those of the attempt it ends (with its claim).
    ends_attempt = job.state == State.LEASED
    history_append(job.id, name, job.state, target, clock, epoch=job.lease_epoch, worker_id=job.worker_id,
                   actor=actor, reason=reason, detail=detail, claimed_at=job.claimed_at if ends_attempt else None)


def history_append(job_id, kind, from_state, to_state, clock: Clock, *, epoch=0, worker_id="", actor="", reason="",
                   detail=None, claimed_at=None) -> None:
    """Append the job's history row (a JobEvent) for one transition, in
    the caller's transaction."""
    now_sql, now_params = clock.sql()
    with connection.cursor() as cursor:
        cursor.execute(
            fill(_HISTORY_APPEND, now=now_sql),
            [job_id, kind, str(from_state), str(to_state), epoch, worker_id, storable_text(actor),
             storable_text(reason), detail_json(detail), *now_params, db_value(claimed_at)],
        )
    review_changed(job_id, from_state, to_state, clock)


def decide_on(*, tenant: str, key: str, name: str, target: str, reason: str, actor: str, detail: dict | None, now,
              extra: dict | None = None, finished: bool = False) -> Job:
    """Take the transition `name` to `target` on a job that no worker holds
    — a decision, a wait that ends — in one transaction (joining the
    caller's): the row locked, the move checked against the table, the row
    and its history written. Returns the job as it now is. Raises
    `JobNotFound`, `InvalidTransition` (nothing written)."""
    clock = Clock.of(now)
    with transaction.atomic():
        job = job_locked(tenant, key)
        transition(name, job.state, target)
        changes = {"wait_reason": "", "wake_at": None, **(extra or {})}
        if "payload" in changes:
            # A corrected payload is found by its new values too (and
            # still by the old ones, which its history shows).
            job.payload = changes["payload"]
            lines = dict.fromkeys([*job.search_text.split("\n"), *search_text_for(job).split("\n")])
            changes["search_text"] = "\n".join(line for line in lines if line)
            _search_row_rewrite(job, changes["search_text"])
        if finished:
            changes["finished_at"] = clock.plus(0)
        transition_write(job, name, target, clock, changes, actor=actor, reason=reason, detail=detail)
    if target == State.READY:
        notify.job_ready()
    return Job.objects.get(pk=job.pk)


def _search_row_rewrite(job: Job, search_text: str) -> None:
    """The job list's copy of a corrected job's text (jobs.search), in the
    correction's transaction; a job that had no row gets one."""
    if not JobSearch.objects.filter(job_id=job.pk).update(search_text=search_text):
        JobSearch.objects.create(job_id=job.pk, tenant=job.tenant, key=job.key, search_text=search_text)
