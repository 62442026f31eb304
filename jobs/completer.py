"""Recording a worker's outcomes, apart from the loop that claims and runs
the jobs (River keeps its `jobcompleter` beside its producer).

Every write is fenced by the job's `(id, lease_epoch, worker_id)`; a fence
that moved discards the outcome (the job is lost to this worker, not
recorded twice). A success waits in its slot's batch and is written by the
slot's next claim, in the same statement (`Store.finish_and_claim`), or by a
flush; a wait or a failure is written at once. An outcome the engine refuses
is recorded once as NEEDS_ATTENTION saying why, so the handler does not run
again. A write the connection broke is in doubt: sent again after
reconnecting, under the same fence, until the database settles it — and
given up once the job's lease has run out, when another worker may recover
the job (`db_retry_delay` bounds the backoff by the lease's remaining time).

Only the worker (`jobs.worker`) uses it.
"""

import logging
import threading
import time
from collections import OrderedDict

from django.db import InterfaceError, OperationalError, close_old_connections, connections

from .actions import get_action
from .errors import Conflict, JobNotFound, UnknownAction
from .models import Job
from .retry import Decision, Failure
from .states import State
from .validation import describe_exception as _describe
from .validation import json_problem

# The history event each outcome counter's write records (`_settle`); every
# other outcome is a `fail`.
_KINDS = {"done": "finish", "waiting": "wait"}


