"""The job history partitioned by day on PostgreSQL (DESIGN §13, retention).

At 100M jobs a month a day brings some 3M jobs and several times as many
history rows; deleting those rows one by one is most of what retention would
cost (and leaves them dead until a vacuum). So on PostgreSQL `jobs_jobevent`
is a table partitioned by range of `created_at`, one partition per UTC day
(`jobs_jobevent_pYYYYMMDD_YYYYMMDD`, lower bound included, upper excluded)
plus a default partition for anything no day partition covers. Retention of
old history is then a partition drop.

- The table has no primary key constraint (migration 0017; one would have
  to hold the partition key, `created_at`): every lookup names the job and
  reads `jobevent_job_id`. The model keeps `id` as its pk, and ids stay
  unique because they come from one identity sequence.
- No foreign key points into the table, and its own link to the job has no
  database constraint (`db_constraint=False`): a deleted job's history stays
  in its day's partition until that partition goes.
- **The drop rule** (`_holds_remaining_history`, the one place): a day
  partition is dropped only when its whole range is before the retention
  cutoff and *no job that still exists has a history row in it* — a job kept
  because something live refers to it, or unfinished for longer than the
  retention, keeps every partition that holds its history (reported as kept
  until it goes). The check runs again once the partition is detached (no
  row can arrive then) and the partition is re-attached if it fails.
- Partitions are created ahead (`JOBS_HISTORY_PARTITIONS_AHEAD` days) by the
  sweep and by the migration; rows that landed in the default partition for
  a day move into that day's partition when it is created.

SQLite (and a PostgreSQL database whose table is still plain) keeps the plain
table: history is deleted with its job, row by row (`history_delete`).
"""

import re
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from .tablestorage import INSERT_ONLY

__all__ = ["history_partitioned", "history_partitions_ensure", "history_partitions_drop", "history_delete",
           "history_partitions", "PARENT", "DEFAULT"]

PARENT = "jobs_jobevent"
DEFAULT = "jobs_jobevent_default"
_NAME = re.compile(r"^jobs_jobevent_p(\d{8})_(\d{8})$")
# Partition DDL takes a short exclusive lock on the parent: never queue
# behind a long transaction (and stall every writer queued behind us).
_LOCK_TIMEOUT = "2s"
# Each partition is an insert-only table (`jobs.tablestorage`).
PARTITION_STORAGE = ", ".join(f"{name} = {value}" for name, value in INSERT_ONLY.items())


def history_partitioned(using=None) -> bool:
    """Whether the history table is partitioned (PostgreSQL after the migration)."""
    conn = connection if using is None else using
    if conn.vendor != "postgresql":
        return False
    with conn.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [PARENT])
        row = cursor.fetchone()
    return bool(row) and row[0] == "p"


def partition_name(lo: date, hi: date) -> str:
    return f"{PARENT}_p{lo:%Y%m%d}_{hi:%Y%m%d}"


def history_partitions(using=None) -> dict[str, tuple[date, date]]:
    """The day-range partitions attached now: name → (lower, upper)."""
    conn = connection if using is None else using
    with conn.cursor() as cursor:
        cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s)", [PARENT])
        names = [name for (name,) in cursor.fetchall()]
    found = {}
    for name in names:
        if match := _NAME.match(name):
            found[name] = tuple(datetime.strptime(part, "%Y%m%d").date() for part in match.groups())
    return dict(sorted(found.items(), key=lambda item: item[1]))


def _bound(day: date) -> str:
    return f"{day:%Y-%m-%d} 00:00:00+00"


def partition_create(lo: date, hi: date, using=None) -> str:
    """Create and attach the partition [lo, hi)."""
    conn = connection if using is None else using
    name = partition_name(lo, hi)
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
        cursor.execute(f"CREATE TABLE {name} (LIKE {PARENT} INCLUDING DEFAULTS) WITH ({PARTITION_STORAGE})")
        _attach(name, lo, hi, cursor)
    return name


