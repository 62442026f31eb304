"""The agent gateway's figures (`manage.py bench_gateway`):

1. Proposal API latency (p50, p99) and requests per second with concurrent
   clients, against a real server started here on 127.0.0.1 on a free port
   — the production server (`durable.server`: uvicorn serving durable.asgi)
   or `manage.py runserver` (threaded), in turns — or against one already
   running on this database (`--url`, e.g. another WSGI or ASGI server to
   compare). Each client is a thread with its own keep-alive connection
   and its own agent; each POST a new proposal (auth, validation, the
   agent's row lock and limit counts, proposal_submit, the job), in turns
   with the reference on the same server — a minimal django-ninja POST
   inserting one row (`proving.bench_reference`, served only under
   `durable.settings_bench`) — and the proposal POST's cost as a multiple
   of the reference's; then the same for GET of a proposal.
2. The cost of a limit check with `--operations` (default 1,000,000)
   operations in the table: the effect limit's count (`operations.limits.
   effects_in_window`) and the proposal limit's, each with its EXPLAIN and
   its mean time over repeated calls.

It touches only its own tenant `bench-gateway` and removes its rows after.
"""

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from django.db import connection, transaction
from django.utils import timezone

from company.models import Proposal, Tenant
from company.services import tenant_ensure
from durable.net import free_port
from durable.server import server_listening, server_start, server_stop
from gateway.models import Agent, AgentProposal
from gateway.services import agent_create, proposal_limit_refusal
from jobs.models import Job
from operations.limits import window_full_since
from operations.models import ActionLimit, Operation

from ..bench_reference import REFERENCE_PATH
from ..models import BenchRow
from .common import ROOT, delete_tenants, percentile, table
from .fleet import database_url

TENANT = "bench-gateway"
ACTION = "connectors.send_email"
EMAIL = {"to": "bench@example.com", "subject": "Bench", "body": "A proposal of the benchmark."}


@dataclass
class ApiFigures:
    what: str
    clients: int
    requests: int
    p50_ms: float
    p99_ms: float
    per_second: float
    statuses: dict


SERVERS = ("asgi", "runserver")


BENCH_SETTINGS = "durable.settings_bench"


class Server:
    """A server on 127.0.0.1 on this database: `asgi`, the production
    server (durable.server), or `runserver --noreload`, with the site's
    settings plus the reference endpoint (`BENCH_SETTINGS`)."""

    def __init__(self, kind: str):
        self.port = free_port()
        env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1",
               "DJANGO_SETTINGS_MODULE": BENCH_SETTINGS}
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        if kind == "asgi":
            self.process = server_start(port=self.port, env=env, **quiet)
            return
        self.process = server_listening(subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runserver", "--noreload", f"127.0.0.1:{self.port}"],
            cwd=ROOT, env=env, **quiet), self.port)

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def stop(self):
        server_stop(self.process)