class Completer:
    """Records the outcomes of one worker's jobs. Each slot thread holds its
    own successes not yet written and its writes in doubt (`open_slot`).

    `lock` and `running` are the worker's (what its slots hold, renewed by
    its heartbeat): a success written is no longer renewed. `backoff` is the
    worker's wait after a database failure, `stopping` its stop flag,
    `count` and `event` its counters and log."""

    def __init__(self, config, store, *, lock: threading.Lock, running: dict, stopping: threading.Event,
                 backoff, count, event):
        self.config = config
        self.store = store
        self._lock = lock  # guards `running` and `_lease_ends`
        self._running = running
        self._stopping = stopping
        self._backoff = backoff
        self._count = count
        self._event = event
        # Per slot thread: successes not yet written (`pending`). The slot's
        # next claim writes them in the same statement
        # (`Store.finish_and_claim`). `doubt` holds, by job id, when to give
        # up on an outcome whose write broke with the connection: when its
        # lease runs out (`_doubt_over`).
        self._slot = threading.local()
        # Attempts whose end without an outcome was already reported, (job
        # id, epoch): the renewal and the slot may both find the same moved
        # fence (a renewal while the slot retries a write in doubt), and a
        # handler abandoned at shutdown returns to a cancelled context; one
        # attempt is reported once (lost, or abandoned).
        self._reported_attempts: OrderedDict[tuple[int, int], None] = OrderedDict()
        # job id → when its lease runs out at the latest, by this process's
        # monotonic clock: the moment before the claim (or the last renewal)
        # was asked for, plus the ttl — never later than the database's
        # `lease_until`. A write in doubt is sent again only until then.
        self._lease_ends: dict[int, float] = {}
        # Swept of leases long over when it grows past this (then twice what
        # the sweep kept: a sweep per as many claims as entries it reads).
        self._lease_ends_floor = 4 * (config.concurrency * config.batch + 1)
        self._lease_ends_sweep_at = self._lease_ends_floor

    # ------------------------------------------------------------ what it holds

    def open_slot(self) -> None:
        """The calling thread is a claim slot: it holds successes to write
        and writes in doubt from now on."""
        self._slot.pending, self._slot.doubt = [], {}

    def take(self) -> list:
        """The slot's successes not yet written, handed to the write that
        carries them (the next claim); the slot holds none after."""
        pending, self._slot.pending = self._slot.pending, []
        return pending

    def held(self) -> int:
        """How many successes the slot holds, not yet written."""
        return len(getattr(self._slot, "pending", None) or ())

    def doubt_lease_left(self) -> float | None:
        """The remaining lease of this slot's most urgent write in doubt
        (None: none is in doubt): what bounds the slot's backoff."""
        doubt = getattr(self._slot, "doubt", None)
        if not doubt:
            return None
        return min(doubt.values()) - time.monotonic()

    def leased(self, jobs: list[Job], asked: float) -> None:
        """Note when the leases just granted (or renewed) run out at the
        latest, and forget those long over. (A job's entry goes when its
        success is written; other outcomes' entries, with the sweep.)"""
        ends = asked + self.config.lease_ttl
        with self._lock:
            for job in jobs:
                self._lease_ends[job.id] = ends
            if len(self._lease_ends) > self._lease_ends_sweep_at:
                stale = asked - self.config.lease_ttl
                self._lease_ends = {job_id: end for job_id, end in self._lease_ends.items() if end > stale}
                self._lease_ends_sweep_at = max(self._lease_ends_floor, 2 * len(self._lease_ends))

    def _lease_end(self, job: Job) -> float | None:
        with self._lock:
            return self._lease_ends.get(job.id)

    # ------------------------------------------------------------ one outcome

    def finish(self, job: Job, outcome) -> bool:
        """Record success: later, by the slot's next claim (or `flush`),
        together with any other successes of its batch — True then."""
        pending = getattr(self._slot, "pending", None)
        if pending is not None and json_problem(outcome) is None:
            pending.append((job, outcome))
            return True
        # Alone (or refused alone: a result that is not strict JSON is
        # recorded once for an operator by `record`, not in the batch).
        self.record(job, lambda: self.store.finish(job.tenant, job.key, self.config.worker_id, job.lease_epoch,
                                                   result=outcome), "done")
        return False

    def record(self, job: Job, write, counter: str, *, failure: BaseException | None = None) -> None:
        """Apply the handler's outcome under the fence; a moved fence discards it.

        An outcome the engine refuses (a result that is not strict JSON, a
        `Wait` into a state a handler may not choose, a `wake_at` that is not
        a time …) is not left to the lease expiring — that would run the
        handler again — but recorded once as NEEDS_ATTENTION saying why. A
        write the connection broke is in doubt (`_settle`). `failure` is what
        the handler raised, for the action's `on_recorded`."""
        try:
            decision = self._settle(job, write, _KINDS.get(counter, "fail"))
        except (Conflict, JobNotFound) as exc:
            self.lost(job, _describe(exc))
            return
        except (OperationalError, InterfaceError) as exc:
            self._unrecorded(job, exc)
            return
        except Exception as exc:  # noqa: BLE001 - whatever the outcome was, the job gets a defined one
            self._record_refused(job, exc)
            return
        if counter == "failed" and decision is not None:
            counter = {State.READY: "retried", State.WAITING_REVIEW: "review"}.get(decision.target, "attention")
            self._event(f"job.{counter}", job=job, reason=decision.reason, delay=decision.delay)
        else:
            self._event(f"job.{counter}", job=job)
        self._count(counter)
        self._recorded(job, failure)

    def _recorded(self, job: Job, failure: BaseException | None) -> None:
        """An outcome of `job` is committed: tell its action (`on_recorded`).
        Called while `failure`, if any, is still being handled."""
        try:
            listener = get_action(job.action).on_recorded
        except UnknownAction:
            return
        if listener is None:
            return
        try:
            listener(job, failure)
        except Exception as exc:  # noqa: BLE001 - the outcome is recorded; a listener cannot change it
            self._event("job.listener_failed", level=logging.WARNING, job=job, error=_describe(exc))

    def _settle(self, job: Job, write, kind: str):
        """Run the fenced `write` of one job's outcome (its history event is
        `kind`) and return what it returns. When the connection breaks, the
        worker cannot know whether the write committed: it backs off,
        reconnects and sends the same write again, until the database
        settles it — written now; or refused by the fence because the first
        try went in (its event names this worker and epoch: a `Decision`
        for the state it reached is returned); or refused because the fence
        moved (`Conflict`). Given up, raising the connection's error, a
        lease's length after the first failure or when the worker stops."""
        doubt, failures = self._slot.doubt, 0
        try:
            while True:
                try:
                    return write()
                except (Conflict, JobNotFound):
                    if job.id in doubt:
                        recorded = self.store.recorded_by(self.config.worker_id, [job], kind)
                        if job.id in recorded:
                            return Decision(State(recorded[job.id]), "recorded by the write the connection broke")
                    raise
                except (OperationalError, InterfaceError) as exc:
                    if self._doubt_over(job) or self._stopping.is_set():
                        raise
                    failures += 1
                    self._event("job.write_in_doubt", level=logging.WARNING, job=job, error=_describe(exc))
                    self._backoff(exc, failures, lease_left=doubt[job.id] - time.monotonic())
        finally:
            doubt.pop(job.id, None)

    def _record_refused(self, job: Job, refusal: Exception) -> None:
        reason = (f"the handler's outcome could not be recorded and was discarded "
                  f"({_describe(refusal)}); an operator must decide what happens next")
        try:
            self._settle(job, lambda: self.store.fail(job.tenant, job.key, self.config.worker_id, job.lease_epoch,
                                                      error=reason, failure=Failure.ATTENTION), "fail")
        except (Conflict, JobNotFound) as exc:
            self.lost(job, _describe(exc))
            return
        except Exception as exc:  # noqa: BLE001 - nothing more can be written; recovery will take it back
            self._unrecorded(job, exc)
            return
        self._event("job.attention", level=logging.WARNING, job=job, reason=reason)
        self._count("attention")
        self._recorded(job, refusal)

    def _unrecorded(self, job: Job, exc: Exception) -> None:
        # The outcome could not be recorded (database unreachable): the
        # lease expires and recovery runs the job again, so handlers must
        # be safe to repeat — external effects go through fenced operation records.
        self._count("unrecorded")
        self._event("job.write_failed", level=logging.ERROR, job=job, error=_describe(exc))
        close_old_connections()

    # ------------------------------------------------------------ a batch's successes

    def flush(self, number: int, pending: list | None = None, *, final: bool = False) -> None:
        """Write slot `number`'s pending successes now, without claiming
        (`pending`: those a claim took and could not write). If the
        connection breaks they stay in doubt for the slot's next write —
        unless this is the slot's last write (`final`)."""
        if pending is None:
            pending, self._slot.pending = getattr(self._slot, "pending", None) or [], []
        if not pending:
            return
        try:
            lost = self.store.finish_many(self.config.worker_id, pending)
        except (OperationalError, InterfaceError) as exc:
            if final:  # the slot's last write
                self._unrecorded_many(pending, exc)
            else:
                self.in_doubt(pending, exc)
            connections.close_all()
            return
        except Exception as exc:  # noqa: BLE001 - one job's refusal must not cost the others their outcome
            # The batched write was refused as a whole: write each finish on
            # its own, so every job gets its own defined outcome.
            self._event("job.batch_write_refused", level=logging.WARNING, error=_describe(exc), jobs=len(pending))
            for job, outcome in pending:
                self.record(job, lambda job=job, outcome=outcome: self.store.finish(
                    job.tenant, job.key, self.config.worker_id, job.lease_epoch, result=outcome), "done")
        else:
            self.written(number, pending, lost)

    def written(self, number: int, pending: list, lost: list[Job]) -> None:
        """Report successes a statement wrote: `lost` are those whose fence
        had moved (nothing was written for them) — or, for a finish sent
        again after a broken connection, whose first write had gone in."""
        if not pending:
            return
        doubt = getattr(self._slot, "doubt", None)
        if doubt:
            again = [job for job in lost if job.id in doubt]
            if again:
                mine = self.store.recorded_by(self.config.worker_id, again, "finish")
                lost = [job for job in lost if job.id not in mine]
            for job, _ in pending:
                doubt.pop(job.id, None)
        lost_ids = {job.id for job in lost}
        batched = self.config.batch > 1
        for job, _ in pending:
            if job.id in lost_ids:
                self.lost(job, "the fence moved before the finish was written")
            else:
                # A batch logs each job at DEBUG and one line per write.
                self._event("job.done", level=logging.DEBUG if batched else logging.INFO, job=job)
                self._recorded(job, None)
        done = len(pending) - len(lost_ids)
        self._count("done", done)
        if batched:
            self._event("batch.done", jobs=done, lost=len(lost_ids) or None)
        written = {job.id for job, _ in pending}
        with self._lock:
            for job_id in written:
                self._lease_ends.pop(job_id, None)
            for key in [k for k, r in self._running.items()
                        if isinstance(k, tuple) and k[0] == number and r.ctx.job.id in written]:
                del self._running[key]

    def in_doubt(self, pending: list, exc: Exception) -> None:
        """The connection broke while `pending` successes were being written:
        the commit may or may not have happened. They are kept and sent
        again under the same fences by the slot's next write, so the
        database settles it — written then, or already written by the
        first try (`Store.recorded_by`), or lost if the fence moved. A
        success still unwritten a lease's length after its first failure
        is given up (`_doubt_over`)."""
        if not pending:
            return
        kept, given_up = [], []
        for job, outcome in pending:
            (given_up if self._doubt_over(job) else kept).append((job, outcome))
        self._slot.pending = kept + self._slot.pending
        if kept:
            self._event("job.write_in_doubt", level=logging.WARNING, error=_describe(exc), jobs=len(kept))
        self._unrecorded_many(given_up, exc)

    def _doubt_over(self, job: Job) -> bool:
        """A write of `job`'s outcome broke with the connection: whether to
        give up on it now — once its lease has run out (recovery may run the
        job again), at the latest a lease's length after the first failure."""
        doubt, now = self._slot.doubt, time.monotonic()
        if job.id not in doubt:
            # The lease as granted or renewed before the first failure; a
            # later renewal does not move it (a write that keeps failing
            # while renewals pass is given up all the same).
            doubt[job.id] = self._lease_end(job) or now + self.config.lease_ttl
        if now < doubt[job.id]:
            return False
        del doubt[job.id]
        return True

    def _unrecorded_many(self, pending: list, exc: Exception) -> None:
        # Not recorded: the leases expire and recovery runs the jobs again.
        if not pending:
            return
        self._count("unrecorded", len(pending))
        self._event("job.write_failed", level=logging.ERROR, error=_describe(exc), jobs=len(pending))

    def release(self, jobs: list[Job], reason: str) -> None:
        """Hand back jobs claimed but not started (the worker is stopping)."""
        for job in jobs:
            try:
                self.store.release(job.tenant, job.key, self.config.worker_id, job.lease_epoch, reason=reason)
                self._count("released")
            except Exception as exc:  # noqa: BLE001 - the job is left to expire and be recovered, whatever failed
                # Left to expire and be recovered, like any job of a stopped worker.
                self._event("job.release_failed", level=logging.WARNING, job=job, error=str(exc)[:200])

    # ------------------------------------------------------------ attempts without an outcome

    def first_report(self, job: Job) -> bool:
        """True the first time an attempt's end without an outcome is reported."""
        attempt = (job.pk, job.lease_epoch)
        with self._lock:
            if attempt in self._reported_attempts:
                return False
            self._reported_attempts[attempt] = None
            while len(self._reported_attempts) > 1000:  # bounded: only recent attempts are found twice
                self._reported_attempts.popitem(last=False)
        return True

    def lost(self, job: Job, reason: str) -> None:
        """The attempt's fence moved: nothing it returns is written."""
        if not self.first_report(job):
            return
        self._count("lost")
        self._event("job.fence_lost", level=logging.WARNING, job=job, reason=reason)
