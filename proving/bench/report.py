"""The plain-text table of a bench run: each figure next to its target
(ok/MISS). Targets are goals, never asserted by a test (DESIGN §12)."""

import statistics

from .changelist import render_changelist
from .claims import BACKLOG_EXPECTED, BACKLOG_STATS_JOBS
from .common import table, verdict
from .figures import ClaimCase, Results, Throughput
from .queues import render_queues
from .recovery import LEASE
from .throughput import CAPPED_TENANTS

# Targets: goals each figure is printed next to (ok/MISS), never asserted by
# a test. End to end, at least 80 % of the raw SKIP LOCKED loop's rate in the
# same run; insert→start p50 under 10 ms with NOTIFY; a claim beside
# `--rows` DONE or WAITING rows at most 1.2× the claim on the table as found;
# each worker's peak RSS under 80 MiB.
TARGET_REFERENCE_SHARE = 0.80
TARGET_P50_MS = 10.0
TARGET_CLAIM_RATIO = 1.2
TARGET_RSS_MIB = 80.0
# A worker killed mid-handler and one started right after: its job runs
# again within 5 s, whatever its lease (300 s in the row).
TARGET_RECOVERY_SECONDS = 5.0
# `Store.enqueue_many` at least as fast as a peer's bulk enqueue (pgqueuer's
# list enqueue), the same jobs in the same run.
TARGET_PEER_ENQUEUE_RATIO = 1.0
# run_worker --batch with 4 processes: at least 10,000 jobs/s. A claim with
# 10,000 tenants holding READY work: at most 2× the claim with one.
TARGET_BATCH_RATE = 10_000.0
TARGET_TENANT_CLAIM_RATIO = 2.0
# Shares of the raw loop: with 10,000 tenants at least 75 %; `--batch 100`
# at least 60 % of the loop claiming 100 at once. WAL per job at most twice
# the raw loop's, every row.
TARGET_MANY_TENANTS = 10_000
TARGET_MANY_TENANTS_SHARE = 0.75
TARGET_BATCH_SHARE = {100: 0.60}
TARGET_WAL_RATIO = 2.0
# Capped claims (JOBS_TENANT_LEASE_CAP) within 2× of uncapped throughput.
TARGET_CAPPED_SHARE = 0.5


