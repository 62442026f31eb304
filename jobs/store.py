"""The Store: the engine's public API (DESIGN §4).

    from jobs.store import Store, Conflict

Every write a worker makes on a job (`renew`, `finish`, `wait`, `fail`,
`release`) is conditional on its fence — the job's identity `(tenant, key)`
plus the `lease_epoch` and `worker_id` it was claimed with, while it is LEASED
— and raises `Conflict` when the fence moved (another worker took the job
over, or recovery took it back). Every state change is checked against the
transition table in `states.py` and appends a `JobEvent` in the same
transaction; an illegal one raises `InvalidTransition` and writes nothing.

Times: `now=None` means the database server's clock; a number is seconds since
the epoch (tests); a datetime is taken as is. A job enqueued without `run_at`
is eligible at once, whatever clock a later call passes.
"""

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connection, transaction

from . import claim as claim_sql
from . import notify
from .actions import retry_policy
from .clock import Clock, adapt, to_datetime
from .errors import Conflict, Deferred, InvalidTransition, JobNotFound
from .fence import BY_KEY, fence_checked, fence_conflict
from .models import Job, JobEvent, JobSearch
from .retry import Decision, Failure, classify, decide
from .search import search_text_for, search_text_of_new
from .selectors import expired_leases, is_eligible, lease_expired, leases_held, waits_due
from .sql import fill, query
from .states import State, transition
from .transitions import (
    db_value,
    decide_on,
    detail_json,
    history_append,
    job_found,
    job_locked,
    review_changed,
    review_hooked,
    transition_write,
)
from .validation import CheckedJob, describe_exception, job_validate, storable_text, strict_json

__all__ = ["Store", "Conflict", "InvalidTransition", "JobNotFound", "JobSpec", "DEFAULT_TTL"]

DEFAULT_TTL = 30.0
# Jobs per statement of `enqueue_many` (on SQLite, 13 parameters each).
_ENQUEUE_CHUNK = 4000

# The statements of jobs/sql/writes.sql and enqueue.sql this module fills
# in; a single write's fence is by the job's key (jobs.fence).
_FENCE = BY_KEY
_FENCED_UPDATE = query("fenced_update")
_FENCED_UPDATE_LOGGED = query("fenced_update_logged")
_FENCED_CLAIM_TIME = fill(query("fenced_claim_time"), fence=_FENCE)
_HISTORY_APPEND = query("history_append")
_ENQUEUE_GIVEN_TABLE = query("enqueue_given_table")
_ENQUEUE_GIVEN_COPY = query("enqueue_given_copy")
_ENQUEUE_MANY = query("enqueue_many")
_ENQUEUE_TAKEN_SQLITE = query("enqueue_taken_sqlite")
_ENQUEUE_MANY_SQLITE = query("enqueue_many_sqlite")
# The new jobs' rows of each: the keys that got a search row, with their
# drawn ids (PostgreSQL); the given rows in order, ids from the table (SQLite).
_NEW_JOBS = fill(query("enqueue_new_jobs"), id="id", source="numbered WHERE id IN (SELECT job_id FROM searchable)")
_NEW_JOBS_SQLITE = fill(query("enqueue_new_jobs"), id="NULL", source="given ORDER BY n")
_ENQUEUE_EVENTS_SQLITE = query("enqueue_events_sqlite")
_ENQUEUE_SEARCH_SQLITE = query("enqueue_search_sqlite")
_ENQUEUE_JOB_ID = query("enqueue_job_id")


@dataclass
class JobSpec:
    """One job for `enqueue_many`."""

    tenant: str
    key: str
    action: str = "jobs.noop"
    payload: dict = field(default_factory=dict)
    priority: int = 0
    run_at: Any = None
    max_attempts: int | None = None
    subject_type: str = ""
    subject_id: str = ""
    subject_version: int | None = None


@dataclass(frozen=True)
class Recovered:
    tenant: str
    key: str
    to_state: str
    reason: str


def _is_postgres() -> bool:
    return connection.vendor == "postgresql"

# Leases renewed per statement by `Store.renew_many`.
RENEW_CHUNK = 1000


def _atomic_unless_postgres():
    """A transaction where one is needed: a single PostgreSQL statement is
    atomic on its own; SQLite's multi-statement writes need BEGIN IMMEDIATE."""
    return nullcontext() if _is_postgres() else transaction.atomic()


def _claim_clock(now) -> Clock:
    """A claim's time, read once the claim holds its lock. On SQLite the
    time is this host's clock, read when asked: read before BEGIN IMMEDIATE
    it would be older than the write the claim waited for (the approval that
    made the job READY), and the job's history would show the attempt
    starting before the decision that released it. (PostgreSQL's `now()`
    is the start of the claim's transaction, which begins after the
    decision's that it sees committed or waits for.)"""
    return Clock.of(now)


