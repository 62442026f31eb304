"""Time for the engine.

Production passes `now=None`: lease comparisons then use one clock, the
database server's (`now()` on PostgreSQL; on the embedded SQLite database the
server *is* this process's host, so its clock is read here). Tests pass a
number of seconds since the epoch so a scenario reads like the seed.
"""

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone

from . import database

# About a hundred years: longer than any wait or retry the engine schedules.
MAX_OFFSET_SECONDS = 100 * 365 * 24 * 3600.0


def to_datetime(value: float | int | datetime | None, *, field: str = "time") -> datetime | None:
    """A datetime as is, unix seconds as an aware UTC datetime; anything else
    (a string, NaN, a year past 9999 …) is a `ValueError` naming `field`, so a
    bad time is refused before it reaches SQL or overflows date arithmetic."""
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must be a datetime or unix seconds, not {type(value).__name__} {value!r:.60}")
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"{field} {value!r} is not a representable point in time") from None


@dataclass(frozen=True)
class Clock:
    """A point in time, as SQL: either a fixed instant or the server's `now()`."""

    at: datetime | None  # None: the database server's clock (PostgreSQL only)

    @classmethod
    def of(cls, now: float | int | datetime | None) -> "Clock":
        at = to_datetime(now)
        if at is None and database.vendor() != "postgresql":
            at = timezone.now()
        return cls(at)

    def sql(self, plus_seconds: float = 0.0) -> tuple[str, list]:
        """A SQL expression for this instant (+ an offset) and its parameters."""
        if not math.isfinite(plus_seconds) or abs(plus_seconds) > MAX_OFFSET_SECONDS:
            # Callers cap their delays (retry.decide); this keeps a stray one
            # from overflowing datetime arithmetic or PostgreSQL's interval.
            raise ValueError(f"a time offset of {plus_seconds!r} seconds is out of range")
        if self.at is None:
            if plus_seconds:
                return "(now() + make_interval(secs => %s))", [float(plus_seconds)]
            return "now()", []
        try:
            return "%s", [adapt(self.at + timedelta(seconds=plus_seconds))]
        except OverflowError:
            raise ValueError(f"{self.at} + {plus_seconds}s is past the last representable date") from None

    def plus(self, seconds: float) -> tuple[str, list]:
        """`sql(seconds)`, in the (expression, parameters) form the Store writes."""
        return self.sql(seconds)

    def value(self) -> datetime:
        """This instant in Python (reads the server clock when it is not fixed)."""
        if self.at is not None:
            return self.at
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return cursor.fetchone()[0]


def db_now() -> datetime:
    """The database server's clock now (PostgreSQL's `statement_timestamp()`;
    on SQLite the server is this host). Times that different workers write
    and compare — a lease, a dispatch — must all come from this one clock,
    never from each worker's own."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def adapt(at: datetime):
    """A datetime as the active backend stores it (SQLite keeps naive UTC text)."""
    return connection.ops.adapt_datetimefield_value(at)