def render(results: Results) -> str:
    """The figures as a plain-text table, each next to its target."""
    out = [*results.header, ""]

    if results.enqueue:
        out.append("ENQUEUE")
        out += table(
            ["", "jobs", "seconds", "jobs/s", "WAL B/job"],
            [[label, f"{n:,}", f"{s:.2f}", f"{n / s:,.0f}", _wal_text(wal / n if wal is not None else None)]
             for label, n, s, wal in results.enqueue],
        )
        out.append("")

    if results.enqueue_peers:
        pairs = len(results.enqueue_peers[0].ours)
        out.append(f"ENQUEUE vs PEERS: Store.enqueue_many vs a peer's bulk enqueue; {pairs} round(s) per size, "
                   "in turns (the order reversed every round): median rates, median and range of the rounds' "
                   "ours/peer")
        rows = []
        for peer in results.enqueue_peers:
            ratios = peer.ratios
            ratio = statistics.median(ratios)
            rows.append([f"{peer.jobs:,} jobs vs {peer.peer}", f"{peer.jobs / statistics.median(peer.ours):,.0f}",
                         f"{peer.jobs / statistics.median(peer.theirs):,.0f}",
                         f"{ratio:.2f}×" + (f" ({ratios[0]:.2f}–{ratios[-1]:.2f})" if len(ratios) > 1 else ""),
                         verdict(ratio >= TARGET_PEER_ENQUEUE_RATIO)])
        out += table(["", "ours jobs/s", "peer jobs/s", "ours/peer",
                      f"≥ {TARGET_PEER_ENQUEUE_RATIO:g}×"], rows)
        out.append("")

    if results.throughput:
        jobs = results.throughput[0].jobs
        pairs = len(results.throughput[0].runs)
        out.append(f"END TO END: no-op jobs ({jobs:,} unless said), the default run_worker (no --tenant, "
                   "--concurrency 1) per process, vs a raw psycopg SKIP LOCKED loop in the same run"
                   + (f"; {pairs} pairs of runs per row, side by side, in turns (ours first, then the raw "
                      "loop first): median rates, median and range of the pairs' ours/ref" if pairs > 1 else ""))
        rows = []
        for t in results.throughput:
            ratio = t.ratio
            label = f"{t.processes} process{'es' if t.processes > 1 else ''}"
            if t.tenants > 1:
                label += f", {t.tenants:,} tenants"
            if t.batch > 1:
                label += f", --batch {t.batch}"
            if t.lease_cap:
                label += f", lease cap {t.lease_cap}"
            if t.jobs != jobs:
                label += f" ({t.jobs:,} jobs)"
            wal, ref_wal = t.wal_per_job(t.runs), t.wal_per_job(t.ref_runs)
            rows.append([
                label,
                f"{t.rate:,.0f}", f"{t.seconds:.2f}",
                f"{t.ref_rate:,.0f}" if t.ref_rate else "n/a",
                f"{t.ref_seconds:.2f}" if t.ref_seconds else "n/a",
                (f"{ratio:.0%}" + (f" ({t.ratios[0]:.0%}–{t.ratios[-1]:.0%})" if len(t.ratios) > 1 else ""))
                if ratio else "n/a",
                _share_goal(t),
                _wal_text(wal) + " / " + _wal_text(ref_wal),
                _wal_goal(wal, ref_wal),
                _cpu_text(t.cpu_us_per_job(t.cpu)) + " / " + _cpu_text(t.cpu_us_per_job(t.ref_cpu)),
                "/".join(map(str, t.claimed_by)),
            ])
        out += table(["", "ours jobs/s", "s", "reference jobs/s", "s", "ours/ref", "goal",
                      "WAL B/job ours/ref", f"≤ {TARGET_WAL_RATIO:g}×", "CPU µs/job ours/ref",
                      "jobs per worker"], rows)
        out += _render_cap(results.throughput)
        out.append("")

    if results.latency:
        first = results.latency[0]
        out.append(f"INSERT → START LATENCY: {len(first.samples_ms)} jobs per row, one every "
                   f"{results.latency_interval_ms:g} ms, {results.latency_workers} idle workers; the enqueue event "
                   "vs the first attempt's claimed_at, database clock")
        rows = []
        for lat in results.latency:
            p50 = lat.pct(50)
            rows.append([lat.label, str(len(lat.samples_ms)), f"{p50:.1f}", f"{lat.pct(95):.1f}",
                         f"{lat.pct(99):.1f}", f"{max(lat.samples_ms, default=float('nan')):.1f}",
                         verdict(p50 < TARGET_P50_MS) if lat.target else "(fallback)"])
        out += table(["", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", f"p50 < {TARGET_P50_MS:.0f} ms"], rows)
        out.append("")

    if results.recovery:
        out.append(f"RECOVERY AFTER KILL -9: seconds from kill -9 of a worker mid-handler (lease {LEASE} s) to its "
                   "job leased again by a worker started right after; of those, until the new process had "
                   "started (Python and Django loaded, its worker.start line)")
        rows = []
        for way, runs in results.recovery.items():
            again = [total for total, _ in runs]
            rows.append([way, str(len(runs)), f"{statistics.median(again):.2f}", f"{min(again):.2f}",
                         f"{max(again):.2f}", f"{statistics.median(started for _, started in runs):.2f}",
                         verdict(max(again) <= TARGET_RECOVERY_SECONDS)])
        out += table(["", "n", "median s", "min s", "max s", "process start s", f"≤ {TARGET_RECOVERY_SECONDS:g} s"],
                     rows)
        out.append("")

    if results.tenant_claims:
        rounds = len(results.tenant_claims[-1].ratios)
        out.append(f"CLAIM TIME VS TENANTS: median of {results.claim_count} default claims (no tenant filter) "
                   "right after the jobs were loaded"
                   + (f"; {rounds} rounds in turns, each case's median of theirs, and the median (range) of "
                      "the rounds' ratios" if rounds > 1 else ""))
        rows = [[case.label, *_claim_cells(case, results.tenant_claims[0], TARGET_TENANT_CLAIM_RATIO)]
                for case in results.tenant_claims]
        out += table(["", "claim ms", "claim+finish ms", "vs first", f"≤ {TARGET_TENANT_CLAIM_RATIO:g}×",
                      "buffers/claim"], rows)
        out.append("")

    if results.claims:
        out.append(f"CLAIM TIME VS TABLE SIZE: median of {results.claim_count} default claims of one job on a "
                   "small READY set (then its finish)")
        rows = [[case.label, f"{case.other_rows:,}", *_claim_cells(case, results.claims[0], TARGET_CLAIM_RATIO),
                 _load_text(case)] for case in results.claims]
        out += table(["", "other rows", "claim ms", "claim+finish ms", "vs first",
                      f"≤ {TARGET_CLAIM_RATIO}×", "buffers/claim", "load s"], rows)
        out.append("")

    if results.backlog_claims:
        out.append(f"CLAIM TIME VS BACKLOG: median of {results.backlog_claim_count} default claims (then their "
                   f"finish) from one tenant's READY jobs, with planner statistics taken while many tenants held "
                   f"{BACKLOG_STATS_JOBS} READY jobs each: for any tenant they expect about {BACKLOG_EXPECTED}, fewer "
                   "than a batch")
        # (Each against the shallow claim of as many jobs.)
        rows = [[case.label, *_claim_cells(case, next(c for c in results.backlog_claims if c.batch == case.batch),
                                           TARGET_CLAIM_RATIO), _load_text(case)]
                for case in results.backlog_claims]
        out += table(["", "claim ms", "claim+finish ms", "vs shallow", f"≤ {TARGET_CLAIM_RATIO}×",
                      "buffers/claim", "load s"], rows)
        out.append("")

    if results.rss_mib:
        out.append("PEAK RSS PER WORKER PROCESS (VmHWM of each run_worker, read before it stops)")
        rows = []
        for section, peaks in results.rss_mib.items():
            if peaks:
                rows.append([section, str(len(peaks)), f"{statistics.median(peaks):.1f}", f"{max(peaks):.1f}",
                             verdict(max(peaks) < TARGET_RSS_MIB)])
            else:
                rows.append([section, "0", "n/a", "n/a", "n/a (no /proc)"])
        out += table(["", "processes", "median MiB", "max MiB", f"< {TARGET_RSS_MIB:.0f} MiB"], rows)
        out.append("")

    out += render_changelist(results.changelist)
    out += render_queues(results.queues, results.bulk)

    out += results.notes
    out.append("How: workers are real `manage.py run_worker` processes, idle (and LISTENing) before the clock "
               "starts; end to end runs from the commit of the whole batch to the last finished_at, on the "
               "database clock.")
    if any(t.ref_seconds for t in results.throughput):
        out.append("Reference: table bench_reference_jobs, per job one claim transaction (SKIP LOCKED) and one "
                   "fenced finish transaction (batched rows: N claimed in one, N finished in one); no history, "
                   "no tenant fairness, no framework. Ours also writes history per job (the enqueue before the "
                   "clock starts; during the run one row per attempt, written with its finish and carrying its "
                   "claim), keeps eleven indexes of jobs_job (the raw table has two; a no-op job's claim writes "
                   "entries in two of them, its finish in two, its history row in one; its key is unique in its "
                   "search row, written once at enqueue) and serves the least-loaded tenant first. "
                   "WAL B/job: PostgreSQL's WAL bytes written "
                   "during the run per job, by everyone (median of the runs).")
    if results.throughput:
        out.append("CPU µs/job: CPU time per job during the run (median of the runs) of the clients (ours: "
                   "the run_worker processes, all their threads; the reference: its loop processes) + the rest "
                   "of the host (the database server when it runs on this host, and anything else that ran), "
                   "from /proc (n/a elsewhere). On a host with fewer CPUs than processes, the row's rate "
                   "follows the sum.")
    return "\n".join(out).rstrip() + "\n"


def _share_goal(t: Throughput) -> str:
    """The row's goals, each with its verdict: its share of the raw loop
    (80 %; 75 % with 10,000 tenants or more; 60 % for `--batch 100`) and,
    batched, its rate. A capped row's goal is its share of the uncapped
    one, printed under the table."""
    if t.lease_cap:
        return "(below)"
    goals = []
    if t.batch > 1:
        share = TARGET_BATCH_SHARE.get(t.batch)
    else:
        share = TARGET_MANY_TENANTS_SHARE if t.tenants >= TARGET_MANY_TENANTS else TARGET_REFERENCE_SHARE
    if share is not None:
        goals.append(f"{verdict(t.ratio >= share) if t.ratio else 'n/a'} (≥ {share:.0%})")
    if t.batch > 1:
        goals.append(f"{verdict(t.rate >= TARGET_BATCH_RATE)} (≥ {TARGET_BATCH_RATE:,.0f}/s)")
    return "; ".join(goals)


def _wal_goal(ours: float | None, ref: float | None) -> str:
    """Ours WAL per job over the raw loop's, against TARGET_WAL_RATIO."""
    if not ours or not ref:
        return "n/a"
    return f"{ours / ref:.2f}× {verdict(ours / ref <= TARGET_WAL_RATIO)}"


def _render_cap(throughput: list[Throughput]) -> list[str]:
    """Capped against uncapped throughput over the same tenants, when both ran."""
    uncapped = [t for t in throughput if t.tenants == CAPPED_TENANTS and not t.lease_cap and t.batch == 1]
    capped = [t for t in throughput if t.tenants == CAPPED_TENANTS and t.lease_cap]
    if not (uncapped and capped):
        return []
    share = capped[-1].rate / uncapped[-1].rate
    return [f"Lease cap {capped[-1].lease_cap} over {CAPPED_TENANTS} tenants: {capped[-1].rate:,.0f} jobs/s against "
            f"{uncapped[-1].rate:,.0f} uncapped, {share:.0%} of it ({verdict(share >= TARGET_CAPPED_SHARE)}: "
            f"within 2×, ≥ {TARGET_CAPPED_SHARE:.0%})"]


def _claim_cells(case: ClaimCase, base: ClaimCase, target: float) -> list[str]:
    """A claim row's figures against its section's `base` case: claim ms,
    claim+finish ms, the ratio (the median of its rounds' ratios, with their
    range when there were several), its verdict (none for the base itself)
    and the buffers."""
    ratio = statistics.median(case.ratios) if case.ratios else case.claim_ms / base.claim_ms
    spread = f" ({case.ratios[0]:.2f}–{case.ratios[-1]:.2f}×)" if len(case.ratios) > 1 else ""
    return [f"{case.claim_ms:.2f}", f"{case.claim_finish_ms:.2f}", f"{ratio:.2f}×{spread}",
            "" if case is base else verdict(ratio <= target),
            f"{case.buffers:,}" if case.buffers is not None else "n/a"]


def _load_text(case: ClaimCase) -> str:
    return f"{case.load_seconds:.1f}" if case.load_seconds is not None else ""


def _wal_text(per_job: float | None) -> str:
    return f"{per_job:,.0f}" if per_job is not None else "n/a"


def _cpu_text(per_job: tuple[float, float] | None) -> str:
    """Clients' CPU µs per job + the rest of the host's, in whole µs (a
    batched job costs only tens of them: milliseconds would hide the split)."""
    return f"{per_job[0]:,.0f}+{per_job[1]:,.0f}" if per_job is not None else "n/a"
