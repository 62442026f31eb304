"""Recovery after kill -9: the seconds from killing a worker mid-handler to
its job running again in a worker started right after, with a lease long
enough (300 s) that only the starting worker's takeover (`jobs.holders`)
explains it. Two ways to restart: a worker of the same host with its own
default id, and one under the same stable `--worker-id`."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs.models import Job
from jobs.store import Store

from .common import BENCH_ACTION, ROOT, TENANT_RECOVERY, BenchError, delete_tenants
from .fleet import database_url

LEASE = 300
# The ways a worker restarts, each with the run_worker options it starts with.
RESTARTS = {"same host, default id": (), "same --worker-id": ("--worker-id", f"bench-recovery-{os.getpid()}")}


def recovery_rows(rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Seconds from kill -9 to running again and, of those, until the new
    worker's process had started (its `worker.start` line: Python and
    Django loaded), `rounds` times each way, the ways in turns."""
    seconds: dict[str, list[tuple[float, float]]] = {way: [] for way in RESTARTS}
    for n in range(rounds):
        for way, args in RESTARTS.items():
            seconds[way].append(_killed_and_restarted(f"round-{n}-{len(seconds[way])}-{way}", args))
    return seconds


def _killed_and_restarted(key: str, args: tuple[str, ...]) -> tuple[float, float]:
    Store().enqueue(TENANT_RECOVERY, key, action=BENCH_ACTION, payload={"hold": 60})
    job = Job.objects.filter(tenant=TENANT_RECOVERY, key=key)
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as logs:
        victim = _worker(args, Path(logs) / "victim.log")
        heir = None
        try:
            _until(lambda: job.filter(state="LEASED").exists(), victim, "the victim to claim its job")
            victim.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            victim.wait()
            heir_log = Path(logs) / "heir.log"
            heir = _worker(args, heir_log)
            _until(lambda: b"worker.start" in heir_log.read_bytes(), heir, "the new worker to start")
            started = time.monotonic() - killed
            _until(lambda: job.filter(lease_epoch=2).exists(), heir, "the job to run again")
            return time.monotonic() - killed, started
        finally:
            for proc in (victim, heir):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            delete_tenants([TENANT_RECOVERY])


def _worker(args: tuple[str, ...], log: Path) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_worker", *args, "--action", BENCH_ACTION,
             "--lease-ttl", str(LEASE), "--poll-interval", "0.1"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def _until(predicate, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise BenchError(f"a worker exited (code {proc.returncode}) before {what}")
        time.sleep(0.01)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
