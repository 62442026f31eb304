"""Wake idle workers when work becomes eligible.

On PostgreSQL a `NOTIFY` issued inside a transaction is delivered only when
that transaction commits (and not at all if it rolls back), so callers send it
from inside the transaction that made the job READY. Workers `LISTEN` on the
channel and fall back to polling with jitter (SQLite, lost notifications,
transaction-mode poolers), so a missed notification costs latency, never work.
"""

from django.db import connection

CHANNEL = "durable_jobs"


def job_ready() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")


class Listener:
    """A background thread holding its own connection in LISTEN, calling
    `on_notify()` for each notification. If the connection drops it
    reconnects with backoff; meanwhile the worker's poll keeps work moving."""

    def __init__(self, on_notify, *, alias: str = "default"):
        import threading

        self.on_notify = on_notify
        self.alias = alias
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listen", daemon=True)
        self._conn = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _connect(self):
        import psycopg
        from django.db import connections

        params = connections[self.alias].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def _run(self) -> None:
        import random

        failures = 0
        while not self._stop.is_set():
            try:
                conn = self._connect()
                failures = 0
                try:
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.on_notify()
                finally:
                    conn.close()
            except Exception:  # noqa: BLE001 - any failure: back off, reconnect; polling covers the gap
                failures += 1
                self._stop.wait(min(10.0, 0.2 * 2**failures) * random.random())