class Running:
    """A server someone else started (`--url`), on this database."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.address = parts.hostname or "127.0.0.1", parts.port or 80

    def stop(self):
        pass


Request = tuple[str, str, bytes | None]


def _client_run(address: tuple[str, int], key: str, requests: list[Request], latencies: list, statuses: dict,
                lock: threading.Lock, start: threading.Event):
    conn = http.client.HTTPConnection(*address, timeout=30)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    start.wait()
    for method, path, body in requests:
        began = time.perf_counter()
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        elapsed = (time.perf_counter() - began) * 1000
        with lock:
            latencies.append(elapsed)
            statuses[response.status] = statuses.get(response.status, 0) + 1
    conn.close()


@dataclass
class _Sample:
    latencies: list
    statuses: dict
    seconds: float = 0.0


def _sample(address: tuple[str, int], per_client: list[tuple[str, list[Request]]], into: _Sample | None = None) -> _Sample:
    """Each client (its key, its requests) a thread with its own connection,
    all started together; added to `into` when given (one figure of turns)."""
    into = into or _Sample([], {})
    lock, start = threading.Lock(), threading.Event()
    threads = [threading.Thread(target=_client_run, args=(address, key, requests, into.latencies, into.statuses,
                                                          lock, start))
               for key, requests in per_client]
    for t in threads:
        t.start()
    began = time.perf_counter()
    start.set()
    for t in threads:
        t.join()
    into.seconds += time.perf_counter() - began
    return into


def _figures(what: str, clients: int, sample: _Sample) -> ApiFigures:
    latencies = sample.latencies
    return ApiFigures(what, clients, len(latencies), percentile(latencies, 50), percentile(latencies, 99),
                      len(latencies) / sample.seconds, sample.statuses)


PROPOSAL_POST = "POST /api/v1/proposals (new)"
REFERENCE_POST = "reference: ninja POST, one row"


def api_figures(*, clients: int, requests: int, run: str, server: str = "asgi", url: str = "",
                turns: int = 3) -> list[ApiFigures]:
    """With `clients` concurrent clients, `requests` each: new proposals and
    the reference POST (a minimal django-ninja endpoint inserting one row,
    `proving.bench_reference`) in `turns` alternating rounds, then GETs of the
    proposals and the same POSTs again — against `server` started here, or
    the one running at `url` (serving `durable.settings_bench`). Each client
    is its own agent, so no agent's row lock serialises the posts."""
    tenant = tenant_ensure(slug=TENANT)
    keys = [agent_create(tenant=tenant, name=f"bench-{run}-{c}", actor="bench", proposals_per_minute=10**9,
                         proposals_per_day=10**9)[1].key for c in range(clients)]
    target = Running(url) if url else Server(server)
    try:
        # Warm-up: the server's first requests import and connect.
        _sample(target.address, [(keys[0], [("GET", "/api/v1/actions", None)] * 5)])

        def post(c: int, n: int) -> Request:
            body = {"action": ACTION, "key": f"bench-{run}-{c}-{n}", "rationale": "benchmark", "payload": EMAIL}
            return ("POST", "/api/v1/proposals", json.dumps(body).encode())

        def reference(c: int, n: int) -> Request:
            return ("POST", REFERENCE_PATH, json.dumps({"name": f"bench-{run}-{c}-{n}"}).encode())

        posts, references = _Sample([], {}), _Sample([], {})
        for turn in range(turns):
            numbers = range(turn * requests // turns, (turn + 1) * requests // turns)
            _sample(target.address, [(keys[c], [post(c, n) for n in numbers]) for c in range(clients)], posts)
            _sample(target.address, [(keys[c], [reference(c, n) for n in numbers]) for c in range(clients)],
                    references)
        gets = _sample(target.address, [(keys[c], [("GET", f"/api/v1/proposals/bench-{run}-{c}-{n}", None)
                                                   for n in range(requests)]) for c in range(clients)])
        repeats = _sample(target.address, [(keys[c], [post(c, n) for n in range(requests)]) for c in range(clients)])
    finally:
        target.stop()
    return [_figures(PROPOSAL_POST, clients, posts), _figures(REFERENCE_POST, clients, references),
            _figures("GET /api/v1/proposals/{key}", clients, gets),
            _figures("POST again (idempotent, 200)", clients, repeats)]


def cost_ratio(figures: list[ApiFigures]) -> str:
    """The proposal POST's cost as a multiple of the reference POST's."""
    by = {f.what: f for f in figures}
    posts, reference = by[PROPOSAL_POST], by[REFERENCE_POST]
    return (f"proposal POST ÷ reference POST: p50 {posts.p50_ms / reference.p50_ms:.2f}×, "
            f"p99 {posts.p99_ms / reference.p99_ms:.2f}×, time per request (1 ÷ req/s) "
            f"{reference.per_second / posts.per_second:.2f}×")


# ---------------------------------------------------------------- the limit checks


def _bulk_operations(job_id: int, rows: int) -> None:
    """`rows` operations of the bench tenant, spread over the last 30 days."""
    table_name = Operation._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"""INSERT INTO {table_name} (id, tenant, job_id, step, provider, kind, action, request_digest,
                        request, state, attempts, last_dispatched_at, last_error, created_at, updated_at, intent_key)
                    SELECT gen_random_uuid(), %s, %s, 's' || g, 'sim-idempotent', 'email.send',
                        CASE WHEN g %% 2 = 0 THEN %s ELSE 'company.send_quote' END, '', '{{}}', 'ACCEPTED', 1,
                        now(), '', now() - (g %% 2592000) * interval '1 second', now(), 'bench-' || g
                    FROM generate_series(1, %s) AS g""", [TENANT, job_id, ACTION, rows])
            cursor.execute(f"ANALYZE {table_name}")
        else:
            cursor.execute(
                f"""WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s)
                    INSERT INTO {table_name} (id, tenant, job_id, step, provider, kind, action, request_digest,
                        request, state, attempts, last_dispatched_at, last_error, created_at, updated_at, intent_key)
                    SELECT lower(hex(randomblob(16))), %s, %s, 's' || n, 'sim-idempotent', 'email.send',
                        CASE WHEN n %% 2 = 0 THEN %s ELSE 'company.send_quote' END, '', '{{}}', 'ACCEPTED', 1,
                        datetime('now'), '', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || (n %% 2592000) || ' seconds'),
                        datetime('now'), 'bench-' || n
                    FROM g""", [rows, TENANT, job_id, ACTION])


