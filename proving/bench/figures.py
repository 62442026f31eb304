"""What a `manage.py bench` run is asked for (`BenchConfig`) and what it
measured (`Results`): one dataclass per kind of row, each figure as it was
taken, so the table (`report.py`) can give medians, ratios and ranges."""

import statistics
from dataclasses import dataclass, field

from .changelist import ChangelistCase
from .common import percentile
from .peers import PeerEnqueue
from .queues import BulkCase, QueueCase


@dataclass
class BenchConfig:
    jobs: int = 5000
    rows: int = 1_000_000
    processes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    latency_jobs: int = 200
    latency_workers: int = 2
    latency_interval_ms: float = 20.0
    claims: int = 500
    skip_bulk: bool = False
    tenants: list[int] = field(default_factory=lambda: [1000, 10_000])
    batches: list[int] = field(default_factory=lambda: [10, 100])
    batch_jobs: int = 100_000
    claim_tenants: int = 10_000
    repeat: int = 1  # end-to-end rows: pairs of (ours, reference) per row
    queue_rows: int | None = None  # the console queues' section (None: `rows`; 0: skipped)
    queues_only: bool = False  # only that section
    lease_cap: int = 2  # the capped-vs-uncapped rows (JOBS_TENANT_LEASE_CAP; 0: skipped)
    backlog: int = 200_000  # READY jobs in the deep row of claim time vs backlog (0: section skipped)
    peer_jobs: list[int] = field(default_factory=lambda: [3000, 20_000])  # enqueue beside a peer (empty: skipped)


@dataclass
class Throughput:
    """One end-to-end row: `runs` (ours) and `ref_runs` (the raw loop), each
    (seconds, WAL bytes or None); with `--repeat`, the pairs ran one right
    after the other, in turns: ours first, then the raw loop first."""

    processes: int
    jobs: int
    runs: list[tuple[float, int | None]]
    ref_runs: list[tuple[float, int | None]] = field(default_factory=list)
    claimed_by: list[int] = field(default_factory=list)  # jobs per worker process (the last run)
    tenants: int = 1
    batch: int = 1
    lease_cap: int = 0  # JOBS_TENANT_LEASE_CAP of its workers (0: uncapped)
    # Per run (None where it cannot be read): CPU seconds of the clients (our
    # worker processes; the raw loop's processes) and of the rest of the host
    # (the database server when it runs here, and whatever else ran).
    cpu: list[tuple[float, float] | None] = field(default_factory=list)
    ref_cpu: list[tuple[float, float] | None] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return statistics.median(s for s, _ in self.runs)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def ref_seconds(self) -> float | None:
        return statistics.median(s for s, _ in self.ref_runs) if self.ref_runs else None

    @property
    def ref_rate(self) -> float | None:
        return self.jobs / self.ref_seconds if self.ref_runs else None

    @property
    def ratios(self) -> list[float]:
        """ours/raw of each pair: a machine's speed drifts, two runs side by
        side much less."""
        return sorted(ref / ours for (ours, _), (ref, _) in zip(self.runs, self.ref_runs))

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ref_runs else None

    def wal_per_job(self, runs) -> float | None:
        walled = [wal for _, wal in runs if wal is not None]
        return statistics.median(walled) / self.jobs if walled else None

    def cpu_us_per_job(self, cpu) -> tuple[float, float] | None:
        """Median (clients, rest of the host) CPU microseconds per job."""
        read = [c for c in cpu if c is not None]
        if not read:
            return None
        return (statistics.median(c for c, _ in read) * 1e6 / self.jobs,
                statistics.median(r for _, r in read) * 1e6 / self.jobs)


@dataclass
class Latency:
    label: str
    samples_ms: list[float]
    target: bool  # whether the p50 target applies to this row

    def pct(self, p: float) -> float:
        return percentile(self.samples_ms, p)


@dataclass
class ClaimCase:
    label: str
    other_rows: int
    claim_ms: float
    claim_finish_ms: float
    buffers: int | None = None
    load_seconds: float | None = None
    batch: int = 1  # jobs per claim
    # Sorted ratios of this case's claim time to its section's first case's,
    # one per round where the cases ran in turns (empty in the sections that
    # run each case once: the ratio is of the two medians).
    ratios: list[float] = field(default_factory=list)


@dataclass
class Results:
    header: list[str] = field(default_factory=list)
    enqueue: list[tuple[str, int, float, int | None]] = field(default_factory=list)
    enqueue_peers: list[PeerEnqueue] = field(default_factory=list)
    throughput: list[Throughput] = field(default_factory=list)
    latency: list[Latency] = field(default_factory=list)
    latency_workers: int = 0
    latency_interval_ms: float = 0.0
    # Way of restarting → (kill → running again, kill → the new worker started), s
    recovery: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    claims: list[ClaimCase] = field(default_factory=list)
    claim_count: int = 0
    tenant_claims: list[ClaimCase] = field(default_factory=list)
    backlog_claims: list[ClaimCase] = field(default_factory=list)
    backlog_claim_count: int = 0
    rss_mib: dict[str, list[float]] = field(default_factory=dict)  # section -> per-process VmHWM
    changelist: list[ChangelistCase] = field(default_factory=list)
    queues: list[QueueCase] = field(default_factory=list)
    bulk: BulkCase | None = None
    notes: list[str] = field(default_factory=list)
