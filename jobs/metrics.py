"""Prometheus metrics (DESIGN §13), with `prometheus-client` — no hand-written
exposition.

Two sources, exported in two places:

- **The database's view** (`GET /metrics` on the web process): a custom
  collector that reads, at scrape time, a handful of bounded queries, each
  served by a partial or leading-column index whose size follows the live
  backlog — never the DONE history (jobs by state and tenant for the live
  states, the oldest eligible READY job, expired leases, the families other
  apps register (external calls still in doubt, say), the outbox lag and quarantine, overdue
  timers). Every web process answers the same, so any one may be scraped.
- **Each worker's own counters** (`run_worker --metrics-port PORT`): jobs by
  outcome and a handler-duration histogram per action, served by the worker
  on its own port (one scrape target per worker process; no shared
  multi-process directory to manage).
"""

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import health

# ---------------------------------------------------------------- the database's view

# Other apps add families without the engine importing them.
_families: dict[str, Callable[[], Iterable[GaugeMetricFamily]]] = {}


def metric_families(name: str):
    """Register a function yielding metric families for /metrics."""

    def register(fn):
        _families[name] = fn
        return fn

    return register


class DurableCollector(Collector):
    """Reads the figures at scrape time (see the module docstring)."""

    def collect(self):
        jobs = GaugeMetricFamily("durable_jobs", "Jobs in each live state, per tenant (DONE and CANCELLED are "
                                 "history; see durable_worker_jobs_total).", labels=["state", "tenant"])
        for (state, tenant), n in sorted(health.live_job_counts().items()):
            jobs.add_metric([state, tenant], n)
        yield jobs
        yield GaugeMetricFamily("durable_oldest_ready_age_seconds",
                                "How long the longest-waiting eligible READY job has been eligible.",
                                value=health.oldest_ready_age_seconds() or 0.0)
        yield GaugeMetricFamily("durable_leases_expired", "LEASED jobs whose lease ran out, not yet recovered.",
                                value=health.leases_expired())
        outbox = health.outbox_health()
        yield GaugeMetricFamily("durable_outbox_oldest_unpublished_age_seconds",
                                "Age of the oldest PENDING outbox event.",
                                value=outbox.oldest_pending_age_seconds or 0.0)
        yield GaugeMetricFamily("durable_outbox_pending", "Outbox events not yet published.", value=outbox.pending)
        yield GaugeMetricFamily("durable_outbox_quarantined", "Outbox events the relay gave up on.",
                                value=outbox.quarantined)
        timers = health.timer_health()
        yield GaugeMetricFamily("durable_timers_overdue", "PENDING timers past their time.", value=timers.overdue)
        yield GaugeMetricFamily("durable_timers_oldest_overdue_seconds", "How late the most overdue timer is.",
                                value=timers.oldest_overdue_seconds or 0.0)
        inbound = health.inbound_health()
        yield GaugeMetricFamily("durable_inbound_unmatched", "Inbound events kept for an operator.",
                                value=inbound.unmatched)
        for families in list(_families.values()):
            yield from families()


def metrics_registry() -> CollectorRegistry:
    """A registry holding only the database collector (a new one per call:
    nothing process-global is exposed by accident)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DurableCollector())
    return registry


# ---------------------------------------------------------------- each worker's counters

WORKER_REGISTRY = CollectorRegistry()
WORKER_JOBS = Counter("durable_worker_jobs", "Jobs handled by this worker, by outcome "
                      "(claimed, done, retried, waiting, review, attention, lost, recovered, unrecorded, released, "
                      "task_errors, slot_errors).",
                      ["outcome"], registry=WORKER_REGISTRY)
HANDLER_DURATION = Histogram("durable_handler_duration_seconds", "Time a handler ran, per action.", ["action"],
                             buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                             registry=WORKER_REGISTRY)


def worker_metrics_serve(port: int, addr: str = "0.0.0.0"):
    """Serve this process's worker counters on `port` (a daemon thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=addr, registry=WORKER_REGISTRY)
