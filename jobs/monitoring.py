"""`/metrics`, `/healthz` and `/readyz` (DESIGN §13). Thin views: the
figures come from `jobs.health` and `jobs.metrics`.

- `GET /healthz` — liveness: the process answers and the database answers a
  query. 200 `{"status": "ok"}` or 503 `{"status": "unavailable"}`.
- `GET /readyz` — readiness: migrations are applied and the lags are under
  their thresholds (`READYZ_MAX_OUTBOX_LAG_SECONDS`,
  `READYZ_MAX_READY_AGE_SECONDS`, `READYZ_MAX_TIMER_OVERDUE_SECONDS`). 200
  `{"status": "ready"}` or 503 `{"status": "not ready"}`.

  Probes are anonymous, so an anonymous answer says ok or not ok and nothing
  else: a database error names roles and hosts, lags describe the business.
  The reasons (`reason` / `reasons`) are added for `Authorization: Bearer
  $METRICS_TOKEN` or a staff session.
- `GET /metrics` — Prometheus text; a staff session that sees every tenant (a superuser) or
  `Authorization: Bearer $METRICS_TOKEN`, else 403 (401 with a wrong token).
"""

import hmac

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import health
from .access import request_scope
from .metrics import metrics_registry

_migrated = False  # once true in this process it stays true (a deploy restarts it)


def _migrations_applied() -> bool:
    global _migrated
    if not _migrated:
        executor = MigrationExecutor(connection)
        _migrated = not executor.migration_plan(executor.loader.graph.leaf_nodes())
    return _migrated


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return _probe_answer(request, {"status": "unavailable"}, {"reason": f"database: {str(exc)[:200]}"},
                             status=503)
    return JsonResponse({"status": "ok"})


def readiness_problems() -> list[str]:
    """Why this deployment should not take traffic (empty: ready)."""
    if not _migrations_applied():
        return ["migrations are not all applied"]
    problems = []
    outbox_lag = health.outbox_health().oldest_pending_age_seconds or 0.0
    if outbox_lag > settings.READYZ_MAX_OUTBOX_LAG_SECONDS:
        problems.append(f"outbox lag {outbox_lag:.0f}s > {settings.READYZ_MAX_OUTBOX_LAG_SECONDS:g}s")
    ready_age = health.oldest_ready_age_seconds() or 0.0
    if ready_age > settings.READYZ_MAX_READY_AGE_SECONDS:
        problems.append(f"oldest READY job waits {ready_age:.0f}s > {settings.READYZ_MAX_READY_AGE_SECONDS:g}s")
    overdue = health.timer_health().oldest_overdue_seconds or 0.0
    if overdue > settings.READYZ_MAX_TIMER_OVERDUE_SECONDS:
        problems.append(f"a timer is {overdue:.0f}s overdue > {settings.READYZ_MAX_TIMER_OVERDUE_SECONDS:g}s")
    return problems


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    try:
        problems = readiness_problems()
    except DatabaseError as exc:
        problems = [f"database: {str(exc)[:200]}"]
    if problems:
        return _probe_answer(request, {"status": "not ready"}, {"reasons": problems}, status=503)
    return JsonResponse({"status": "ready"})


def _probe_answer(request: HttpRequest, answer: dict, details: dict, *, status: int) -> JsonResponse:
    """`answer`, plus `details` for those who may read them: the metrics
    token, or a staff session. With the database down the session cannot be
    read, so only the token shows why."""
    if _bearer_ok(request) or _staff_session(request):
        answer = {**answer, **details}
    return JsonResponse(answer, status=status)


def _staff_session(request: HttpRequest) -> bool:
    try:
        return bool(request.user.is_authenticated and request.user.is_staff)
    except DatabaseError:  # the session and the user live in the database that failed
        return False


def _bearer_ok(request: HttpRequest) -> bool | None:
    """True/False for a presented bearer token, None when none is presented."""
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return None
    token = settings.METRICS_TOKEN
    return bool(token) and hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    bearer = _bearer_ok(request)
    if bearer is False:
        return JsonResponse({"error": "invalid bearer token"}, status=401)
    if bearer is None and not (request.user.is_authenticated and request.user.is_staff):
        return JsonResponse({"error": "a staff session or Authorization: Bearer $METRICS_TOKEN is required"},
                            status=403)
    if bearer is None and not request_scope(request).everything:
        # The figures are labelled by tenant, for every tenant: a session
        # scoped to some tenants (DESIGN §14) must not read the others'.
        return JsonResponse({"error": "the metrics cover every tenant: a session that sees all tenants "
                             "(a superuser) or Authorization: Bearer $METRICS_TOKEN is required"}, status=403)
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
