"""What the migrations share, frozen: copies of the engine's helpers as they
were when the migrations that use them were written (`jobs.partitions`,
`jobs.tablestorage`) and the claim index's shape, so those modules can change
without changing what an old migration does. Only migrations import this
module; Django's migration loader skips it (its name starts with "_")."""

import re
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, migrations, transaction

# ---------------------------------------------------------------- the claim index (0002, 0007, 0010)

# The claim order, for the claim indexes: PostgreSQL sorts NULLs last by
# default, so its indexes say NULLS FIRST to match the claim's ORDER BY;
# SQLite sorts NULLs first already and has no NULLS clause in CREATE INDEX.
ORDER_PG = "priority DESC, next_attempt_at ASC NULLS FIRST, id"
ORDER_SQLITE = "priority DESC, next_attempt_at, id"


def restore_claim_index(apps, schema_editor):
    # SQLite rebuilds jobs_job to add a column with a default (or a foreign
    # key), and the rebuilt table loses the hand-made claim index of
    # migration 0007: create it again, exactly as 0007 does.
    if schema_editor.connection.vendor == "postgresql":
        return
    schema_editor.execute(f"CREATE INDEX IF NOT EXISTS job_claim_tenant ON jobs_job (tenant, {ORDER_SQLITE}) "
                          "WHERE state = 'READY'")


# ---------------------------------------------------------------- table storage (jobs.tablestorage)

# Rows retention deletes by the million: vacuum after 2 % is dead.
DELETED_IN_BULK = {"autovacuum_vacuum_scale_factor": "0.02", "autovacuum_analyze_scale_factor": "0.02"}
# Append-only rows (and deleted with their job): vacuum for the visibility
# map after 5 % new rows, as well.
INSERT_ONLY = {**DELETED_IN_BULK, "autovacuum_vacuum_insert_scale_factor": "0.05"}


def table_storage(tables: dict[str, dict[str, str]]) -> migrations.RunPython:
    """A migration operation that sets the tables' storage parameters
    (PostgreSQL; a no-op on SQLite) and resets them on the way back."""
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for table, params in tables.items():
            settings = ", ".join(f"{name} = {value}" for name, value in params.items())
            schema_editor.execute(f"ALTER TABLE {table} SET ({settings})")

    def revert(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for table, params in tables.items():
            schema_editor.execute(f"ALTER TABLE {table} RESET ({', '.join(params)})")

    return migrations.RunPython(apply, revert, elidable=False)


# ---------------------------------------------------------------- the history's day partitions (jobs.partitions)

PARENT = "jobs_jobevent"
DEFAULT = "jobs_jobevent_default"
_NAME = re.compile(r"^jobs_jobevent_p(\d{8})_(\d{8})$")
# Partition DDL takes a short exclusive lock on the parent: never queue
# behind a long transaction (and stall every writer queued behind us).
_LOCK_TIMEOUT = "2s"
# Each partition is an insert-only table.
PARTITION_STORAGE = ", ".join(f"{name} = {value}" for name, value in INSERT_ONLY.items())


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
