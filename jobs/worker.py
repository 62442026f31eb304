"""The worker runtime behind `manage.py run_worker`.

One process runs `concurrency` claim slots: threads that each claim a job,
run its handler, record the outcome under the fence and claim the next.
Around them it:
- renews each running job's lease every ttl/3 — only while the handler is
  alive and within its action's timeout; a renewal that hits `Conflict` sets
  the handler's cancellation flag, and nothing that handler returns is
  written — unless the fence moved by the job's own outcome, which its slot
  wrote meanwhile (not a loss);
- sweeps expired leases (`recover_expired`), wakes due waits and runs the
  registered periodic tasks (timers, outbox relay) on a bounded budget;
- sleeps when idle until a PostgreSQL NOTIFY or the poll interval (with
  jitter) wakes it — polling is the fallback, never the only way;
- holds at most `concurrency` + 1 server connections (DESIGN §17): one per
  slot, and one for the main thread, which renews the leases, does the
  housekeeping and LISTENs on that same connection (behind a
  transaction-mode pooler the LISTEN has its own direct connection,
  `DATABASE_LISTEN_URL`, and the main thread's queries share the pooler's);
  a watchdog thread without a connection logs any database call that has
  waited longer than `db_wait_warning` seconds (no free server connection
  behind a pooler, a lock), and the worker refuses to run behind a
  transaction-mode pooler configured as direct (`jobs.pooling`);
- on SIGTERM/SIGINT stops claiming, gives running handlers `grace` seconds,
  then exits 0 leaving any still-running job to expire and be recovered; a
  second signal exits at once.

Safe to kill at any instant: every write is fenced, so a dead worker's job is
simply recovered when its lease expires. Safe to lose the database under: an
outcome whose write the connection broke is in doubt and sent again after
reconnecting, under the same fence, until the database settles it — with a
backoff bounded by the lease's remaining time, so the resend comes before
another worker may recover the job (`db_retry_delay`).
"""

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connection, connections

from . import chance, metrics, notify, periodic, pooling
from .actions import JobContext, Wait, get_action
from .errors import Conflict, Deferred, JobNotFound, UnknownAction
from .models import Job
from .retry import Decision, Failure
from .states import State
from .store import Store
from .validation import describe_exception as _describe
from .validation import json_problem

log = logging.getLogger("jobs.worker")

# The history event each outcome counter's write records (`_settle`); every
# other outcome is a `fail`.
_KINDS = {"done": "finish", "waiting": "wait"}
OUTCOME_KINDS = ("finish", "wait", "fail")


# The shortest pause between two tries of a write in doubt, however little
# of its lease is left (no spinning against a database that is still down).
RESEND_MIN_DELAY = 0.05


def db_retry_delay(failures: int, *, jitter: float, lease_left: float | None = None) -> float:
    """How long to wait after the database failed `failures` times in a row:
    exponential backoff with full jitter (`jitter` in [0, 1)), at most 30 s.

    While a write is in doubt, also at most half of its lease's remaining
    time `lease_left` (and at least `RESEND_MIN_DELAY`): a try that fails at
    t with the lease ending at D is followed by the next by (t + D) / 2, so
    once the database is back the outcome is sent again while the lease still
    holds — never after another worker may have recovered the job and run a
    finished handler again."""
    delay = min(30.0, 0.5 * 2 ** min(failures, 16)) * jitter
    if lease_left is not None:
        delay = min(delay, max(RESEND_MIN_DELAY, lease_left / 2))
    return delay


def _child(kept: dict, metric, label: str):
    """`metric.labels(label)`, kept in `kept`: `labels()` looks the child up
    under the metric's lock on every call, and a worker uses a handful of
    them (its outcomes, its actions) for every job."""
    child = kept.get(label)
    if child is None:
        child = kept[label] = metric.labels(label)
    return child