def _insert_with_search_row(job: Job) -> None:
    """Insert a new job and its search row (the job list's, written once: no
    state change writes it again), locking as `enqueue_many` does: on
    PostgreSQL the search row first (its unique index decides a race for the
    key; the loser waits holding nothing else), then the job, whose insert
    trigger locks the tenant's ready row (enqueue.sql). SQLite's write lock
    orders every writer already."""
    if _is_postgres():
        with connection.cursor() as cursor:
            cursor.execute(_ENQUEUE_JOB_ID)
            job.id = cursor.fetchone()[0]
        JobSearch.objects.create(job_id=job.id, tenant=job.tenant, key=job.key, search_text=job.search_text)
        job.save(force_insert=True)
        return
    job.save(force_insert=True)
    JobSearch.objects.create(job_id=job.id, tenant=job.tenant, key=job.key, search_text=job.search_text)


class Store:
    """Durable jobs: enqueue, claim, fenced writes, waits, recovery.

    Holds no state of its own; every method runs its own short transaction
    (or joins the caller's), so one Store may be shared between threads.
    """

    # ------------------------------------------------------------ enqueue

    def enqueue(self, tenant: str, key: str, **options) -> Job:
        """Create the obligation `(tenant, key)` once and return it — the job
        of `enqueue_once`, which takes the same arguments and says whether
        this call created it."""
        return self.enqueue_once(tenant, key, **options)[0]

    def enqueue_once(
        self,
        tenant: str,
        key: str,
        *,
        action: str = "jobs.noop",
        payload: dict | None = None,
        priority: int = 0,
        run_at=None,
        max_attempts: int | None = None,
        subject_type: str = "",
        subject_id: str = "",
        subject_version: int | None = None,
        actor: str = "",
        reason: str = "",
        detail: dict | None = None,
        review: str | None = None,
        now=None,
        key_free: bool = False,
    ) -> tuple[Job, bool]:
        """Create the obligation `(tenant, key)` once; return `(job, created)`.

        Idempotent: when the key exists, the existing job is returned
        unchanged and nothing is written, so a repeated trigger is harmless.
        Safe under concurrency: the unique constraint decides the race and the
        loser returns the winner's job. `created` is true only for the call
        whose insert made the job — not when the key existed, nor when
        another process created it between this call's read and its insert.
        Joins the caller's transaction when there is one (a business change
        and its job commit together).

        `actor`, `reason` and `detail` go into the creation event (who asked
        for this work and why: a proposal's rationale). With `review` the job
        is created in WAITING_REVIEW with `review` as its wait reason, so it
        cannot run before a reviewer resumes it. `key_free`: the caller has
        just read the key free in its transaction, so it is not read again
        (the unique constraint still decides a race).

        Raises `ValueError` naming the field for input the engine refuses
        (`validation.job_validate`: non-strict JSON or an oversized payload,
        an over-long tenant/key/action, `max_attempts` below 1 …); nothing is
        written then.
        """
        checked = job_validate(tenant=tenant, key=key, action=action, payload=payload, priority=priority,
                               run_at=run_at, max_attempts=max_attempts,
                               default_max_attempts=retry_policy(action).max_attempts, subject_type=subject_type,
                               subject_id=subject_id, subject_version=subject_version)
        existing = None if key_free else Job.objects.by_key(tenant, key).first()
        if existing is not None:
            return existing, False
        clock = Clock.of(now)
        state = State.WAITING_REVIEW if review is not None else State.READY
        try:
            with transaction.atomic():
                job = Job(
                    tenant=tenant,
                    key=key,
                    state=state,
                    wait_reason=(review or "")[:500],
                    action=action,
                    payload=checked.payload,
                    priority=priority,
                    next_attempt_at=checked.run_at,
                    max_attempts=checked.max_attempts,
                    subject_type=subject_type,
                    subject_id=str(subject_id or ""),
                    subject_version=subject_version,
                    proposed_by=actor[:200],
                )
                proposal = (detail or {}).get("proposal")
                rationale = (proposal.get("rationale") if isinstance(proposal, dict) else None) or reason
                job.search_text = search_text_for(job, proposed_by=actor, rationale=rationale)
                _insert_with_search_row(job)
                history_append(job.id, "enqueue", "", state, clock, actor=actor, reason=reason,
                          detail={**(detail or {}), "action": action})
                if state == State.READY:
                    notify.job_ready()
        except IntegrityError:
            # Another process created the same key between our read and insert.
            return Job.objects.by_key(tenant, key).get(), False
        return job, True

    def enqueue_many(self, specs, *, actor: str = "", now=None) -> int:
        """Insert many jobs, on PostgreSQL a COPY and one statement per 4,000
        (enqueue.sql); keys that exist are left alone (their search rows'
        unique index decides, by INSERT … ON CONFLICT DO NOTHING). Returns
        how many were created. Every spec is validated first, as `enqueue`
        validates one (`ValueError` naming the spec and the field); one bad
        spec writes nothing."""
        specs = list(specs)
        checked = []
        for index, s in enumerate(specs):
            try:
                checked.append((s, job_validate(
                    tenant=s.tenant, key=s.key, action=s.action, payload=s.payload, priority=s.priority,
                    run_at=s.run_at, max_attempts=s.max_attempts,
                    default_max_attempts=retry_policy(s.action).max_attempts, subject_type=s.subject_type,
                    subject_id=s.subject_id, subject_version=s.subject_version)))
            except ValueError as exc:
                raise ValueError(f"job {index} ({s.tenant!r:.70}/{s.key!r:.70}): {exc}") from None
        created = 0
        for start in range(0, len(specs), _ENQUEUE_CHUNK):
            created += self._enqueue_chunk(checked[start : start + _ENQUEUE_CHUNK], actor, Clock.of(now))
        if created:
            notify.job_ready()
        return created

    def _enqueue_chunk(self, specs: list[tuple[JobSpec, CheckedJob]], actor: str, clock: Clock) -> int:
        """The chunk's new keys become jobs, each with its search row (which
        holds the key's uniqueness, `jobsearch_unique_tenant_key`) and its
        creation event; a key that exists, or came earlier in the chunk, is
        left alone. Ids follow the chunk's order, so a tenant's jobs of equal
        priority are claimed in the order given."""
        if not specs:
            return 0
        now_sql, now_params = clock.sql()
        proposed_by = actor[:200]
        # Per spec, its values in the order the enqueue statements name them
        # (enqueue.sql).
        values = [(s.tenant, s.key, s.action, s.subject_type, str(s.subject_id or ""), s.subject_version,
                   c.payload_json, s.priority, adapt(c.run_at) if c.run_at is not None else None, c.max_attempts,
                   search_text_of_new(tenant=s.tenant, key=s.key, action=s.action, subject_type=s.subject_type,
                                      subject_id=str(s.subject_id or ""), payload=c.payload, proposed_by=actor))
                  for s, c in specs]
        with transaction.atomic(), connection.cursor() as cursor:
            if _is_postgres():
                # The chunk copied to this session's table, then one
                # statement (enqueue.sql) makes its jobs.
                cursor.execute(_ENQUEUE_GIVEN_TABLE)
                with cursor.cursor.copy(_ENQUEUE_GIVEN_COPY) as copy:
                    for n, row in enumerate(values):
                        copy.write_row((n, *row))
                cursor.execute(fill(_ENQUEUE_MANY, now=now_sql, new_jobs=_NEW_JOBS), [*now_params, proposed_by, actor])
                return cursor.rowcount
            # SQLite: the immediate transaction holds the database's write
            # lock, so the keys found absent here stay absent until it ends.
            # (A key given twice counts as taken after its first time.)
            taken = set()
            keys = [s.key for s, _ in specs]
            for start in range(0, len(keys), 500):
                some = keys[start : start + 500]
                cursor.execute(fill(_ENQUEUE_TAKEN_SQLITE, keys=", ".join(["%s"] * len(some))), some)
                taken.update(cursor.fetchall())
            fresh = []
            for n, (s, _) in enumerate(specs):
                if (s.tenant, s.key) not in taken:
                    taken.add((s.tenant, s.key))
                    fresh.append(n)
            if not fresh:
                return 0
            row = f"{', '.join(['%s'] * len(values[0]))}, {now_sql}, %s)"
            cursor.execute(
                fill(_ENQUEUE_MANY_SQLITE, rows=", ".join(f"({n}, {row}" for n in fresh), new_jobs=_NEW_JOBS_SQLITE),
                [value for n in fresh for value in (*values[n], *now_params, proposed_by)],
            )
            inserted = cursor.fetchall()
            cursor.executemany(_ENQUEUE_EVENTS_SQLITE, [(job_id, actor, created_at) for job_id, created_at, *_ in inserted])
            cursor.executemany(_ENQUEUE_SEARCH_SQLITE,
                               [(job_id, tenant, key, text) for job_id, _, tenant, key, text in inserted])
            return len(inserted)

    # ------------------------------------------------------------ claiming

    def claim(self, tenant: str, key: str, worker_id: str, *, now=None, ttl: float = DEFAULT_TTL) -> int | None:
        """Lease one named job; return the new `lease_epoch`, or None.

        A READY job that is due is leased; a LEASED job whose lease has
        expired is taken over (the epoch moves on, fencing out the silent
        holder). Anything else — leased and alive, waiting, finished — is not
        claimable and returns None.
        """
        with transaction.atomic():
            job = job_locked(tenant, key)
            at = _claim_clock(now).value()
            if is_eligible(job, at=at):
                name = "claim"
            elif lease_expired(job, at=at):
                name = "takeover"
            else:
                return None
            transition(name, job.state, State.LEASED)
            epoch = job.lease_epoch + 1
            # A claim writes no history row (the attempt's row is written
            # when it ends); a takeover writes the row that ends the silent
            # holder's attempt, with that attempt's worker, epoch and claim.
            transition_write(
                job,
                name,
                State.LEASED,
                Clock(at),
                changes={
                    "lease_epoch": epoch,
                    "worker_id": worker_id,
                    "lease_until": Clock(at).plus(ttl),
                    "attempts": job.attempts + 1,
                    "first_attempt_at": job.first_attempt_at or at,
                    "recoveries": job.recoveries + (name == "takeover"),
                    "wait_reason": "",
                },
                actor=worker_id,
                reason=f"lease of {job.worker_id} (epoch {job.lease_epoch}) expired; taken over by {worker_id} "
                       f"(epoch {epoch})",
                log=name == "takeover",
            )
            return epoch

    def claim_next(
        self,
        worker_id: str,
        *,
        tenants: list[str] | None = None,
        actions: list[str] | None = None,
        now=None,
        ttl: float = DEFAULT_TTL,
    ) -> Job | None:
        """Lease the next eligible job (see `claim.py` for order and locking)
        and return it, or None when nothing is eligible."""
        jobs = self.claim_batch(worker_id, limit=1, tenants=tenants, actions=actions, now=now, ttl=ttl)
        return jobs[0] if jobs else None

    def claim_batch(
        self,
        worker_id: str,
        *,
        limit: int,
        tenants: list[str] | None = None,
        actions: list[str] | None = None,
        now=None,
        ttl: float = DEFAULT_TTL,
    ) -> list[Job]:
        """Lease up to `limit` eligible jobs at once (one statement on
        PostgreSQL), fairly across tenants. Each job gets its own epoch, its
        own fence and its own `claimed_at`: it is finished, failed or
        recovered on its own, exactly as if it had been claimed alone, and
        the history row that ends its attempt records the claim."""
        # PostgreSQL: claim.py runs one statement (a short transaction with a
        # lease cap). SQLite: an immediate transaction around choose + lease.
        with _atomic_unless_postgres():
            return claim_sql.claim(worker=worker_id, clock=_claim_clock(now), ttl=ttl, tenants=tenants,
                                   actions=actions, limit=limit)

    # ------------------------------------------------------------ fenced writes

    def renew(self, tenant: str, key: str, worker_id: str, epoch: int, *, ttl: float = DEFAULT_TTL, now=None) -> None:
        """Extend the lease to now + ttl. Raises `Conflict` if the fence moved."""
        self._renew(tenant, key, worker_id, epoch, Clock.of(now), ttl)

    def _renew(self, tenant: str, key: str, worker_id: str, epoch: int, clock: Clock, ttl: float) -> None:
        self._fenced(
            "renew", tenant, key, worker_id, epoch, State.LEASED, clock, {"lease_until": clock.plus(ttl)}, log=False
        )

    def renew_many(self, worker_id: str, jobs: list[Job], *, ttl: float = DEFAULT_TTL, now=None) -> set[int]:
        """Extend the leases of `jobs` (as claimed) to now + ttl: a worker's
        heartbeat, one statement per RENEW_CHUNK jobs instead of a round
        trip each (a `--batch 100` worker holds a hundred) on PostgreSQL;
        on SQLite, which has no round trips, one transaction. Each is fenced
        exactly like `renew`: LEASED, by `worker_id`, under the epoch it was
        claimed with. Returns the ids renewed; a job missing there had lost
        its fence or is gone (`renew` says which)."""
        clock = Clock.of(now)
        renewed: set[int] = set()
        if not _is_postgres():
            with transaction.atomic():
                for job in jobs:
                    try:
                        self._renew(job.tenant, job.key, worker_id, job.lease_epoch, clock, ttl)
                    except (Conflict, JobNotFound):
                        continue
                    renewed.add(job.id)
            return renewed
        transition("renew", State.LEASED, State.LEASED)
        for start in range(0, len(jobs), RENEW_CHUNK):
            chunk = jobs[start:start + RENEW_CHUNK]
            renewed |= claim_sql.renew_pg(worker=worker_id, clock=clock, ttl=ttl, ids=[job.id for job in chunk],
                                          epochs=[job.lease_epoch for job in chunk])
        return renewed

    def finish(
        self, tenant: str, key: str, worker_id: str, epoch: int, *, result=None, now=None, reason: str = ""
    ) -> None:
        """Mark the job DONE. Raises `Conflict` if the fence moved, and
        `ValueError` (nothing written) when `result` is not strict JSON — NaN,
        a NUL character, an object JSON cannot hold: a result the database
        could not store must never leave the job to run again."""
        stored = strict_json(result, field="result") if result is not None else None
        clock = Clock.of(now)
        self._fenced(
            "finish",
            tenant,
            key,
            worker_id,
            epoch,
            State.DONE,
            clock,
            {"finished_at": clock.plus(0), "lease_until": None, "result": stored},
            reason=reason,
        )

    def finish_many(self, worker_id: str, done: list[tuple[Job, Any]], *, now=None) -> list[Job]:
        """Mark many jobs DONE at once (a batch worker's finishes): `done` is
        `(job as claimed, result)` pairs. Each write is fenced by its own
        job's epoch, exactly like `finish`; one statement on PostgreSQL.
        Returns the jobs whose fence had moved (nothing was written for
        them) — the others are DONE. Raises `ValueError` (nothing written)
        when any result is not strict JSON, as `finish` does."""
        if not done:
            return []
        clock = Clock.of(now)
        if not _is_postgres():
            # Each `finish` checks its result; one that is not strict JSON
            # rolls the whole transaction back.
            lost = []
            with transaction.atomic():
                for job, result in done:
                    try:
                        self.finish(job.tenant, job.key, worker_id, job.lease_epoch, result=result, now=clock.at)
                    except Conflict:
                        lost.append(job)
            return lost
        written = claim_sql.finish_pg(worker=worker_id, clock=clock, finish=_finishes(done))
        return [job for job, _ in done if job.id not in written]

    def recorded_by(self, worker_id: str, jobs: list[Job], kind: str | tuple[str, ...] = "finish") -> dict[int, str]:
        """Of `jobs` (as claimed), those whose outcome of `kind` (`finish`,
        `wait`, `fail`, or a tuple of them) `worker_id` itself recorded under
        the epoch it claimed them with, and the state each went to: the
        write is in their history. How a worker whose connection broke
        mid-write learns that the write went in after all, and a renewal
        that hit `Conflict` that the fence moved by the worker's own outcome
        (a lease's epoch is taken by one claim only, so no other writer can
        have recorded that outcome)."""
        epochs = {job.id: job.lease_epoch for job in jobs}
        kinds = (kind,) if isinstance(kind, str) else kind
        recorded = JobEvent.objects.filter(job_id__in=epochs, kind__in=kinds, worker_id=worker_id)
        return {job_id: to_state for job_id, epoch, to_state in recorded.values_list("job_id", "epoch", "to_state")
                if epochs[job_id] == epoch}

    def finish_and_claim(
        self,
        worker_id: str,
        done: list[tuple[Job, Any]],
        *,
        limit: int,
        tenants: list[str] | None = None,
        actions: list[str] | None = None,
        now=None,
        ttl: float = DEFAULT_TTL,
    ) -> tuple[list[Job], list[Job]]:
        """`finish_many(done)` then `claim_batch(limit)`, as a worker does
        between one piece of work and the next — on PostgreSQL in ONE
        statement: one round trip, one commit, both or neither (under a
        lease cap, the capped claim's second statement writes them, in its
        transaction). Returns (jobs claimed, jobs of `done` whose fence had
        moved). Raises `ValueError` (nothing written, nothing claimed) when
        a result is not strict JSON."""
        if not done:
            return self.claim_batch(worker_id, limit=limit, tenants=tenants, actions=actions, now=now, ttl=ttl), []
        if not claim_sql.pipelined():
            lost = self.finish_many(worker_id, done, now=now)
            return self.claim_batch(worker_id, limit=limit, tenants=tenants, actions=actions, now=now, ttl=ttl), lost
        finishes = _finishes(done)
        jobs, written = claim_sql.finish_and_claim(worker=worker_id, clock=Clock.of(now), ttl=ttl, finish=finishes,
                                                   tenants=tenants, actions=actions, limit=limit)
        return jobs, [job for job, _ in done if job.id not in written]

    def wait(
        self,
        tenant: str,
        key: str,
        worker_id: str,
        epoch: int,
        *,
        state: str = State.WAITING_EXTERNAL,
        reason: str,
        wake_at=None,
        provider: str = "",
        detail: dict | None = None,
        hand_back_attempt: bool = False,
        now=None,
    ) -> None:
        """Release the job into a persisted wait (no process sleeps on it).

        `state` is WAITING_EXTERNAL (a reply, a provider) or WAITING_REVIEW (a
        human). `wake_at`, when given, is when the wait ends by itself.
        `provider`, when given, is the only inbound provider whose event may
        end the wait (`jobs.inbound`). `hand_back_attempt` does not count the
        attempt the job was claimed for (a `Deferred` job did no work: a
        limit or a pause held it), so waiting on a limit many times never
        uses up its attempts or starts its recovery window.
        Raises `Conflict` if the fence moved, `InvalidTransition` for any
        other target state, `ValueError` for a `wake_at` that is not a time.
        """
        clock = Clock.of(now)
        wake = to_datetime(wake_at, field="wake_at")
        if not isinstance(provider, str) or len(provider) > 100:
            raise ValueError(f"provider must be a string of at most 100 characters, not {provider!r:.60}")
        reason = storable_text(reason)
        changes = {"wait_reason": reason[:500], "wake_at": adapt(wake) if wake else None, "lease_until": None,
                   "wait_provider": provider}
        if hand_back_attempt:
            # The UPDATE's right-hand sides read the row as it was.
            changes["attempts"] = ("CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END", [])
            changes["first_attempt_at"] = ("CASE WHEN attempts <= 1 THEN NULL ELSE first_attempt_at END", [])
        self._fenced(
            "wait",
            tenant,
            key,
            worker_id,
            epoch,
            State(state),
            clock,
            changes,
            reason=reason,
            detail=detail,
        )

    def defer(self, tenant: str, key: str, worker_id: str, epoch: int, deferred: Deferred, *, now=None) -> None:
        """Record a `Deferred`: the job waits with its reason until its
        `wake_at`, the attempt handed back (`wait`) — unless what held it no
        longer does (`deferred.held()` answers False, asked with the job's
        row locked: lock order the job, then whatever the check reads), when
        it is handed back READY at once (`release`): a pause lifted while
        the worker held the job never leaves it waiting for a re-check.
        Raises `Conflict` if the fence moved."""
        with self.under_fence(tenant, key, worker_id, epoch):
            if deferred.held is not None and not deferred.held():
                self.release(tenant, key, worker_id, epoch, now=now,
                             reason=f"no longer held, so not waiting: {deferred.reason}")
                return
            self.wait(tenant, key, worker_id, epoch, reason=deferred.reason, wake_at=deferred.wake_at,
                      hand_back_attempt=True, now=now)

    def fail(
        self,
        tenant: str,
        key: str,
        worker_id: str,
        epoch: int,
        *,
        error: str,
        failure: Failure | str = Failure.TRANSIENT,
        retry_after: float | None = None,
        ceiling: float | None = None,
        detail: dict | None = None,
        now=None,
    ) -> Decision:
        """Record a failed attempt and let the retry policy decide what next:
        retry (READY at a later `next_attempt_at`), review (WAITING_REVIEW) or
        an operator (NEEDS_ATTENTION). Returns the decision.
        Raises `Conflict` if the fence moved."""
        clock = Clock.of(now)
        error = storable_text(error)
        job = self._holder(tenant, key, worker_id, epoch)
        at = clock.value()
        decision = decide(
            failure=Failure(failure),
            error=error,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            first_attempt_at=job.first_attempt_at,
            recoveries=job.recoveries,
            now=at,
            policy=retry_policy(job.action),
            retry_after=retry_after,
            ceiling=ceiling,
        )
        changes = {"last_error": decision.reason, "lease_until": None}
        if decision.target == State.READY:
            changes["next_attempt_at"] = Clock(at).plus(decision.delay or 0)
        if decision.target == State.WAITING_REVIEW:
            changes["wait_reason"] = decision.reason[:500]
        self._fenced(
            "fail",
            tenant,
            key,
            worker_id,
            epoch,
            decision.target,
            Clock(at),
            changes,
            reason=decision.reason,
            detail={"failure": str(Failure(failure)), "delay": decision.delay, **(detail or {})},
        )
        return decision

    def fail_with(self, tenant: str, key: str, worker_id: str, epoch: int, exc: BaseException, *, now=None) -> Decision:
        """`fail` for the exception a handler raised, classified by the retry
        policy (`retry.classify`): the worker and every caller that runs a
        handler record failures the same way."""
        failure, retry_after, ceiling = classify(exc)
        # An exception may carry evidence for the history (e.g. the original
        # exception of a Django task: its class path and traceback).
        detail = getattr(exc, "detail", None)
        return self.fail(tenant, key, worker_id, epoch, error=describe_exception(exc), failure=failure,
                         retry_after=retry_after, ceiling=ceiling, now=now,
                         detail=detail if isinstance(detail, dict) else None)

    def release(self, tenant: str, key: str, worker_id: str, epoch: int, *, reason: str, now=None) -> None:
        """Hand a job back untouched (e.g. shutdown before its handler began):
        READY at once, and the attempt it was claimed for is not counted."""
        job = self._holder(tenant, key, worker_id, epoch)
        clock = Clock.of(now)
        self._fenced(
            "release",
            tenant,
            key,
            worker_id,
            epoch,
            State.READY,
            clock,
            {"attempts": max(0, job.attempts - 1), "lease_until": None, "next_attempt_at": None},
            reason=reason,
        )

    @contextmanager
    def under_fence(self, tenant: str, key: str, worker_id: str, epoch: int):
        """A transaction in which the caller's fence is verified and held:
        the job row is locked (PostgreSQL `FOR UPDATE`; SQLite's immediate
        transaction holds the write lock), so no takeover can commit until the
        block ends. Other rows written inside (an operation intent, a
        receipt) therefore commit only if the fence still held. Raises
        `Conflict` if it does not hold; yields the job."""
        with transaction.atomic():
            job = job_found(Job.objects.select_for_update().by_key(tenant, key).first(), tenant, key)
            yield fence_checked(job, worker_id=worker_id, epoch=epoch)

    # ------------------------------------------------------------ a wait ends

    def resume(self, tenant: str, key: str, *, reason: str, actor: str = "", detail: dict | None = None, now=None) -> Job:
        """End a wait (a reply arrived, a timer fired, a reviewer approved):
        the job is READY at once. Raises `InvalidTransition` unless it waits.
        (The decisions people take on a job are `jobs.interventions`.)"""
        return decide_on(tenant=tenant, key=key, name="resume", target=State.READY, reason=reason, actor=actor,
                         detail=detail, now=now, extra={"next_attempt_at": None})

    # ------------------------------------------------------------ recovery

    def recover_expired(self, *, limit: int = 100, now=None, actor: str = "recovery") -> list[Recovered]:
        """Take back at most `limit` expired leases: each goes to READY, or to
        NEEDS_ATTENTION when its attempts, recovery window or recovery count
        are exhausted (the retry policy decides). Bounded and SKIP LOCKED, so
        several workers may sweep at once without blocking each other."""
        return self._take_back(
            lambda at: expired_leases(at=at).order_by("lease_until"), limit=limit, now=now, actor=actor,
            why=lambda job: f"worker {job.worker_id} did not renew its lease (epoch {job.lease_epoch})",
        )

    def take_over(self, holders: dict[str, str], *, actor: str, now=None) -> list[Recovered]:
        """Take back at once every lease held by the workers `holders` names,
        each known to be gone (its id → why: `jobs.holders`), whatever time
        its leases have left — exactly as `recover_expired` takes back an
        expired one, the history row saying why. The epoch stays and the job
        leaves LEASED, so a write the gone holder might still send is
        refused by the fence."""
        if not holders:
            return []
        return self._take_back(
            lambda at: leases_held(by=holders).order_by("id"), limit=None, now=now, actor=actor,
            why=lambda job: f"worker {job.worker_id} is gone: {holders[job.worker_id]} (epoch {job.lease_epoch}); "
                            f"its lease taken back by {actor}",
        )

    def _take_back(self, leases, *, limit: int | None, now, actor: str, why) -> list[Recovered]:
        """Take the jobs `leases(at)` selects out of their leases (at most
        `limit`), each to where the retry policy sends a lost lease, with
        its history row (`why(job)`: what is known of its holder)."""
        clock = Clock.of(now)
        recovered = []
        with transaction.atomic():
            at = clock.value()
            held = leases(at)
            if _is_postgres():
                held = held.select_for_update(skip_locked=True)
            for job in held[:limit]:
                decision = decide(
                    failure=Failure.LOST_LEASE,
                    error=why(job),
                    attempts=job.attempts,
                    max_attempts=job.max_attempts,
                    first_attempt_at=job.first_attempt_at,
                    recoveries=job.recoveries + 1,
                    now=at,
                    policy=retry_policy(job.action),
                    retry_after=0.0,
                )
                transition_write(
                    job,
                    "recover",
                    decision.target,
                    Clock(at),
                    {"recoveries": job.recoveries + 1, "lease_until": None, "next_attempt_at": None,
                     "last_error": decision.reason},
                    actor=actor,
                    reason=decision.reason,
                )
                recovered.append(Recovered(job.tenant, job.key, decision.target, decision.reason))
        if any(r.to_state == State.READY for r in recovered):
            notify.job_ready()
        return recovered

    def wake_due(self, *, limit: int = 100, now=None, actor: str = "timer") -> int:
        """Resume waiting jobs whose `wake_at` has passed (bounded)."""
        clock = Clock.of(now)
        woken = 0
        with transaction.atomic():
            at = clock.value()
            due = waits_due(at=at)
            if _is_postgres():
                due = due.select_for_update(skip_locked=True)
            for job in due[:limit]:
                transition_write(
                    job, "resume", State.READY, Clock(at),
                    {"wait_reason": "", "wake_at": None, "next_attempt_at": None},
                    actor=actor, reason=f"wait ended at its wake-up time ({job.wait_reason})",
                )
                woken += 1
        if woken:
            notify.job_ready()
        return woken

    # ------------------------------------------------------------ internals

    def _holder(self, tenant: str, key: str, worker_id: str, epoch: int) -> Job:
        """The job as held under this fence, or `Conflict`."""
        return fence_checked(job_found(Job.objects.by_key(tenant, key).first(), tenant, key), worker_id=worker_id,
                             epoch=epoch)

    def _fenced(self, name, tenant, key, worker_id, epoch, target, clock, changes, *, reason="", detail=None, log=True):
        """One conditional UPDATE under the fence plus its event.

        PostgreSQL: a single statement (the event is inserted from the
        UPDATE's RETURNING). SQLite: the claim's time read, then the update
        and its event, in one immediate transaction. Zero rows updated means
        the fence moved → `Conflict`. A renewal (LEASED → LEASED) moves the
        lease only: a LEASED row's `updated_at` is its claim's time
        (`Job.claimed_at`), which the write that ends the attempt copies
        into its history row.
        """
        transition(name, State.LEASED, target)
        now_sql, now_params = clock.sql()
        sets, params = [], []
        if target != State.LEASED:
            sets, params = ["state = %s", f"updated_at = {now_sql}"], [str(target), *now_params]
        for column, value in changes.items():
            expr, values = value if isinstance(value, tuple) else ("%s", [db_value(value)])
            sets.append(f"{column} = {expr}")
            params += values
        fence = [tenant, key, epoch, worker_id]
        update = fill(_FENCED_UPDATE, sets=", ".join(sets), fence=_FENCE)
        params += fence
        # The worker writes about its own attempt: named once, in worker_id
        # (`JobEvent.by`).
        event = [name, State.LEASED, str(target), worker_id, "", storable_text(reason), detail_json(detail)]
        # Into review: the deadline hooks write in the same transaction.
        into_review = target == State.WAITING_REVIEW and review_hooked()
        atomic = transaction.atomic() if into_review else _atomic_unless_postgres()
        with atomic, connection.cursor() as cursor:
            if _is_postgres() and log:
                cursor.execute(fill(_FENCED_UPDATE_LOGGED, fence=_FENCE, update=update, now=now_sql),
                               [*fence, *params, *event, *now_params])
                rows = cursor.fetchall()
                written = len(rows)
            else:
                claimed = None
                if log:
                    cursor.execute(_FENCED_CLAIM_TIME, fence)
                    claimed = cursor.fetchone()
                cursor.execute(update, params)
                rows = cursor.fetchall()
                written = len(rows)
                if rows and log:
                    cursor.execute(
                        fill(_HISTORY_APPEND, now=now_sql),
                        [rows[0][0], event[0], event[1], event[2], rows[0][1], *event[3:], *now_params,
                         claimed[0] if claimed else None],
                    )
            if rows and into_review:
                review_changed(rows[0][0], State.LEASED, target, clock)
        if not written:
            job = job_found(Job.objects.by_key(tenant, key).first(), tenant, key)
            raise fence_conflict(job, worker_id=worker_id, epoch=epoch)


def _finishes(done: list[tuple[Job, Any]]) -> "claim_sql.Finishes":
    """The finishes of `done`, results checked (a `ValueError` names the
    first that is not strict JSON, before anything is written)."""
    transition("finish", State.LEASED, State.DONE)
    return claim_sql.Finishes(
        ids=[job.id for job, _ in done],
        epochs=[job.lease_epoch for job, _ in done],
        tenants=[job.tenant for job, _ in done],
        results=[strict_json(result, field="result") if result is not None else None for _, result in done],
    )
