"""The worker runtime behind `manage.py run_worker`.

One process runs `concurrency` claim slots: threads that each claim a job,
run its handler, hand the outcome to the completer (`jobs.completer`, which
records it under the fence) and claim the next. Around them it:
- renews each running job's lease every ttl/3 (the heartbeat, `jobs.leases`);
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
  behind a pooler, a lock), again every 30 s while it waits, and once the
  grace period of a stop is over cuts the connection of any call still
  waiting (a session pooler would queue it for minutes); the worker refuses to run behind a
  transaction-mode pooler configured as direct (`jobs.pooling`);
- on SIGTERM/SIGINT stops claiming, gives running handlers `grace` seconds,
  then exits 0 leaving any still-running job to expire and be recovered; a
  second signal exits at once.

Safe to kill at any instant: every write is fenced, so a dead worker's job is
simply recovered when its lease expires. Safe to lose the database under: an
outcome whose write the connection broke is in doubt and sent again after
reconnecting (`jobs.completer`) — with a backoff bounded by the lease's
remaining time, so the resend comes before another worker may recover the
job (`db_retry_delay`).
"""

import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, close_old_connections, connection, connections

from . import chance, holders, metrics, notify, periodic, pooling
from .actions import JobContext, Wait, get_action
from .completer import Completer
from .errors import Conflict, Deferred, UnknownAction
from .leases import Heartbeat, Running
from .models import Job
from .retry import Failure
from .store import Store
from .validation import describe_exception as _describe

log = logging.getLogger("jobs.worker")


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
    """A fresh identity per start (`jobs.holders.worker_id`): a restarted
    process never inherits the fence of the one it replaces, and a later
    worker of this host can tell when this one is gone."""
    return holders.worker_id()


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
    # The deployment runs one process at a time under `worker_id` (`run_worker
    # --worker-id`): at start, the leases held under it are a previous
    # process's and are taken back at once (`jobs.holders`).
    stable_id: bool = False

    @property
    def heartbeat_interval(self) -> float:
        return max(0.05, self.lease_ttl / 3)


