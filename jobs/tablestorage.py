"""Per-table storage settings for PostgreSQL, set by migrations (a no-op on
SQLite): `table_storage({"table": {"param": value}})` is a migration
operation that sets them and resets them on the way back.

Why per table: PostgreSQL's defaults vacuum a table once a fifth of it is
dead (`autovacuum_vacuum_scale_factor` 0.2), which at 100M jobs a month is
tens of millions of dead rows after each retention sweep; the tables that
grow with the jobs set a small fraction instead. `fillfactor` leaves room in
each page for the new versions of its rows: where updates touch no indexed
column PostgreSQL can then update in place (HOT, no index write); on the job
table, whose updates are never HOT, the new version still stays in its page,
which saves the lock record and the full row a move to another page logs.
A table whose rows are seldom updated gets none."""

from django.db import migrations

__all__ = ["table_storage", "DELETED_IN_BULK", "INSERT_ONLY"]

# Rows retention deletes by the million: vacuum after 2 % is dead.
DELETED_IN_BULK = {"autovacuum_vacuum_scale_factor": "0.02", "autovacuum_analyze_scale_factor": "0.02"}
# Append-only rows (and deleted with their job): vacuum for the visibility
# map after 5 % new rows, as well.
INSERT_ONLY = {**DELETED_IN_BULK, "autovacuum_vacuum_insert_scale_factor": "0.05"}


def table_storage(tables: dict[str, dict[str, str]]) -> migrations.RunPython:
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
