"""Wake idle workers when work becomes eligible.

On PostgreSQL a `NOTIFY` issued inside a transaction is delivered only when
that transaction commits (and not at all if it rolls back), so callers send it
from inside the transaction that made the job READY. Workers `LISTEN` on the
channel and fall back to polling with jitter (SQLite, lost notifications, a
transaction-mode pooler without `DATABASE_LISTEN_URL`), so a missed
notification costs latency, never work.

Where the LISTEN lives (`listener`): directly, on the connection the
waiting thread already holds for its own queries (a worker's main thread),
so listening costs no server connection of its own (DESIGN §17: at most
`--concurrency` + 1 per worker); behind a transaction-mode pooler
(`DATABASE_POOL_MODE=transaction`), on a connection of its own to
`DATABASE_LISTEN_URL` — direct to PostgreSQL, since a pooler hands a
client's next transaction to any server connection and a LISTEN there hears
nothing. Either way the thread waits with `Wakeup.wait`, which returns on a
notification or when another thread calls `Wakeup.set`.
"""

import logging
import select
import socket
import threading

from django.conf import settings
from django.db import connection, connections

from . import chance

CHANNEL = "durable_jobs"

log = logging.getLogger("jobs.notify")


def job_ready() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")


def pool_mode() -> str:
    """`direct` or `transaction` (DATABASE_POOL_MODE, checked by the settings)."""
    return getattr(settings, "DATABASE_POOL_MODE", "direct")


def polling_only_reason() -> str | None:
    """Why workers on this configuration cannot be woken by NOTIFY and poll
    instead, or None when they can (PostgreSQL, and a direct LISTEN)."""
    if connection.vendor != "postgresql":
        return f"{connection.vendor} has no NOTIFY"
    if pool_mode() == "transaction" and not getattr(settings, "DATABASE_LISTEN_URL", ""):
        return ("DATABASE_POOL_MODE=transaction without DATABASE_LISTEN_URL: a LISTEN through a "
                "transaction-mode pooler hears nothing, so wake-ups fall back to polling; set "
                "DATABASE_LISTEN_URL to a direct connection to the same database")
    return None


def listener(on_notify, *, alias: str = "default") -> "Listener | None":
    """The listener for this configuration (see the module), or None when
    there is none (`polling_only_reason`)."""
    if polling_only_reason():
        return None
    url = getattr(settings, "DATABASE_LISTEN_URL", "") if pool_mode() == "transaction" else ""
    return Listener(on_notify, url=url or None, alias=alias)


class Wakeup:
    """A `threading.Event` whose waiter can also wait for a listener's
    notifications: `set` writes a byte to a socket pair, so one `select`
    sees either."""

    def __init__(self):
        self._event = threading.Event()
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)

    def set(self) -> None:
        self._event.set()
        try:
            self._write.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the pair is full (a wake-up is pending anyway) or closed

    def clear(self) -> None:
        self._event.clear()
        try:
            while self._read.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float, listener: "Listener | None" = None) -> bool:
        """Until `set`, a notification (handed to the listener's callback,
        which sets this) or `timeout` seconds; returns whether it was set."""
        if self._event.is_set():
            return True
        fileno = listener.fileno() if listener else None
        if fileno is None:
            return self._event.wait(timeout)
        # Notifications that arrived while the thread ran other queries on
        # the same connection were read then and are waiting in psycopg.
        if listener.drain():
            return self._event.is_set()
        try:
            ready, _, _ = select.select([self._read, fileno], [], [], max(0.0, timeout))
        except (OSError, ValueError):  # the connection was closed meanwhile
            return self._event.wait(timeout)
        if fileno in ready:
            listener.drain()
        return self._event.is_set()

    def close(self) -> None:
        self._read.close()
        self._write.close()


class Listener:
    """LISTEN on the channel for the thread that calls `ensure` (before each
    wait), `drain` and `close`: on that thread's own Django connection when
    `url` is None, else on a connection of its own to `url`. `ensure`
    subscribes again whenever the connection is new (Django reconnected
    after an error, or it was closed), backing off while the database is
    away; meanwhile the caller's polling keeps work moving."""

    def __init__(self, on_notify, *, url: str | None = None, alias: str = "default"):
        self.on_notify = on_notify
        self.url = url
        self.alias = alias
        self._conn = None  # the psycopg connection the LISTEN was issued on
        self._own = False  # whether `_conn` is ours to close
        self._failures = 0
        self._retry_at = 0.0

    @property
    def subscribed(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def ensure(self) -> bool:
        """Be subscribed; returns True when it subscribed just now (what was
        sent meanwhile was missed: the caller looks for work once)."""
        import time

        if self.url is None:
            wrapper = connections[self.alias]
            raw = wrapper.connection
            if raw is not None and raw is self._conn and not raw.closed:
                return False
        elif self.subscribed:
            return False
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._subscribe()
        except Exception as exc:  # noqa: BLE001 - any failure: back off; polling covers the gap
            self._failures += 1
            self._retry_at = time.monotonic() + min(10.0, 0.2 * 2**self._failures) * chance.rng.random()
            self._drop()
            if self._failures == 1:
                log.warning("LISTEN failed, polling until it is back: %s", str(exc).strip()[:200])
            return False
        self._failures = 0
        return True

    def _subscribe(self) -> None:
        if self.url is None:
            wrapper = connections[self.alias]
            with wrapper.cursor() as cursor:  # connects if need be; autocommit outside a transaction
                cursor.execute(f"LISTEN {CHANNEL}")
            self._conn, self._own = wrapper.connection, False
            return
        import psycopg

        options = connections[self.alias].settings_dict.get("OPTIONS", {})
        extra = {"application_name": options["application_name"]} if options.get("application_name") else {}
        conn = psycopg.connect(self.url, autocommit=True, **extra)
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except Exception:
            conn.close()
            raise
        self._conn, self._own = conn, True

    def fileno(self) -> int | None:
        if not self.subscribed:
            return None
        try:
            return self._conn.fileno()
        except Exception:  # noqa: BLE001 - closed under us
            return None

    def drain(self) -> int:
        """Hand every notification received so far to the callback (without
        waiting); returns how many."""
        if not self.subscribed:
            return 0
        count = 0
        try:
            for _ in self._conn.notifies(timeout=0):
                count += 1
        except Exception:  # noqa: BLE001 - the connection broke: subscribe again on the next `ensure`
            self._drop(broken=True)
            return 0
        if count:
            self.on_notify()
        return count

    def _drop(self, *, broken: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._own:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
        elif broken:
            # The thread's own Django connection (never inside a transaction
            # while it waits): closed, Django reconnects at its next query.
            try:
                connections[self.alias].close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def close(self) -> None:
        self._drop()
