"""Refusing to run behind a transaction-mode pooler configured as direct.

Behind a transaction-mode pooler (PgBouncer `pool_mode = transaction`) each
transaction of a client may run on another server connection. With the
direct configuration (`DATABASE_POOL_MODE=direct`, prepared statements on)
that half works: psycopg's prepared statements meet server connections that
never saw them or already hold one by that name, and LISTEN hears nothing.
A worker finds out in two ways and then stops with a message naming the
setting — never running at a fraction of the speed with errors:

- at start-up (`transaction_pooler_seen`): two connections open at the same
  time ask for their server process. Direct (or through a session-mode
  pooler) two open connections never share one; a transaction-mode pooler
  hands the second the server connection the first just gave back;
- on the first error a prepared statement's move between server
  connections causes (`prepared_statement_error`), whichever query meets it.
"""

from django.db import connections

# What psycopg's prepared statements raise when the pooler moved them:
# "prepared statement … already exists" (42P05), "… does not exist" (26000),
# and a bind against another client's statement of the same name (08P01).
_MOVED_STATEMENT_STATES = {"42P05", "26000", "08P01"}

ADVICE = ("set DATABASE_POOL_MODE=transaction (no prepared statements, no session state) and "
          "DATABASE_LISTEN_URL to a direct connection for wake-ups, or connect directly")


def transaction_pooler_seen(alias: str = "default") -> str | None:
    """Why the database at `alias` is behind a transaction-mode pooler, or
    None when nothing shows it (see the module). PostgreSQL only."""
    first = connections[alias]
    with first.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        first_pid = cursor.fetchone()[0]
    second = connections.create_connection(alias)
    try:
        with second.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            second_pid = cursor.fetchone()[0]
    finally:
        second.close()
    if first_pid != second_pid:
        return None
    return (f"DATABASE_URL leads to a transaction-mode pooler: two connections open at the same time were "
            f"served by the same PostgreSQL process (pid {first_pid}); {ADVICE}")


def prepared_statement_error(exc: BaseException) -> str | None:
    """When `exc` is a prepared statement that a transaction-mode pooler
    moved to another server connection: why to stop, naming the setting."""
    for error in (exc, exc.__cause__):
        state = getattr(error, "sqlstate", None)
        # psycopg names its statements _pg3_N; a handler's own EXECUTE is its business.
        if state in _MOVED_STATEMENT_STATES and '"_pg3_' in str(error):
            first = str(error).strip().splitlines()[0][:200]
            return (f"the database refused a prepared statement ({first}): DATABASE_URL leads to a "
                    f"transaction-mode pooler that moves a client between server connections; {ADVICE}")
    return None