def _explain(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    prefix = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)" if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN"
    with connection.cursor() as cursor:
        cursor.execute(f"{prefix} {sql}", params)
        return "\n".join("    " + " ".join(str(c) for c in row) for row in cursor.fetchall())


def _mean_ms(call, repeat: int) -> float:
    began = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - began) * 1000 / repeat


def limit_figures(*, operations: int, repeat: int, progress) -> list[str]:
    from jobs.store import Store

    job = Store().enqueue(TENANT, "bench-gateway-ops", action=ACTION, payload=EMAIL)
    progress(f"loading {operations:,} operations …")
    began = time.perf_counter()
    _bulk_operations(job.pk, operations)
    progress(f"loaded in {time.perf_counter() - began:.1f} s")
    lines = [f"Limit checks with {Operation.objects.filter(tenant=TENANT).count():,} operations of the tenant "
             f"({Operation.objects.count():,} in the table), {repeat} calls each:"]
    now = timezone.now()
    rows = []
    for limit_value in (100, 1000, 10000):
        limit = ActionLimit(tenant=TENANT, action=ACTION, max_effects=limit_value, window_seconds=86400)
        full = window_full_since(limit, now=now) is not None
        rows.append([f"effect limit {limit_value:,}/24 h", "full" if full else "room",
                     f"{_mean_ms(lambda: window_full_since(limit, now=now), repeat):.3f}"])
    agent = Agent.objects.filter(tenant__slug=TENANT).first()
    rows.append(["proposal limits (minute + day)", "—", f"{_mean_ms(lambda: proposal_limit_refusal(agent, now), repeat):.3f}"])
    lines += table(["check", "window", "mean ms"], rows)
    limit = ActionLimit(tenant=TENANT, action=ACTION, max_effects=1000, window_seconds=86400)
    since = now - timedelta(seconds=limit.window_seconds)
    query = (Operation.objects.filter(tenant=TENANT, action=ACTION, created_at__gt=since)
             .order_by("-created_at").values_list("created_at", flat=True)[999:1000])
    lines += ["", "  EXPLAIN of the effect limit's count (1,000/24 h):", _explain(query)]
    return lines


def cleanup() -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {Operation._meta.db_table} WHERE tenant = %s", [TENANT])
    AgentProposal.objects.filter(tenant=TENANT).delete()
    Agent.objects.filter(tenant__slug=TENANT).delete()
    Proposal.objects.filter(tenant__slug=TENANT).delete()
    delete_tenants([TENANT])
    Tenant.objects.filter(slug=TENANT).delete()
    BenchRow.objects.all().delete()
    assert not Job.objects.filter(tenant=TENANT).exists()


def render_api(figures: list[ApiFigures]) -> list[str]:
    return table(["request", "clients", "requests", "p50 ms", "p99 ms", "req/s", "statuses"],
                 [[f.what, f.clients, f.requests, f"{f.p50_ms:.1f}", f"{f.p99_ms:.1f}", f"{f.per_second:.0f}",
                   " ".join(f"{k}×{v}" for k, v in sorted(f.statuses.items()))] for f in figures])