class Worker:
    """`concurrency` claim slots, each a thread that claims a job, runs its
    handler and hands its outcome to the completer, then claims the next — no
    hand-off between a claiming thread and a running one. The main thread
    renews the leases (the heartbeat), does the housekeeping, listens for
    NOTIFY and decides when to stop — all on one connection."""

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
        self._lock = threading.Lock()  # guards _running, stats and the completer's lease ends
        self._running: dict[int, Running] = {}  # slot number → what it runs
        self._last_maintenance = 0.0
        self._maintain_after = 0.0  # monotonic; housekeeping backs off until then after a failure
        # Database calls under way, by thread: (since, what, the thread's
        # connection wrapper) — the watchdog's view.
        self._db_calls: dict[str, tuple[float, str, object]] = {}
        self._finished = threading.Event()  # run() is over: the watchdog ends
        # Why the worker must stop because of its configuration (`jobs.pooling`).
        self._misconfigured: str | None = None
        self._last_periodic: dict[str, float] = {}
        self._signals = 0
        self._counters: dict = {}  # outcome → its Prometheus counter child
        self._durations: dict = {}  # action → its handler-duration histogram child (as `_counters`)
        self.completer = Completer(config, self.store, lock=self._lock, running=self._running,
                                   stopping=self._stopping, backoff=self._db_backoff, count=self._count,
                                   event=self._event)
        self.heartbeat = Heartbeat(config, self.store, lock=self._lock, running=self._running,
                                   leased=self.completer.leased, lost=self.completer.lost, event=self._event,
                                   db_call=self._db_call)
        # Every job's outcome passes through these: bound once, not looked
        # up through the completer per job.
        self._record, self._finish, self._lost = self.completer.record, self.completer.finish, self.completer.lost

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
            self._finished.set()
            watchdog.join(timeout=5)
            connections.close_all()
            return 2
        self._take_over_gone()
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
            self._finished.set()
            watchdog.join(timeout=5)
            self._event("worker.stop", **self._summary())
            connections.close_all()
        return 2 if self._misconfigured else 0

    def _take_over_gone(self) -> None:
        """Before any slot claims: take back at once the leases of the
        holders known to be gone (`jobs.holders`). If the database does not
        answer, their leases expire as any other's."""
        cfg = self.config
        try:
            with self._db_call("start-up takeover"):
                gone = holders.gone_holders(restarted=cfg.worker_id if cfg.stable_id else None)
                recovered = self.store.take_over(gone, actor=cfg.worker_id)
        except Exception as exc:  # noqa: BLE001 - the database is away: the leases expire instead
            self._event("worker.db_error", level=logging.WARNING, error=_describe(exc))
            connections.close_all()
            return
        if recovered:
            self._event("worker.takeover", jobs=len(recovered), holders=", ".join(sorted(gone)))
        for job in recovered:
            self._recovered(job)

    def _recovered(self, recovered) -> None:
        """A lease taken back (expired, or its holder gone): counted and logged."""
        self._count("recovered")
        self._event("job.recovered", tenant=recovered.tenant, key=recovered.key, to_state=recovered.to_state,
                    reason=recovered.reason)

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
            self.heartbeat.renew_due()
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
            timeout = min(timeout, max(0.0, self.heartbeat.next_renewal - now))
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
            first = self.completer.first_report(running.ctx.job)
            running.ctx.cancelled.set()
            if first:
                self._event("job.abandoned", job=running.ctx.job, reason="grace period over")

    # ------------------------------------------------------------ a claim slot

    def _slot(self, number: int) -> None:
        cfg = self.config
        failures = 0
        self.completer.open_slot()
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
                    self._db_backoff(exc, failures, lease_left=self.completer.doubt_lease_left())
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
                    # Unreachable by design (_execute and the completer classify
                    # everything); if it happens, the lease expires and
                    # recovery gives the job its outcome.
                    self._count("slot_errors")
                    self._event("job.slot_error", level=logging.ERROR, job=job, error=_describe(exc))
        finally:
            # Stopping: the successes not yet written are written alone.
            try:
                self.completer.flush(number, final=True)
            finally:
                watched.__exit__(None, None, None)
                # A connection may only be closed by the thread that opened it.
                connections.close_all()

    def _finish_and_claim(self, number: int) -> list[Job]:
        """Write the slot's pending successes and claim the next work — one
        statement on PostgreSQL, so a job costs one round trip and one
        commit. A connection that breaks leaves the successes in doubt: they
        are sent again with the next claim, once reconnected (`in_doubt`);
        any other refusal writes them on their own first, so each still gets
        its outcome."""
        cfg, completer = self.config, self.completer
        pending = completer.take()
        asked = time.monotonic()  # before the database grants any lease
        try:
            jobs, lost = self.store.finish_and_claim(cfg.worker_id, pending, limit=cfg.batch, tenants=cfg.tenants,
                                                     actions=cfg.actions, ttl=cfg.lease_ttl)
        except (OperationalError, InterfaceError) as exc:
            completer.in_doubt(pending, exc)
            raise
        except Exception:
            completer.flush(number, pending)
            raise
        completer.leased(jobs, asked)
        completer.written(number, pending, lost)
        return jobs

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

    def _run_job(self, number: int, job: Job, ctx: JobContext | None = None) -> bool:
        """Run `job`'s handler and hand its outcome to the completer. True
        when it succeeded and its success waits in the slot's batch."""
        cfg = self.config
        try:
            spec = get_action(job.action)
        except UnknownAction as exc:
            reason = str(exc)
            self._record(job, lambda: self.store.fail(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                      error=reason, failure=Failure.ATTENTION), "attention")
            return False
        ctx = ctx or JobContext(job=job, worker_id=cfg.worker_id, store=self.store)
        now = time.monotonic()
        with self._lock:
            self._running[number] = Running(ctx, now, now + spec.timeout if spec.timeout else None)
        try:
            return self._execute(spec, ctx)
        finally:
            with self._lock:
                self._running.pop(number, None)

    def _execute(self, spec, ctx: JobContext) -> bool:
        job, cfg = ctx.job, self.config
        observe = _child(self._durations, metrics.HANDLER_DURATION, spec.name).observe
        started = time.perf_counter()
        try:
            try:
                outcome = spec.handler(ctx)
            finally:
                # Observed whether the handler returns or raises; directly,
                # not through `Histogram.time()`, whose context manager costs
                # more than the observation itself, per job.
                observe(time.perf_counter() - started)
        except Conflict as exc:
            self._lost(job, _describe(exc))
            return False
        except Deferred as exc:
            # Not a failure: held back (a limit, a pause); the attempt is handed back.
            deferred = exc
            self._record(job, lambda: self.store.defer(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                       deferred), "waiting")
            return False
        except BaseException as exc:  # noqa: BLE001 - the retry policy classifies every failure
            # BaseException too: a handler calling sys.exit() must not end its slot thread.
            if ctx.cancelled.is_set():
                self._lost(job, f"handler failed after losing its lease: {_describe(exc)}")
                return False
            failure = exc  # the name `exc` is unbound when the except block ends
            self._record(job, lambda: self.store.fail_with(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                           failure), "failed", failure=failure)
            return False
        if ctx.cancelled.is_set():
            self._lost(job, "the lease was lost while the handler ran; its result is discarded")
            return False
        if isinstance(outcome, Wait):
            self._record(job, lambda: self.store.wait(job.tenant, job.key, cfg.worker_id, job.lease_epoch,
                                                      state=outcome.state, reason=outcome.reason,
                                                      wake_at=outcome.wake_at, provider=outcome.provider),
                         "waiting")
            return False
        return self._finish(job, outcome)

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
                    self.completer.release(jobs[i:], "the worker stopped before the job started")
                    break
                self._event("job.claim", level=logging.DEBUG, job=job)
                key = (number, i)
                waited = held[key]
                with self._lock:
                    self._running.pop(key, None)  # _run_job registers it as running
                if waited.ctx.cancelled.is_set():
                    continue  # its lease was lost while it waited (the heartbeat logged it)
                # The context the heartbeat renewed while the job waited.
                if self._run_job(number, job, waited.ctx):
                    with self._lock:
                        self._running[key] = waited  # renewed until written
                    oldest = oldest or time.monotonic()
                if oldest and time.monotonic() - oldest > flush_after:
                    self.completer.flush(number)
                    oldest = None if not self.completer.held() else time.monotonic()
        except BaseException:
            self.completer.flush(number, final=True)
            raise
        finally:
            # The successes left pending are written by the next claim, an
            # instant from now (or by the completer's flush when the slot stops).
            with self._lock:
                for key in held:
                    self._running.pop(key, None)

    # ------------------------------------------------------------ waiting for the database

    @contextmanager
    def _db_call(self, what: str):
        """Mark a database call of this thread for the watchdog."""
        name = threading.current_thread().name
        outer = self._db_calls.get(name)  # a renewal inside the housekeeping
        self._db_calls[name] = (time.monotonic(), what, connections[DEFAULT_DB_ALIAS])
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
        max_connections) or held by a lock says so instead of hanging silently.
        Once a stop's grace period is over, the connection of every call
        still waiting (longer than `db_wait_warning`) is cut (`_cut`): the
        call fails at once and the
        worker exits, where a pooler would keep it queued for minutes
        (PgBouncer's query_wait_timeout; it ignores a cancel request for a
        query it has not handed to a server)."""
        limit = self.config.db_wait_warning
        warned: dict[tuple[str, float], float] = {}  # (thread, since) → when last logged
        stop_seen = None  # monotonic; when the watchdog first saw the stop
        while not self._finished.wait(min(1.0, limit / 2)):
            now = time.monotonic()
            calls = dict(self._db_calls)
            if self._stopping.is_set():
                stop_seen = stop_seen or now
                if now - stop_seen >= self.config.grace:
                    for name, (since, what, wrapper) in calls.items():
                        if now - since >= limit and _cut(wrapper):
                            self._event("worker.db_wait_cut", level=logging.WARNING, thread=name, call=what,
                                        waited=round(now - since, 1), reason="the grace period of the stop is over")
            for name, (since, what, _) in calls.items():
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
                self._recovered(recovered)
                moved += 1
            moved += self.store.wake_due(limit=cfg.maintenance_limit)
        for task in periodic.registered():
            self.heartbeat.renew_due()
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


def _cut(wrapper) -> bool:
    """Shut the socket of a thread's database connection from another
    thread: the call waiting on it fails at once (`OperationalError`).
    False when there is no socket to cut (not connected, SQLite)."""
    try:
        fd = wrapper.connection.fileno()
    except (AttributeError, DatabaseError, ValueError, TypeError):
        return False
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    return True
