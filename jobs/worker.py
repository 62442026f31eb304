"""The worker runtime behind `manage.py run_worker`.

One process claims jobs and runs their handlers on a pool of threads. Around
that it:
- renews each running job's lease every ttl/3 — only while the handler is
  alive and within its action's timeout; a renewal that hits `Conflict` sets
  the handler's cancellation flag, and nothing that handler returns is written;
- sweeps expired leases (`recover_expired`), wakes due waits and runs the
  registered periodic tasks (timers, outbox relay) on a bounded budget;
- sleeps when idle until a PostgreSQL NOTIFY, a finished job or the poll
  interval (with jitter) wakes it — polling is the fallback, never the only way;
- on SIGTERM/SIGINT stops claiming, gives running handlers `grace` seconds,
  then exits 0 leaving any still-running job to expire and be recovered; a
  second signal exits at once.

Safe to kill at any instant: every write is fenced, so a dead worker's job is
simply recovered when its lease expires.
"""

import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import DatabaseError, close_old_connections, connection, connections

from . import notify
from .actions import JobContext, Wait, get_action
from .errors import Conflict, UnknownAction

from .models import Job
from .retry import Failure
from .states import State
from .store import Store

log = logging.getLogger("jobs.worker")


def default_worker_id() -> str:
    """A fresh identity per start (host, pid, random): a restarted process
    never inherits the fence of the one it replaces."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- periodic tasks


@dataclass(frozen=True)
class PeriodicTask:
    name: str
    run: Callable[..., int]  # run(worker_id=..., limit=...) -> how many items it handled
    every: float  # seconds between runs in one worker


_periodic: dict[str, PeriodicTask] = {}


def periodic_task(name: str, *, every: float):
    """Register a bounded maintenance step the worker loop runs every `every`
    seconds (timers firing, outbox relay …). It must do at most `limit` items
    per call and use SKIP LOCKED so several workers can run it at once."""

    def register(fn):
        _periodic[name] = PeriodicTask(name, fn, every)
        return fn

    return register


# ---------------------------------------------------------------- configuration


@dataclass
class WorkerConfig:
    worker_id: str = field(default_factory=default_worker_id)
    concurrency: int = 1
    lease_ttl: float = 30.0
    tenants: list[str] | None = None
    actions: list[str] | None = None
    grace: float = 30.0
    until_idle: bool = False
    poll_interval: float = 2.0  # the longest idle sleep without a notification
    maintenance_limit: int = 100  # items per maintenance step per loop

    @property
    def heartbeat_interval(self) -> float:
        return max(0.05, self.lease_ttl / 3)


@dataclass
class Running:
    ctx: JobContext
    started: float  # monotonic
    deadline: float | None  # monotonic; past it the lease is no longer renewed


class Worker:
    def __init__(self, config: WorkerConfig, *, store: Store | None = None):
        self.config = config
        self.store = store or Store()
        self.stats: Counter = Counter()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        # Set by a NOTIFY: something became eligible or an outbox event
        # committed, so the periodic tasks run now instead of on schedule.
        self._notified = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[Future, Running] = {}
        self._last_maintenance = 0.0
        self._last_periodic: dict[str, float] = {}
        self._signals = 0

    # ------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Run until stopped (or, with `until_idle`, until nothing is eligible).
        Returns the process exit code."""
        cfg = self.config
        self._event("worker.start", concurrency=cfg.concurrency, lease_ttl=cfg.lease_ttl,
                    tenants=cfg.tenants or "all", actions=cfg.actions or "all", db=connection.vendor)
        pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="job")
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        heartbeat.start()
        listener = notify.Listener(self._wake, self._notified) if connection.vendor == "postgresql" else None
        if listener:
            listener.start()
        try:
            self._loop(pool)
        finally:
            self._drain(pool)
            if listener:
                listener.stop()
            self._stopping.set()
            heartbeat.join(timeout=5)
            self._event("worker.stop", **self._summary())
            connections.close_all()
        return 0

    def request_stop(self, reason: str = "requested") -> None:
        if not self._stopping.is_set():
            self._event("worker.stopping", reason=reason, running=len(self._running))
        self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        def on_signal(signum, frame):
            self._signals += 1
            if self._signals > 1:
                self._event("worker.kill", signal=signal.Signals(signum).name)
                os._exit(128 + signum)
            self.request_stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _loop(self, pool: ThreadPoolExecutor) -> None:
        cfg = self.config
        db_failures = 0
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                close_old_connections()
                claimed = self._claim_into(pool)
                notified = self._notified.is_set()
                self._notified.clear()
                progressed = self._maintain(periodic_now=notified)
                if cfg.until_idle and not claimed and not progressed and not self._running:
                    # About to stop: run every maintenance step now rather
                    # than on its schedule — a recovered lease, a due wait or
                    # a fired timer is new work.
                    progressed = self._maintain(force=True)
                db_failures = 0
            except DatabaseError as exc:
                # The database restarting must not kill the worker: back off and retry.
                db_failures += 1
                delay = min(30.0, 0.5 * 2**db_failures) * random.random()
                self._event("worker.db_error", level=logging.WARNING, error=str(exc)[:300], retry_in=round(delay, 2))
                connections.close_all()
                self._stopping.wait(delay)
                continue
            if claimed:
                continue
            if cfg.until_idle and not self._running and not progressed:
                self._event("worker.idle")
                return
            # Full jitter on the poll keeps a fleet of idle workers from
            # polling in lock-step; NOTIFY or a finished job wakes us sooner.
            self._wake.wait(cfg.poll_interval * (0.5 + random.random() / 2))

    def _claim_into(self, pool: ThreadPoolExecutor) -> int:
        cfg = self.config
        claimed = 0
        while not self._stopping.is_set() and len(self._running) < cfg.concurrency:
            job = self.store.claim_next(cfg.worker_id, tenants=cfg.tenants, actions=cfg.actions, ttl=cfg.lease_ttl)
            if job is None:
                break
            claimed += 1
            self.stats["claimed"] += 1
            self._event("job.claim", job=job)
            try:
                spec = get_action(job.action)
            except UnknownAction as exc:
                self._record(job, lambda: self.store.fail(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                          error=str(exc), failure=Failure.ATTENTION), "attention")
                continue
            ctx = JobContext(job=job, worker_id=cfg.worker_id, store=self.store)
            now = time.monotonic()
            running = Running(ctx, now, now + spec.timeout if spec.timeout else None)
            with self._lock:
                future = pool.submit(self._execute, spec, ctx)
                self._running[future] = running
            future.add_done_callback(self._on_done)
        return claimed

    def _on_done(self, future: Future) -> None:
        with self._lock:
            self._running.pop(future, None)
        self._wake.set()

    def _drain(self, pool: ThreadPoolExecutor) -> None:
        """Give running handlers the grace period, then leave the rest to expire."""
        deadline = time.monotonic() + self.config.grace
        while self._running and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._lock:
            left = list(self._running.values())
        for running in left:
            # Their leases are no longer renewed; recovery hands them to another worker.
            running.ctx.cancelled.set()
            self._event("job.abandoned", job=running.ctx.job, reason="grace period over")
        if not left:
            # Each pool thread holds its own database connection: have every
            # thread close its own (a connection may only be closed by the
            # thread that opened it).
            barrier = threading.Barrier(self.config.concurrency)

            def close_own_connections():
                try:
                    barrier.wait(timeout=2)
                except threading.BrokenBarrierError:
                    pass
                connections.close_all()

            for _ in range(self.config.concurrency):
                pool.submit(close_own_connections)
            pool.shutdown(wait=True)
        else:
            pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ running a job

    def _execute(self, spec, ctx: JobContext) -> None:
        job, cfg = ctx.job, self.config
        close_old_connections()
        try:
            outcome = spec.handler(ctx)
        except Conflict as exc:
            self._lost(job, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the retry policy classifies every failure
            if ctx.cancelled.is_set():
                self._lost(job, f"handler failed after losing its lease: {exc!r}")
                return
            self._record(job, lambda: self.store.fail_with(job.tenant, job.key, cfg.worker_id, job.lease_epoch, exc),
                         "failed")
            return
        if ctx.cancelled.is_set():
            self._lost(job, "the lease was lost while the handler ran; its result is discarded")
            return
        if isinstance(outcome, Wait):
            self._record(job, lambda: self.store.wait(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                      state=outcome.state, reason=outcome.reason,
                                                      wake_at=outcome.wake_at), "waiting")
        else:
            self._record(job, lambda: self.store.finish(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                        result=outcome), "done")

    def _record(self, job: Job, write, counter: str) -> None:
        """Apply the handler's outcome under the fence; a moved fence discards it."""
        try:
            decision = write()
        except Conflict as exc:
            self._lost(job, str(exc))
            return
        except DatabaseError as exc:
            # The outcome could not be recorded (database unreachable): the
            # lease expires and recovery runs the job again, so handlers must
            # be safe to repeat — external effects go through operations.
            self.stats["unrecorded"] += 1
            self._event("job.write_failed", level=logging.ERROR, job=job, error=str(exc)[:300])
            close_old_connections()
            return
        if counter == "failed" and decision is not None:
            counter = {State.READY: "retried", State.WAITING_REVIEW: "review"}.get(decision.target, "attention")
            self._event(f"job.{counter}", job=job, reason=decision.reason, delay=decision.delay)
        else:
            self._event(f"job.{counter}", job=job)
        self.stats[counter] += 1

    def _lost(self, job: Job, reason: str) -> None:
        self.stats["lost"] += 1
        self._event("job.fence_lost", level=logging.WARNING, job=job, reason=reason)

    # ------------------------------------------------------------ heartbeats

    def _heartbeat_loop(self) -> None:
        cfg = self.config
        while not self._stopping.wait(cfg.heartbeat_interval):
            with self._lock:
                running = [(f, r) for f, r in self._running.items() if not f.done()]
            for future, r in running:
                if r.ctx.cancelled.is_set():
                    continue
                if r.deadline is not None and time.monotonic() > r.deadline:
                    # Past its timeout the handler is presumed stuck: stop renewing
                    # so the lease expires and another worker recovers the job.
                    r.ctx.cancelled.set()
                    self._event("job.timeout", level=logging.WARNING, job=r.ctx.job)
                    continue
                try:
                    self.store.renew(r.ctx.tenant, r.ctx.key, cfg.worker_id, r.ctx.epoch, ttl=cfg.lease_ttl)
                except Conflict as exc:
                    r.ctx.cancelled.set()
                    self._lost(r.ctx.job, str(exc))
                except DatabaseError as exc:
                    self._event("job.renew_failed", level=logging.WARNING, job=r.ctx.job, error=str(exc)[:200])
                    close_old_connections()
        connections.close_all()

    # ------------------------------------------------------------ maintenance

    def _maintain(self, *, force: bool = False, periodic_now: bool = False) -> int:
        """Bounded housekeeping on its schedule (all of it now with `force`;
        the periodic tasks now with `periodic_now`, after a NOTIFY); returns
        how many items it moved, so `--until-idle` goes on while recovery or
        timers make work."""
        cfg = self.config
        now = time.monotonic()
        moved = 0
        if now - self._last_maintenance >= cfg.heartbeat_interval or force:
            self._last_maintenance = now
            for recovered in self.store.recover_expired(limit=cfg.maintenance_limit, actor=cfg.worker_id):
                self.stats["recovered"] += 1
                self._event("job.recovered", tenant=recovered.tenant, key=recovered.key,
                            to_state=recovered.to_state, reason=recovered.reason)
                moved += 1
            moved += self.store.wake_due(limit=cfg.maintenance_limit)
        for task in _periodic.values():
            if now - self._last_periodic.get(task.name, 0.0) >= task.every or force or periodic_now:
                self._last_periodic[task.name] = now
                try:
                    moved += task.run(worker_id=cfg.worker_id, limit=cfg.maintenance_limit) or 0
                except DatabaseError:
                    raise  # the loop backs off and reconnects
                except Exception as exc:  # noqa: BLE001 - one broken task must not stop the worker
                    self.stats["task_errors"] += 1
                    self._event("worker.task_failed", level=logging.ERROR, task=task.name, error=repr(exc)[:300])
        return moved

    # ------------------------------------------------------------ reporting

    def _summary(self) -> dict:
        s = self.stats
        return {k: s[k] for k in ("claimed", "done", "retried", "waiting", "review", "attention", "lost", "recovered")}

    def _event(self, event: str, *, level: int = logging.INFO, job: Job | None = None, **fields) -> None:
        record = {"event": event, "worker": self.config.worker_id}
        if job is not None:
            record.update(tenant=job.tenant, key=job.key, action=job.action, epoch=job.lease_epoch)
        record.update({k: v for k, v in fields.items() if v is not None})
        log.log(level, event, extra={"fields": record})