def _attach(name: str, lo: date, hi: date, cursor) -> None:
    """Attach a table as the partition [lo, hi), first moving into it any rows
    of that range the default partition holds. ATTACH takes only a SHARE
    UPDATE EXCLUSIVE lock on the parent (CREATE … PARTITION OF would block
    every writer while it runs)."""
    # Bounds are dates we format ourselves; DDL takes no bound parameters.
    lower, upper = f"'{_bound(lo)}'::timestamptz", f"'{_bound(hi)}'::timestamptz"
    # A CHECK matching the bound lets ATTACH skip its validation scan.
    cursor.execute(f"ALTER TABLE {name} ADD CONSTRAINT {name}_range CHECK "
                   f"(created_at >= {lower} AND created_at < {upper})")
    cursor.execute(f"WITH moved AS (DELETE FROM {DEFAULT} WHERE created_at >= {lower} AND created_at < {upper} "
                   f"RETURNING *) INSERT INTO {name} SELECT * FROM moved")
    cursor.execute(f"ALTER TABLE {PARENT} ATTACH PARTITION {name} FOR VALUES FROM ({lower}) TO ({upper})")
    cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_range")


def history_partitions_ensure(*, now: datetime, ahead: int | None = None, using=None) -> list[str]:
    """Day partitions from `now`'s UTC day through `ahead` days later
    (default JOBS_HISTORY_PARTITIONS_AHEAD); returns those it created."""
    ahead = settings.JOBS_HISTORY_PARTITIONS_AHEAD if ahead is None else ahead
    have = history_partitions(using)
    taken = list(have.values())
    first = now.astimezone(UTC).date()
    created = []
    for offset in range(ahead + 1):
        lo = first + timedelta(days=offset)
        hi = lo + timedelta(days=1)
        if any(a < hi and lo < b for a, b in taken):
            continue  # covered (or overlapped) by a partition already there
        created.append(partition_create(lo, hi, using))
        taken.append((lo, hi))
    return created


def _holds_remaining_history(name: str, cursor) -> int:
    """THE DROP RULE: how many jobs that still exist have history in this
    partition (counted up to a small limit: any is enough to keep it)."""
    cursor.execute(f"SELECT count(*) FROM (SELECT DISTINCT e.job_id FROM {name} e "
                   f"WHERE EXISTS (SELECT 1 FROM jobs_job j WHERE j.id = e.job_id) LIMIT 100) AS remaining")
    return cursor.fetchone()[0]


def history_partitions_drop(*, before: datetime, using=None) -> tuple[list[str], dict[str, int]]:
    """Drop the day partitions wholly before `before` that no remaining job
    has history in; returns (dropped, kept: name → remaining jobs)."""
    conn = connection if using is None else using
    cutoff = before.astimezone(UTC)
    dropped, kept = [], {}
    for name, (lo, hi) in history_partitions(conn).items():
        if datetime(hi.year, hi.month, hi.day, tzinfo=UTC) > cutoff:
            continue
        with conn.cursor() as cursor:
            remaining = _holds_remaining_history(name, cursor)
        if remaining:
            kept[name] = remaining
            continue
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            # A short exclusive lock on the parent; from then on no row can
            # arrive in the detached table.
            cursor.execute(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
            cursor.execute(f"ALTER TABLE {PARENT} DETACH PARTITION {name}")
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            # The rule again, on what can no longer change (without holding
            # the parent): a row written since the first check puts the
            # partition back, with whatever reached the default meanwhile.
            remaining = _holds_remaining_history(name, cursor)
            if remaining:
                cursor.execute(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
                _attach(name, lo, hi, cursor)
                kept[name] = remaining
                continue
            cursor.execute(f"DROP TABLE {name}")
        dropped.append(name)
    return dropped, kept


def history_delete(job_ids: list[int], using=None) -> int:
    """Delete the history of these (deleted or about to be) jobs, row by row,
    where rows are deleted: the whole plain table, or only the default
    partition of the partitioned one (day partitions go whole)."""
    from .models import JobEvent

    conn = connection if using is None else using
    if not history_partitioned(conn):
        return JobEvent.objects.using(conn.alias).filter(job_id__in=job_ids)._raw_delete(conn.alias)
    with conn.cursor() as cursor:
        cursor.execute(f"DELETE FROM {DEFAULT} WHERE job_id = ANY(%s)", [list(job_ids)])
        return cursor.rowcount
