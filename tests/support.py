"""Plain helpers shared across the suite: synchronise on conditions and
readiness signals, never on fixed sleeps."""

import threading
import time
from contextlib import contextmanager, nullcontext


def wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` until it returns something truthy (returned), or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def lease_expired(tenant: str, key: str) -> bool:
    """Whether the job's lease has run out by the database server's clock
    (the clock leases are granted and taken over by)."""
    from django.db.models.functions import Now

    from jobs.models import Job

    return Job.objects.filter(tenant=tenant, key=key, lease_until__lt=Now()).exists()


def work_to_do(tenant: str, key: str) -> bool:
    """Whether a worker started now would find something to do with the job,
    by the database server's clock: READY and due (a retry's backoff has
    passed), or LEASED with its lease expired (recovery takes it back)."""
    from django.db.models import Q
    from django.db.models.functions import Now

    from jobs.models import Job

    return Job.objects.filter(
        Q(state="READY", next_attempt_at__isnull=True) | Q(state="READY", next_attempt_at__lte=Now())
        | Q(state="LEASED", lease_until__lt=Now()), tenant=tenant, key=key).exists()


class ProcessOutput:
    """Everything a child process writes to its stdout pipe, read by a
    background thread: a test waits for a line (a readiness signal such as a
    worker's status line) instead of sleeping, and the pipe never fills up."""

    def __init__(self, process):
        self.process = process
        self.lines: list[str] = []
        self._eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def text(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def wait_for(self, text: str, *, timeout: float = 20.0) -> str:
        """Block until a line containing `text` was printed; return it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                remaining = deadline - time.monotonic()
                if self._eof or remaining <= 0:
                    why = "the process ended" if self._eof else f"timed out after {timeout}s"
                    raise AssertionError(f"{why} before printing {text!r}; it printed:\n{''.join(self.lines)}")
                self._changed.wait(remaining)

    def finish(self, *, timeout: float = 20.0) -> str:
        """Wait for the process to exit and return all it printed."""
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return self.text()


def in_processes(target, arglists, *, timeout: float = 240.0) -> list[tuple[str, object]]:
    """Run `target(*args)` in a forked process per entry of `arglists` (each
    inherits the test database settings and opens its own connection); wait
    for all of them to exit 0 and return their ("ok", result) or ("error",
    repr of what was raised), in the order they reported."""
    import multiprocessing

    from django.db import connections

    connections.close_all()  # never share a socket with forked children
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child(*args):
        try:
            queue.put(("ok", target(*args)))
        except BaseException as exc:  # noqa: BLE001 - report any failure to the parent
            queue.put(("error", repr(exc)))
        finally:
            connections.close_all()

    procs = [ctx.Process(target=child, args=tuple(args)) for args in arglists]
    for p in procs:
        p.start()
    results = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def waiting_on_locks() -> int:
    """Backends of this database blocked on a lock another one holds (PostgreSQL)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


@contextmanager
def held_open(write, *, until_waiting: int = 1, rollback: bool = False):
    """Run `write()` in a transaction of another connection and keep it open
    (its rows locked, not yet visible) until `until_waiting` backends wait on
    its locks; then commit (or, with `rollback`, roll back: every waiter
    wakes at once). Yields a dict that gets the write's result."""
    from django.db import connection, transaction

    done, inside, outcome = threading.Event(), threading.Event(), {}

    def hold():
        try:
            with transaction.atomic():
                outcome["result"] = write()
                inside.set()
                done.wait(60)
                transaction.set_rollback(rollback)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome["error"] = exc
            inside.set()
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30) and "error" not in outcome, outcome.get("error")
    try:
        yield outcome
        wait_for(lambda: waiting_on_locks() >= until_waiting, what="the other writer to wait on the lock")
    finally:
        done.set()
        holder.join(60)


def in_thread(target):
    """Run `target()` in a thread with its own database connection; returns
    the thread and a dict that gets its result (or the exception it raised)."""
    from django.db import connection

    outcome = {}

    def run():
        try:
            outcome["result"] = target()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


@contextmanager
def auto_explained(*settings: str, session: bool = False):
    """A transaction in which PostgreSQL's auto_explain reports the plan of
    every statement run, as a notice: yields the list each plan's text is
    added to. `settings` are more `SET LOCAL` settings (auto_explain's own
    options, a plan cache mode). With `session`, no transaction: the
    settings hold for the connection until the block ends (for code that
    opens transactions of its own, which may not be nested)."""
    from django.db import connection, transaction

    plans: list[str] = []
    connection.ensure_connection()
    handler = lambda diagnostic: plans.append(diagnostic.message_primary or "")  # noqa: E731
    connection.connection.add_notice_handler(handler)
    names = [s.split("=")[0].strip() for s in ("auto_explain.log_min_duration = 0",
                                                "auto_explain.log_level = notice",
                                                "client_min_messages = notice", *settings)]
    try:
        with (nullcontext() if session else transaction.atomic()), connection.cursor() as cursor:
            cursor.execute("LOAD 'auto_explain'")
            for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_level = notice",
                            "client_min_messages = notice", *settings):
                cursor.execute(f"SET {'' if session else 'LOCAL '}{setting}")
            yield plans
            if session:
                for name in names:
                    cursor.execute(f"RESET {name}")
    finally:
        connection.connection.remove_notice_handler(handler)


def explained(sql: str, params, *, settings: tuple[str, ...] = ()) -> list[dict]:
    """Every node of `sql`'s plan as PostgreSQL runs it (EXPLAIN ANALYZE,
    FORMAT JSON), in a transaction that is rolled back: what it would write
    is not kept. `settings` are `SET LOCAL` statements run first
    (`proving.bench.common.analyzed_plan`, which the bench reads too)."""
    from proving.bench.common import analyzed_plan

    return list(plan_nodes(analyzed_plan(sql, params, settings=settings)))


def plan_nodes(node: dict):
    """A plan node of EXPLAIN (FORMAT JSON) and every node under it."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
