"""Reads on a standby (DATABASE_REPLICA_URL, docs/howto/failover.md).

The pages people read — every GET or HEAD of the admin and the console,
and the agent API's GETs — read the work's records (jobs, their history,
operations, business records, proposals) on the standby, the database
alias `replica`. Everything else uses the primary:

- every write, and every read in any other request: a decision, a bulk
  action, a proposal is a POST, so it reads on the primary the state it
  checks — the event the person saw (`seen_event`) against the newest one
  there, which refuses a decision taken on a page the standby showed late;
- every read inside a transaction on the primary (a GET that writes reads
  what it writes against on the primary);
- who may do what, whatever the request: users, sessions, permissions,
  login throttling, tenants, memberships and roles, tenant and review
  policies, agents and their keys — a role taken away or a key revoked
  takes effect at once, never a replication delay later.

A page read on the standby says how far behind the primary it is when it
is behind (`replica_lag_seconds`; the admin's header shows it), and an API
answer read there carries it in the `Replica-Lag` header.
"""

from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

REPLICA = "replica"
# The apps whose records are read on the standby in a read-only request…
RECORD_APPS = frozenset({"jobs", "review", "operations", "company", "gateway"})
# …but for these models, which decide who may do what: always the primary.
PERMISSION_MODELS = frozenset({
    "company.tenant", "company.membership", "company.tenantpolicy", "company.reviewpolicy",
    "gateway.agent", "gateway.apikey",
})
# The requests read on the standby (GET and HEAD only).
READ_PREFIXES = ("/admin/", "/api/v1/")

_reading = ContextVar("durable_replica_reads", default=False)


def replica_configured() -> bool:
    return REPLICA in settings.DATABASES


@contextmanager
def reads_on_replica():
    """Within the block, records are read on the standby (when one is
    configured), as in a read-only page's request."""
    token = _reading.set(True)
    try:
        yield
    finally:
        _reading.reset(token)


def reads_record_on_replica(model) -> bool:
    """Is a read of `model` here and now sent to the standby?"""
    meta = model._meta
    return (_reading.get() and replica_configured()
            and meta.app_label in RECORD_APPS and meta.label_lower not in PERMISSION_MODELS
            and not connections[DEFAULT_DB_ALIAS].in_atomic_block)


class ReplicaRouter:
    """DATABASE_ROUTERS entry when DATABASE_REPLICA_URL is set."""

    def db_for_read(self, model, **hints):
        return REPLICA if reads_record_on_replica(model) else DEFAULT_DB_ALIAS

    def db_for_write(self, model, **hints):
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1, obj2, **hints):
        return True  # the same rows, on the primary or its copy

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return db == DEFAULT_DB_ALIAS


def replica_lag_seconds() -> float | None:
    """How far the standby's data is behind the primary's, in seconds: 0
    when it has replayed all it received, else the age of the last
    transaction it replayed. None when it cannot be asked."""
    try:
        with connections[REPLICA].cursor() as cursor:
            cursor.execute(
                "SELECT CASE WHEN NOT pg_is_in_recovery() "
                "OR pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0 "
                "ELSE GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())) END")
            return float(cursor.fetchone()[0] or 0)
    except DatabaseError:
        return None


class ReplicaReadsMiddleware:
    """GET and HEAD under READ_PREFIXES read records on the standby; an API
    answer read there says how far behind it is (`Replica-Lag`, seconds)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method not in ("GET", "HEAD") or not request.path.startswith(READ_PREFIXES):
            return self.get_response(request)
        request.read_on_replica = True
        with reads_on_replica():
            response = self.get_response(request)
        if request.path.startswith("/api/"):
            lag = replica_lag_seconds()
            response["Replica-Lag"] = "unknown" if lag is None else f"{lag:.1f}"
        return response


def replica_status(request) -> dict:
    """Context processor: `replica_lag` (seconds, or None when not behind)
    for a page read on the standby, asked only when the page shows it."""
    def lag():
        if not getattr(request, "read_on_replica", False):
            return None
        seconds = replica_lag_seconds()
        return "unknown" if seconds is None else (round(seconds, 1) if seconds > 0 else None)

    return {"replica_lag": lag}
