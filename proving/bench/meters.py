"""What a bench run reads of the database and the host while it measures:
the database's clock, PostgreSQL's WAL position, and CPU time from /proc."""

import os
from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone


def db_now() -> datetime:
    """The database's clock right now (SQLite: this host's clock, which is
    the clock the engine stamps SQLite rows with)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]
    return timezone.now()


def as_aware(value) -> datetime:
    """A time read back from the database as an aware datetime (SQLite may
    give text, or a naive value in UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# ---------------------------------------------------------------- CPU


def cpu_now(pids: list[int]) -> tuple[float, float] | None:
    """(CPU seconds the processes `pids` have used, CPU seconds the whole
    host has been busy), from /proc — None where there is none (not Linux)
    or a process is gone."""
    try:
        with open("/proc/stat") as stat:
            # user nice system idle iowait irq softirq steal …: busy is all but idle and iowait.
            ticks = [int(v) for v in stat.readline().split()[1:]]
        clients = 0
        for pid in pids:
            with open(f"/proc/{pid}/stat") as stat:
                # After the command's closing parenthesis: utime and stime
                # are the 12th and 13th fields (all threads of the process).
                fields = stat.read().rsplit(")", 1)[1].split()
            clients += int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None
    per_second = os.sysconf("SC_CLK_TCK")
    return clients / per_second, (sum(ticks) - ticks[3] - ticks[4]) / per_second


def cpu_since(before: tuple[float, float] | None, after: tuple[float, float] | None) -> tuple[float, float] | None:
    """(clients' CPU seconds, the rest of the host's) between two `cpu_now`."""
    if before is None or after is None:
        return None
    clients = after[0] - before[0]
    return clients, max(0.0, after[1] - before[1] - clients)


# ---------------------------------------------------------------- WAL


def wal_position() -> str | None:
    """PostgreSQL's WAL insert position (None on SQLite)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
        return cursor.fetchone()[0]


def wal_since(position: str | None) -> int | None:
    """WAL bytes written by everyone since `position`: during a run, the
    workers' (or the raw loop's) statements and commits, and what the
    server adds to them."""
    if position is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)::bigint", [position])
        return cursor.fetchone()[0]