def default_worker_id() -> str:
    """A fresh identity per start (host, pid, random): a restarted process
    never inherits the fence of the one it replaces."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def name_connections(worker_id: str) -> None:
    """Name this process's PostgreSQL connections after the worker
    (`application_name`, as pg_stat_activity and a pooler show it), so an
    operator counts a worker's server connections. Before the first one
    opens: a process-wide setting, for `run_worker`."""
    if connections["default"].vendor != "postgresql":
        return
    connections.close_all()
    name = f"durable-worker {worker_id}".encode("ascii", "replace")[:63].decode("ascii")
    connections.settings["default"].setdefault("OPTIONS", {})["application_name"] = name


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
    batch: int = 1  # jobs a slot claims at once (`--batch`)
    maintenance_limit: int = 100  # items per maintenance step per loop
    db_wait_warning: float = 5.0  # a database call waiting longer is logged (`worker.db_wait`)

    @property
    def heartbeat_interval(self) -> float:
        return max(0.05, self.lease_ttl / 3)


@dataclass
class Running:
    ctx: JobContext
    started: float  # monotonic
    deadline: float | None  # monotonic; past it the lease is no longer renewed


class Worker:
    """`concurrency` claim slots, each a thread that claims a job, runs its
    handler and records the outcome, then claims the next — no hand-off
    between a claiming thread and a running one. The main thread renews the
    leases, does the housekeeping, listens for NOTIFY and decides when to
    stop — all on one connection."""

    def __init__(self, config: WorkerConfig, *, store: Store | None = None):
        self.config = config
        self.store = store or Store()
        self.stats: Counter = Counter()
        self._stopping = threading.Event()
        # Wakes the main thread: a NOTIFY, a signal, a slot that went idle.
        self._wake = notify.Wakeup()
        # Set by a NOTIFY: something became eligible or an outbox event
        # committed, so the periodic tasks run now instead of on schedule.
        self._notified = threading.Event()
        # Idle slots sleep on this condition until `_offer_work` bumps the
        # generation (new work may exist) or their poll interval passes.
        self._work = threading.Condition()
        self._generation = 0
        # Idle slots by the generation they last claimed at: a slot offered
        # work it has not yet woken up to claim is idle only in name.
        self._idle_seen: Counter[int] = Counter()
        self._lock = threading.Lock()  # guards _running and stats
        self._running: dict[int, Running] = {}  # slot number → what it runs
        self._last_maintenance = 0.0
        self._next_renewal = 0.0  # monotonic; the main thread renews the leases then
        # Attempts whose end without an outcome was already reported, (job
        # id, epoch): the renewal and the slot may both find the same moved
        # fence (a renewal while the slot retries a write in doubt), and a
        # handler abandoned at shutdown returns to a cancelled context; one
        # attempt is reported once (lost, or abandoned).
        self._reported_attempts: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._maintain_after = 0.0  # monotonic; housekeeping backs off until then after a failure
        # Database calls under way, by thread: (since, what) — the watchdog's view.
        self._db_calls: dict[str, tuple[float, str]] = {}
        # Why the worker must stop because of its configuration (`jobs.pooling`).
        self._misconfigured: str | None = None
        self._last_periodic: dict[str, float] = {}
        self._signals = 0
        self._counters: dict = {}  # outcome → its Prometheus counter child
        self._durations: dict = {}  # action → its handler-duration histogram child (as `_counters`)
        # Per slot thread: successes not yet written (`pending`). The slot's
        # next claim writes them in the same statement
        # (`Store.finish_and_claim`). `doubt` holds, by job id, when to give
        # up on an outcome whose write broke with the connection: when its
        # lease runs out (`_doubt_over`).
        self._batch = threading.local()
        # job id → when its lease runs out at the latest, by this process's
        # monotonic clock: the moment before the claim (or the last renewal)
        # was asked for, plus the ttl — never later than the database's
        # `lease_until`. Guarded by `_lock`.
        self._lease_ends: dict[int, float] = {}
        # Swept of leases long over when it grows past this (then twice what
        # the sweep kept: a sweep per as many claims as entries it reads).
        self._lease_ends_floor = 4 * (config.concurrency * config.batch + 1)
        self._lease_ends_sweep_at = self._lease_ends_floor

    # ------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Run until stopped (or, with `until_idle`, until nothing is eligible).
        Returns the process exit code: 0, or 2 when the database configuration
        does not match the connection (`jobs.pooling`)."""
        cfg = self.config
        postgres = connection.vendor == "postgresql"
        self._event("worker.start", concurrency=cfg.concurrency, lease_ttl=cfg.lease_ttl,
                    tenants=cfg.tenants or "all", actions=cfg.actions or "all", db=connection.vendor,
                    pool_mode=notify.pool_mode() if postgres else None)
        watchdog = threading.Thread(target=self._watchdog_loop, name="db-watchdog", daemon=True)
        watchdog.start()
        try:
            if postgres and notify.pool_mode() == "direct":
                with self._db_call("start-up check"):
                    self._refuse(pooling.transaction_pooler_seen())
        except Exception as exc:  # noqa: BLE001 - the database is away: the loop backs off and retries
            self._event("worker.db_error", level=logging.WARNING, error=_describe(exc))
            connections.close_all()
        if self._misconfigured:
            self._stopping.set()
            watchdog.join(timeout=5)
            connections.close_all()
            return 2
        listener = notify.listener(self._on_notify)
        if postgres and listener is None:
            self._event("worker.polling_only", level=logging.WARNING, reason=notify.polling_only_reason(),
                        poll_interval=cfg.poll_interval)
        slots = [threading.Thread(target=self._slot, args=(n,), name=f"slot-{n}", daemon=True)
                 for n in range(cfg.concurrency)]
        for slot in slots:
            slot.start()
        try:
            with connection.execute_wrapper(self._watch_statement):
                self._loop(listener)
        finally:
            self._stopping.set()
            self._offer_work()
            self._drain(slots)
            if listener:
                listener.close()
            watchdog.join(timeout=5)
            self._event("worker.stop", **self._summary())
            connections.close_all()
        return 2 if self._misconfigured else 0

    def request_stop(self, reason: str = "requested") -> None:
        if not self._stopping.is_set():
            self._event("worker.stopping", reason=reason, running=len(self._running))
        self._stopping.set()
        self._offer_work()
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

    def _refuse(self, reason: str | None) -> None:
        """Stop the worker for good: its database configuration does not
        match the connection (`jobs.pooling`); exit code 2."""
        if reason is None or self._misconfigured:
            return
        self._misconfigured = reason
        self._event("worker.misconfigured", level=logging.ERROR, reason=reason)
        self.request_stop("misconfigured")

    def _watch_statement(self, execute, sql, params, many, context):
        """Every worker thread's statements pass here (an execute wrapper):
        a prepared statement moved by a transaction-mode pooler stops the
        worker at its first sight, whichever query met it."""
        try:
            return execute(sql, params, many, context)
        except DatabaseError as exc:
            self._refuse(pooling.prepared_statement_error(exc))
            raise

    def _on_notify(self) -> None:
        self._notified.set()
        self._offer_work()
        self._wake.set()

    def _offer_work(self) -> None:
        """Tell idle slots that work may be eligible now."""
        with self._work:
            self._generation += 1
            self._work.notify_all()

    def _count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.stats[counter] += n
        _child(self._counters, metrics.WORKER_JOBS, counter).inc(n)

    def _loop(self, listener: "notify.Listener | None" = None) -> None:
        """The main thread: lease renewals, housekeeping, the LISTEN, and with
        `until_idle` the decision to stop."""
        cfg = self.config
        db_failures = 0
        while not self._stopping.is_set():
            self._wake.clear()
            self._renew_due()
            if time.monotonic() >= self._maintain_after:
                try:
                    with self._db_call("housekeeping"):
                        close_old_connections()
                        notified = self._notified.is_set()
                        self._notified.clear()
                        moved = self._maintain(periodic_now=notified)
                        if cfg.until_idle and self._all_idle() and not moved:
                            # About to stop: run every maintenance step now rather
                            # than on its schedule — a recovered lease, a due wait or
                            # a fired timer is new work.
                            moved = self._maintain(force=True)
                            if not moved and self._all_idle():
                                self._event("worker.idle")
                                return
                    if moved:
                        self._offer_work()
                    db_failures = 0
                except Exception as exc:  # noqa: BLE001 - housekeeping failing must not stop the worker
                    db_failures += 1
                    # Backs off the housekeeping only: the leases are still renewed meanwhile.
                    self._maintain_after = time.monotonic() + self._db_backoff(exc, db_failures, sleep=False)
            if listener and not self._stopping.is_set():
                with self._db_call("LISTEN"):
                    if listener.ensure():
                        # Subscribed anew: what was sent meanwhile was missed.
                        self._event("worker.listening",
                                    via="DATABASE_LISTEN_URL" if listener.url else "the main connection")
                        self._on_notify()
            # Slots claim on their own; the main thread wakes for a NOTIFY,
            # a signal, an idle slot (until_idle), its next renewal or its
            # next housekeeping.
            now = time.monotonic()
            timeout = chance.jittered(min(cfg.poll_interval, cfg.heartbeat_interval))
            timeout = min(timeout, max(0.0, self._next_renewal - now))
            if self._maintain_after > now:
                timeout = min(timeout, self._maintain_after - now)
            self._wake.wait(timeout, listener)

    @property
    def _idle_slots(self) -> int:
        return sum(self._idle_seen.values())

    def _all_idle(self) -> bool:
        """Every slot sleeps, having found nothing since the last offer of
        work (`--until-idle` stops only then: a slot woken for a lease just
        recovered, a wait just ended, may not have claimed it yet)."""
        with self._work:
            current = all(generation == self._generation for generation in self._idle_seen)
            return self._idle_slots == self.config.concurrency and not self._running and current

    def _db_backoff(self, exc: Exception, failures: int, *, lease_left: float | None = None,
                    sleep: bool = True) -> float:
        """The database restarting (or any other failure of a claim or of
        housekeeping) must not kill the worker: back off, reconnect. With a
        write in doubt, `lease_left` (its lease's remaining time) bounds the
        wait (`db_retry_delay`). Returns the delay, waited out unless not
        `sleep` (the main thread goes on renewing leases meanwhile)."""
        delay = db_retry_delay(failures, jitter=chance.rng.random(), lease_left=lease_left)
        event = "worker.db_error" if isinstance(exc, DatabaseError) else "worker.error"
        self._event(event, level=logging.WARNING, error=_describe(exc), retry_in=round(delay, 2),
                    lease_left=None if lease_left is None else round(lease_left, 2))
        connections.close_all()
        if sleep:
            self._stopping.wait(delay)
        return delay

    def _drain(self, slots: list[threading.Thread]) -> None:
        """Give running handlers the grace period, then leave the rest to expire."""
        deadline = time.monotonic() + self.config.grace
        for slot in slots:
            # In short slices: a signal the kernel hands to another thread
            # runs its Python handler only when this (main) thread next runs
            # Python code, so one long join would make a second SIGTERM wait
            # out the whole grace period instead of exiting at once.
            while slot.is_alive() and (remaining := deadline - time.monotonic()) > 0:
                slot.join(timeout=min(0.1, remaining))
        with self._lock:
            left = list(self._running.values())
        for running in left:
            # Their leases are no longer renewed; recovery hands them to another worker.
            # Reported before it is cancelled: the handler, returning to a
            # cancelled context, then finds its end reported (not a lost lease).
            first = self._first_report(running.ctx.job)
            running.ctx.cancelled.set()
            if first:
                self._event("job.abandoned", job=running.ctx.job, reason="grace period over")

    # ------------------------------------------------------------ a claim slot

    def _slot(self, number: int) -> None:
        cfg = self.config
        failures = 0
        self._batch.pending, self._batch.doubt = [], {}
        watched = connection.execute_wrapper(self._watch_statement)
        watched.__enter__()
        aged_at = 0.0  # monotonic; when the connection's age was last checked
        try:
            while not self._stopping.is_set():
                with self._work:
                    seen = self._generation
                try:
                    with self._db_call("claim"):
                        if time.monotonic() >= aged_at:
                            # CONN_MAX_AGE, checked once a second, not per
                            # claim (a broken connection is closed by the
                            # back-off that follows its error).
                            close_old_connections()
                            aged_at = time.monotonic() + 1.0
                        jobs = self._finish_and_claim(number)
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - a slot outlives any one failure
                    failures += 1
                    self._db_backoff(exc, failures, lease_left=self._doubt_lease_left())
                    continue
                if not jobs:
                    self._sleep_until_work(seen)
                    continue
                if cfg.batch > 1:
                    self._run_batch(number, jobs)
                    continue
                job = jobs[0]
                self._count("claimed")
                self._event("job.claim", job=job)
                try:
                    self._run_job(number, job)
                except Exception as exc:  # noqa: BLE001 - the last line: the slot must keep claiming
                    # Unreachable by design (_execute and _record classify
                    # everything); if it happens, the lease expires and
                    # recovery gives the job its outcome.
                    self._count("slot_errors")
                    self._event("job.slot_error", level=logging.ERROR, job=job, error=_describe(exc))
        finally:
            # Stopping: the successes not yet written are written alone.
            try:
                self._flush(number, final=True)
            finally:
                watched.__exit__(None, None, None)
                # A connection may only be closed by the thread that opened it.
                connections.close_all()

    def _finish_and_claim(self, number: int) -> list[Job]:
        """Write the slot's pending successes and claim the next work — one
        statement on PostgreSQL, so a job costs one round trip and one
        commit. A connection that breaks leaves the successes in doubt: they
        are sent again with the next claim, once reconnected (`_in_doubt`);
        any other refusal writes them on their own first, so each still gets
        its outcome."""
        cfg = self.config
        pending, self._batch.pending = self._batch.pending, []
        asked = time.monotonic()  # before the database grants any lease
        try:
            jobs, lost = self.store.finish_and_claim(cfg.worker_id, pending, limit=cfg.batch, tenants=cfg.tenants,
                                                     actions=cfg.actions, ttl=cfg.lease_ttl)
        except (OperationalError, InterfaceError) as exc:
            self._in_doubt(pending, exc)
            raise
        except Exception:
            self._batch.pending = pending
            self._flush(number)
            raise
        self._leased(jobs, asked)
        self._written(number, pending, lost)
        return jobs

    def _leased(self, jobs: list[Job], asked: float) -> None:
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

    def _sleep_until_work(self, seen: int) -> None:
        """Idle until new work is offered (or the poll interval passes). The
        generation read before the claim means an offer made while this slot
        was claiming is not lost."""
        with self._work:
            self._idle_seen[seen] += 1
            if self._generation == seen and not self._stopping.is_set():
                self._wake.set()  # the main thread may decide the worker is idle
                # Full jitter on the poll keeps a fleet of idle workers from
                # polling in lock-step; NOTIFY wakes it sooner.
                self._work.wait(chance.jittered(self.config.poll_interval))
            self._idle_seen[seen] -= 1
            if not self._idle_seen[seen]:
                del self._idle_seen[seen]

    def _run_job(self, number: int, job: Job, ctx: JobContext | None = None) -> None:
        cfg = self.config
        try:
            spec = get_action(job.action)
        except UnknownAction as exc:
            reason = str(exc)
            self._record(job, lambda: self.store.fail(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                      error=reason, failure=Failure.ATTENTION), "attention")
            return
        ctx = ctx or JobContext(job=job, worker_id=cfg.worker_id, store=self.store)
        now = time.monotonic()
        with self._lock:
            self._running[number] = Running(ctx, now, now + spec.timeout if spec.timeout else None)
        try:
            self._execute(spec, ctx)
        finally:
            with self._lock:
                self._running.pop(number, None)

    def _execute(self, spec, ctx: JobContext) -> None:
        job, cfg = ctx.job, self.config
        observe = _child(self._durations, metrics.HANDLER_DURATION, spec.name).observe
        started = time.perf_counter()
        try:
            try:
                outcome = spec.handler(ctx)
            finally:
                # Observed whether the handler returns or raises; directly,
                # not through `Histogram.time()`, whose context manager cost
                # a batch worker twice the observation itself (per job).
                observe(time.perf_counter() - started)
        except Conflict as exc:
            self._lost(job, _describe(exc))
            return
        except Deferred as exc:
            # Not a failure: held back (a limit, a pause); the attempt is handed back.
            deferred = exc
            self._record(job, lambda: self.store.wait(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                      reason=deferred.reason, wake_at=deferred.wake_at,
                                                      hand_back_attempt=True), "waiting")
            return
        except BaseException as exc:  # noqa: BLE001 - the retry policy classifies every failure
            # BaseException too: a handler calling sys.exit() must not end its slot thread.
            if ctx.cancelled.is_set():
                self._lost(job, f"handler failed after losing its lease: {_describe(exc)}")
                return
            failure = exc  # the name `exc` is unbound when the except block ends
            self._record(job, lambda: self.store.fail_with(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                           failure), "failed", failure=failure)
            return
        if ctx.cancelled.is_set():
            self._lost(job, "the lease was lost while the handler ran; its result is discarded")
            return
        if isinstance(outcome, Wait):
            self._record(job, lambda: self.store.wait(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                      state=outcome.state, reason=outcome.reason,
                                                      wake_at=outcome.wake_at, provider=outcome.provider),
                         "waiting")
        else:
            self._finish(job, outcome)

    def _finish(self, job: Job, outcome) -> None:
        """Record success: later, by the slot's next claim (or `_flush`),
        together with any other successes of its batch."""
        pending = getattr(self._batch, "pending", None)
        if pending is not None and json_problem(outcome) is None:
            pending.append((job, outcome))
            return
        # Alone (or refused alone: a result that is not strict JSON is
        # recorded once for an operator by `_record`, not in the batch).
        self._record(job, lambda: self.store.finish(job.tenant, job.key, self.config.worker_id, job.lease_epoch,
                                                    result=outcome), "done")

    # ------------------------------------------------------------ a batch (--batch N)

    def _run_batch(self, number: int, jobs: list[Job]) -> None:
        """Run a claimed batch one job after the other. Every job keeps its
        own fence: the ones waiting their turn, and the finished ones not yet
        written, stay in `_running` so the heartbeat renews their leases.
        Successes are written together (`finish_many`) at the end, or sooner
        when the oldest has waited a third of the renewal interval; failures
        and waits are written at once, as in a single claim. On shutdown the
        jobs not yet started are handed back (`release`); a crash leaves each
        job's lease to expire and be recovered on its own."""
        cfg = self.config
        flush_after = cfg.heartbeat_interval / 3
        now = time.monotonic()
        held = {(number, i): Running(JobContext(job=job, worker_id=cfg.worker_id, store=self.store), now, None)
                for i, job in enumerate(jobs)}
        with self._lock:
            self._running.update(held)
        self._count("claimed", len(jobs))
        self._event("batch.claim", jobs=len(jobs), tenants=len({job.tenant for job in jobs}))
        oldest = None
        try:
            for i, job in enumerate(jobs):
                if self._stopping.is_set():
                    self._release(jobs[i:], "the worker stopped before the job started")
                    break
                self._event("job.claim", level=logging.DEBUG, job=job)
                key = (number, i)
                waited = held[key]
                with self._lock:
                    self._running.pop(key, None)  # _run_job registers it as running
                if waited.ctx.cancelled.is_set():
                    continue  # its lease was lost while it waited (the heartbeat logged it)
                before = len(self._batch.pending)
                # The context the heartbeat renewed while the job waited.
                self._run_job(number, job, waited.ctx)
                if len(self._batch.pending) > before:
                    with self._lock:
                        self._running[key] = waited  # renewed until written
                    oldest = oldest or time.monotonic()
                if oldest and time.monotonic() - oldest > flush_after:
                    self._flush(number)
                    oldest = None if not self._batch.pending else time.monotonic()
        except BaseException:
            self._flush(number, final=True)
            raise
        finally:
            # The successes left pending are written by the next claim, an
            # instant from now (or by `_flush` when the slot stops).
            with self._lock:
                for key in held:
                    self._running.pop(key, None)

    def _flush(self, number: int, *, final: bool = False) -> None:
        """Write the slot's pending successes now, without claiming. If the
        connection breaks they stay in doubt for the slot's next write —
        unless this is the slot's last write (`final`)."""
        pending, self._batch.pending = getattr(self._batch, "pending", None) or [], []
        if not pending:
            return
        try:
            lost = self.store.finish_many(self.config.worker_id, pending)
        except (OperationalError, InterfaceError) as exc:
            if final:  # the slot's last write
                self._unrecorded_many(pending, exc)
            else:
                self._in_doubt(pending, exc)
            connections.close_all()
            return
        except Exception as exc:  # noqa: BLE001 - one job's refusal must not cost the others their outcome
            # The batched write was refused as a whole: write each finish on
            # its own, so every job gets its own defined outcome.
            self._event("job.batch_write_refused", level=logging.WARNING, error=_describe(exc), jobs=len(pending))
            for job, outcome in pending:
                self._record(job, lambda job=job, outcome=outcome: self.store.finish(
                    job.tenant, job.key, self.config.worker_id, job.lease_epoch, result=outcome), "done")
        else:
            self._written(number, pending, lost)

    def _written(self, number: int, pending: list, lost: list[Job]) -> None:
        """Report successes a statement wrote: `lost` are those whose fence
        had moved (nothing was written for them) — or, for a finish sent
        again after a broken connection, whose first write had gone in."""
        if not pending:
            return
        doubt = getattr(self._batch, "doubt", None)
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
                self._lost(job, "the fence moved before the finish was written")
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

    def _in_doubt(self, pending: list, exc: Exception) -> None:
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
        self._batch.pending = kept + self._batch.pending
        if kept:
            self._event("job.write_in_doubt", level=logging.WARNING, error=_describe(exc), jobs=len(kept))
        self._unrecorded_many(given_up, exc)

    def _doubt_over(self, job: Job) -> bool:
        """A write of `job`'s outcome broke with the connection: whether to
        give up on it now — once its lease has run out (recovery may run the
        job again), at the latest a lease's length after the first failure."""
        doubt, now = self._batch.doubt, time.monotonic()
        if job.id not in doubt:
            # The lease as granted or renewed before the first failure; a
            # later renewal does not move it (a write that keeps failing
            # while renewals pass is given up all the same).
            doubt[job.id] = self._lease_end(job) or now + self.config.lease_ttl
        if now < doubt[job.id]:
            return False
        del doubt[job.id]
        return True

    def _doubt_lease_left(self) -> float | None:
        """The remaining lease of this slot's most urgent write in doubt
        (None: none is in doubt): what bounds the slot's backoff."""
        doubt = getattr(self._batch, "doubt", None)
        if not doubt:
            return None
        return min(doubt.values()) - time.monotonic()

    def _unrecorded_many(self, pending: list, exc: Exception) -> None:
        # Not recorded: the leases expire and recovery runs the jobs again.
        if not pending:
            return
        self._count("unrecorded", len(pending))
        self._event("job.write_failed", level=logging.ERROR, error=_describe(exc), jobs=len(pending))

    def _release(self, jobs: list[Job], reason: str) -> None:
        for job in jobs:
            try:
                self.store.release(job.tenant, job.key, self.config.worker_id, job.lease_epoch, reason=reason)
                self._count("released")
            except Exception as exc:  # noqa: BLE001 - the job is left to expire and be recovered, whatever failed
                # Left to expire and be recovered, like any job of a stopped worker.
                self._event("job.release_failed", level=logging.WARNING, job=job, error=str(exc)[:200])

    def _record(self, job: Job, write, counter: str, *, failure: BaseException | None = None) -> None:
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
            self._lost(job, _describe(exc))
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
        doubt, failures = self._batch.doubt, 0
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
                    self._db_backoff(exc, failures, lease_left=doubt[job.id] - time.monotonic())
        finally:
            doubt.pop(job.id, None)

    def _record_refused(self, job: Job, refusal: Exception) -> None:
        reason = (f"the handler's outcome could not be recorded and was discarded "
                  f"({_describe(refusal)}); an operator must decide what happens next")
        try:
            self._settle(job, lambda: self.store.fail(job.tenant, job.key, self.config.worker_id, job.lease_epoch,
                                                      error=reason, failure=Failure.ATTENTION), "fail")
        except (Conflict, JobNotFound) as exc:
            self._lost(job, _describe(exc))
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

    def _first_report(self, job: Job) -> bool:
        """True the first time an attempt's end without an outcome is reported."""
        attempt = (job.pk, job.lease_epoch)
        with self._lock:
            if attempt in self._reported_attempts:
                return False
            self._reported_attempts[attempt] = None
            while len(self._reported_attempts) > 1000:  # bounded: only recent attempts are found twice
                self._reported_attempts.popitem(last=False)
        return True

    def _lost(self, job: Job, reason: str) -> None:
        if not self._first_report(job):
            return
        self._count("lost")
        self._event("job.fence_lost", level=logging.WARNING, job=job, reason=reason)

    # ------------------------------------------------------------ heartbeats

    def _renew_due(self) -> None:
        """Renew the running jobs' leases when due (every ttl/3), from the
        main thread, on its connection: called by its loop and between the
        housekeeping steps, so neither waits for the other for long."""
        cfg = self.config
        now = time.monotonic()
        if now < self._next_renewal:
            return
        self._next_renewal = now + cfg.heartbeat_interval
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

    # ------------------------------------------------------------ waiting for the database

    @contextmanager
    def _db_call(self, what: str):
        """Mark a database call of this thread for the watchdog."""
        name = threading.current_thread().name
        outer = self._db_calls.get(name)  # a renewal inside the housekeeping
        self._db_calls[name] = (time.monotonic(), what)
        try:
            yield
        finally:
            if outer is None:
                self._db_calls.pop(name, None)
            else:
                self._db_calls[name] = outer

    def _watchdog_loop(self) -> None:
        """Without a connection of its own: log every database call that has
        waited longer than `db_wait_warning` seconds, again every 30 s while
        it waits, and when it ends — a worker starved of server connections
        (a session-mode pooler's pool taken by other clients, the server's
        max_connections) or held by a lock says so instead of hanging silently."""
        limit = self.config.db_wait_warning
        warned: dict[tuple[str, float], float] = {}  # (thread, since) → when last logged
        while not self._stopping.wait(min(1.0, limit / 2)):
            now = time.monotonic()
            calls = dict(self._db_calls)
            for name, (since, what) in calls.items():
                last = warned.get((name, since))
                if now - since >= limit and (last is None or now - last >= 30.0):
                    warned[(name, since)] = now
                    self._event("worker.db_wait", level=logging.WARNING, thread=name, call=what,
                                waited=round(now - since, 1),
                                hint="no free server connection (a pooler's pool or max_connections taken) "
                                     "or a lock held")
            for key in [key for key in warned if calls.get(key[0], (None,))[0] != key[1]]:
                del warned[key]
                self._event("worker.db_wait_over", thread=key[0], waited=round(now - key[1], 1))

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

    # ------------------------------------------------------------ maintenance

    def _maintain(self, *, force: bool = False, periodic_now: bool = False) -> int:
        """Bounded housekeeping on its schedule (all of it now with `force`;
        the periodic tasks now with `periodic_now`, after a NOTIFY); returns
        how many items it moved, so `--until-idle` goes on while recovery or
        timers make work."""
        cfg = self.config
        now = time.monotonic()
        moved = 0
        pooling.prepare_nothing_here()
        if now - self._last_maintenance >= cfg.heartbeat_interval or force:
            self._last_maintenance = now
            for recovered in self.store.recover_expired(limit=cfg.maintenance_limit, actor=cfg.worker_id):
                self._count("recovered")
                self._event("job.recovered", tenant=recovered.tenant, key=recovered.key,
                            to_state=recovered.to_state, reason=recovered.reason)
                moved += 1
            moved += self.store.wake_due(limit=cfg.maintenance_limit)
        for task in periodic.registered():
            self._renew_due()
            if now - self._last_periodic.get(task.name, 0.0) >= task.every or force or periodic_now:
                self._last_periodic[task.name] = now
                try:
                    moved += task.run(worker_id=cfg.worker_id, limit=cfg.maintenance_limit) or 0
                except DatabaseError:
                    raise  # the loop backs off and reconnects
                except Exception as exc:  # noqa: BLE001 - one broken task must not stop the worker
                    self._count("task_errors")
                    self._event("worker.task_failed", level=logging.ERROR, task=task.name, error=_describe(exc))
        return moved

    # ------------------------------------------------------------ reporting

    def _summary(self) -> dict:
        s = self.stats
        return {k: s[k] for k in ("claimed", "done", "retried", "waiting", "review", "attention", "lost", "recovered")}

    def _event(self, event: str, *, level: int = logging.INFO, job: Job | None = None, **fields) -> None:
        # One line per transition, so this runs twice per job: nothing is
        # built when the level is off, and the record is made directly —
        # `log.log` would walk the stack for a caller no formatter prints.
        if not log.isEnabledFor(level):
            return
        record = {"event": event, "worker": self.config.worker_id}
        if job is not None:
            record.update(tenant=job.tenant, key=job.key, action=job.action, epoch=job.lease_epoch)
        for k, v in fields.items():
            if v is not None:
                record[k] = v
        log.handle(log.makeRecord(log.name, level, __file__, 0, event, (), None, extra={"fields": record}))

