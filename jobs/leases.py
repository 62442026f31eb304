"""The heartbeat: renewing the leases of the jobs a worker runs.

Every ttl/3, from the worker's main thread and on its connection, each
running job's lease is renewed — only while its handler is alive and within
its action's timeout. A renewal that hits `Conflict` sets the handler's
cancellation flag, and nothing that handler returns is written — unless the
fence moved by the job's own outcome, which its slot wrote meanwhile (not a
loss).

Only the worker (`jobs.worker`) uses it.
"""

import logging
import time
from dataclasses import dataclass

from django.db import close_old_connections

from .actions import JobContext
from .errors import Conflict, JobNotFound
from .validation import describe_exception as _describe

# The history events a job's own outcome writes: a renewal refused after one
# of them is no lost lease.
OUTCOME_KINDS = ("finish", "wait", "fail")


@dataclass
class Running:
    ctx: JobContext
    started: float  # monotonic
    deadline: float | None  # monotonic; past it the lease is no longer renewed


class Heartbeat:
    """Renews the leases of what a worker's slots run (`running`, under
    `lock`: the worker's). `leased` notes when the leases renewed run out,
    `lost` reports an attempt whose fence moved (the completer's); `db_call`
    marks the renewal for the worker's watchdog."""

    def __init__(self, config, store, *, lock, running: dict, leased, lost, event, db_call):
        self.config = config
        self.store = store
        self._lock = lock
        self._running = running
        self._leased = leased
        self._lost = lost
        self._event = event
        self._db_call = db_call
        self.next_renewal = 0.0  # monotonic; the leases are renewed then

    def renew_due(self) -> None:
        """Renew the running jobs' leases when due (every ttl/3), from the
        main thread, on its connection: called by its loop and between the
        housekeeping steps, so neither waits for the other for long."""
        cfg = self.config
        now = time.monotonic()
        if now < self.next_renewal:
            return
        self.next_renewal = now + cfg.heartbeat_interval
        with self._lock:
            running = list(self._running.values())
        due = [r for r in running if self._renewable(r)]
        if not due:
            return
        with self._db_call("lease renewal"):
            # All of them in one statement (a batch holds a hundred)...
            renewed: set[int] = set()
            asked = time.monotonic()
            try:
                renewed = self.store.renew_many(cfg.worker_id, [r.ctx.job for r in due], ttl=cfg.lease_ttl)
            except Exception as exc:  # noqa: BLE001 - each job is then renewed on its own, below
                self._event("worker.renew_failed", level=logging.WARNING, jobs=len(due), error=_describe(exc))
                close_old_connections()
            self._leased([r.ctx.job for r in due if r.ctx.job.id in renewed], asked)
            # ...and each one it did not renew on its own: `renew` says why
            # (its own outcome just written, taken over, gone) or renews it.
            for r in due:
                if r.ctx.job.id in renewed:
                    continue
                # One job's renewal failing, whatever the cause, must not
                # stop the renewal of the others (nor the main thread).
                try:
                    self._renew(r)
                except Exception as exc:  # noqa: BLE001 - see above
                    self._event("job.renew_failed", level=logging.WARNING, job=r.ctx.job, error=_describe(exc))
                    close_old_connections()

    def _renewable(self, r: Running) -> bool:
        """Whether the heartbeat renews this job's lease now."""
        if r.ctx.cancelled.is_set():
            return False
        if r.deadline is not None and time.monotonic() > r.deadline:
            # Past its timeout the handler is presumed stuck: stop renewing
            # so the lease expires and another worker recovers the job.
            r.ctx.cancelled.set()
            self._event("job.timeout", level=logging.WARNING, job=r.ctx.job)
            return False
        return True

    def _renew(self, r: Running) -> None:
        """Renew one lease; a fence that moved or a job gone cancels it."""
        cfg = self.config
        asked = time.monotonic()
        try:
            self.store.renew(r.ctx.tenant, r.ctx.key, cfg.worker_id, r.ctx.epoch, ttl=cfg.lease_ttl)
            self._leased([r.ctx.job], asked)
        except Conflict as exc:
            # This renewal's copy of the running jobs was taken before the
            # slot wrote the job's outcome: a fence that moved because of the
            # worker's own finish (or wait, or failure) is not a lost lease.
            if self.store.recorded_by(cfg.worker_id, [r.ctx.job], OUTCOME_KINDS):
                return
            # Taken over: the handler's result must not be written.
            r.ctx.cancelled.set()
            self._lost(r.ctx.job, _describe(exc))
        except JobNotFound as exc:
            # Gone (deleted by an operator): nothing it returns may be written.
            r.ctx.cancelled.set()
            self._lost(r.ctx.job, _describe(exc))
