"""Time for the engine.

Production passes `now=None`: lease comparisons then use one clock, the
database server's (`now()` on PostgreSQL; on the embedded SQLite database the
server *is* this process's host, so its clock is read here). Tests pass a
number of seconds since the epoch so a scenario reads like the seed.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone


def to_datetime(value: float | int | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromtimestamp(float(value), tz=UTC)


@dataclass(frozen=True)
class Clock:
    """A point in time, as SQL: either a fixed instant or the server's `now()`."""

    at: datetime | None  # None: the database server's clock (PostgreSQL only)

    @classmethod
    def of(cls, now: float | int | datetime | None) -> "Clock":
        at = to_datetime(now)
        if at is None and connection.vendor != "postgresql":
            at = timezone.now()
        return cls(at)

    def sql(self, plus_seconds: float = 0.0) -> tuple[str, list]:
        """A SQL expression for this instant (+ an offset) and its parameters."""
        if self.at is None:
            if plus_seconds:
                return "(now() + make_interval(secs => %s))", [float(plus_seconds)]
            return "now()", []
        return "%s", [adapt(self.at + timedelta(seconds=plus_seconds))]

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


def adapt(at: datetime):
    """A datetime as the active backend stores it (SQLite keeps naive UTC text)."""
    return connection.ops.adapt_datetimefield_value(at)
