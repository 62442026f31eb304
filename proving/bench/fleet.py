"""The worker processes a bench run starts: N real `manage.py run_worker`
processes on the bench's database (`WorkerFleet`), how they are told where
it is (`database_url`), and waiting until the jobs they were given are done."""

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlencode

from django.db import connection
from django.db.models import Max

from jobs.models import Job
from jobs.states import State

from proving.processes import terminate

from .common import BENCH_ACTION, ROOT, BenchError


class WorkerFleet:
    """N real `manage.py run_worker` processes on this database, as users run
    them (no `--tenant`), restricted to the bench's action, logging to
    temporary files. `args` are extra run_worker options (`--batch N`)."""

    def __init__(self, count: int, *, label: str, poll_interval: float, args: tuple[str, ...] = (),
                 env: dict | None = None):
        self.count = count
        self.env = env or {}
        self.label = label
        self.args = list(args)
        self.poll_interval = poll_interval
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self._read_to: dict[int, int] = {}  # log → bytes of it `finished` has counted
        self._finished = 0
        self._dir = tempfile.TemporaryDirectory(prefix="bench-workers-")

    def __enter__(self) -> "WorkerFleet":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self._dir.cleanup()

    def start(self) -> None:
        env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", **self.env}
        for n in range(self.count):
            log = Path(self._dir.name) / f"worker-{n}.log"
            self.logs.append(log)
            with open(log, "wb") as out:
                self.procs.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), "run_worker",
                     "--worker-id", f"bench-{self.label}-{n}-{os.getpid()}", "--action", BENCH_ACTION,
                     "--concurrency", "1", "--poll-interval", str(self.poll_interval), "--grace", "10",
                     *self.args],
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                ))
        self._wait_idle()

    def _wait_idle(self, timeout: float = 120.0) -> None:
        """Until every worker has started and (PostgreSQL) logged its LISTEN;
        then a moment for the first, empty claim to pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            texts = [log.read_bytes() for log in self.logs]
            started = sum(1 for text in texts if b"worker.start" in text)
            listening = (sum(1 for text in texts if b"worker.listening" in text) >= self.count
                         if connection.vendor == "postgresql" else True)
            if started == self.count and listening:
                time.sleep(0.5)
                return
            time.sleep(0.1)
        raise BenchError(f"{self.count} worker(s) did not become idle within {timeout:.0f} s\n{self.tail()}")

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise BenchError(f"a worker exited early (code {proc.returncode})\n{self.tail()}")

    def peak_rss_mib(self) -> list[float]:
        """Each live worker's high-water resident set size, in MiB (Linux)."""
        peaks = []
        for proc in self.procs:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        return peaks

    def claimed(self) -> list[int]:
        """Jobs each worker claimed, from its log: a `job.claim` line per
        single claim, a `batch.claim jobs=N` line per batch."""
        return [_jobs_logged(log.read_bytes(), "claim") for log in self.logs]

    def finished(self) -> int:
        """Successes the workers have logged so far: a `job.done` line per
        single job, a `batch.done jobs=N` line per batch written. Each log
        is read on from where the previous call stopped (a line still being
        written is read whole next time)."""
        for n, log in enumerate(self.logs):
            offset = self._read_to.get(n, 0)
            try:
                with open(log, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            whole = chunk[:chunk.rfind(b"\n") + 1]
            self._read_to[n] = offset + len(whole)
            self._finished += _jobs_logged(whole, "done")
        return self._finished

    def stop(self) -> None:
        terminate(self.procs)

    def tail(self, lines: int = 15) -> str:
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            out.append(f"--- {log.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


def _jobs_logged(text: bytes, event: str) -> int:
    """Jobs a worker's log lines `text` report for `event` (claim, done): a
    `job.<event>` line per single job, a `batch.<event> jobs=N` line per
    batch."""
    batches = re.findall(rb" batch\." + event.encode() + rb" jobs=(\d+)", text)
    return text.count(b" job." + event.encode() + b" ") + sum(int(n) for n in batches)


def database_url() -> str:
    """A DATABASE_URL naming the database this process is connected to (under
    the test runner that is the test database, not the configured one)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(s['NAME']).resolve()}"
    auth = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = s.get("HOST") or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{auth}@" if auth else "") + host + (f":{s['PORT']}" if s.get("PORT") else "")
    options = {k: v for k, v in (s.get("OPTIONS") or {}).items() if isinstance(v, str | int | float)}
    # Connection reuse changes the figures a lot (see the worker's per-loop
    # close_old_connections): the workers get exactly this process's policy.
    if s.get("CONN_MAX_AGE", 0) != 0:
        options["conn_max_age"] = str(s["CONN_MAX_AGE"])
    if s.get("CONN_HEALTH_CHECKS"):
        options["conn_health_checks"] = "True"
    return f"postgres://{netloc}/{quote(s['NAME'], safe='')}" + (f"?{urlencode(options)}" if options else "")


# ---------------------------------------------------------------- waiting for the jobs


def last_finish():
    """When the last of the bench's jobs finished (its finish event's time,
    which its row's `finished_at` repeats). Read from the job table alone:
    joined to the history, on a fresh cluster whose tables autovacuum had
    not analysed yet, the query is planned as a nested loop reading the
    whole history for each job."""
    return Job.objects.filter(action=BENCH_ACTION, state=State.DONE).aggregate(last=Max("finished_at"))["last"]


def wait_done(expected: int, fleet: WorkerFleet) -> None:
    """Until none of the bench's jobs is READY or LEASED. The database is
    asked once the workers' logs count `expected` successes (`finished`),
    and every 2 s regardless (a job another way ended, a log level that
    hides the lines), not every poll: during a `--batch 100` row each
    question walks the claim index's entries of every job already claimed
    — server CPU taken from the workers' rows and never from the
    reference's, whose processes report their own end. Each state is asked
    alone, where its small partial index answers it (`job_claim_tenant`,
    `job_leased_expiry`): asked together they are a sequential scan of the
    whole table. The run ends at the last finished_at, whenever this
    notices."""
    ready = Job.objects.filter(state=State.READY, action=BENCH_ACTION)
    leased = Job.objects.filter(state=State.LEASED, action=BENCH_ACTION)
    timeout = 120 + expected / 20
    deadline = time.monotonic() + timeout
    ask_at = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if fleet.finished() >= expected or time.monotonic() >= ask_at:
            if not ready.exists() and not leased.exists():
                return
            ask_at = time.monotonic() + 2.0
        fleet.check_alive()
        time.sleep(0.25)
    raise BenchError(f"{ready.count() + leased.count()} of {expected} jobs were not DONE after {timeout:.0f} s\n{fleet.tail()}")
