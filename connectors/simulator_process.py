"""Start the provider simulator as a real subprocess, and stop it.

For tests and tools (the chaos runner) that need the outside world to be a
separate process: one that can be killed, restarted on the same storage, and
asked what it accepted. It runs ``python -m connectors.simulator``, so no
Django start-up is paid.

    with running_simulator(mode="lookup", db_path=tmp / "sim.sqlite3", stall_after_accept=1) as sim:
        connector = build_http_connector("sim-lookup", base_url=sim.url)
        ...
        assert len(sim.messages()) == 1
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.simulator import PROJECT_ROOT

_LISTENING = re.compile(r"^provider-simulator listening on (?P<url>http://\S+) ")


class SimulatorStartError(RuntimeError):
    """The simulator process did not come up; the message carries its log."""


@dataclass
class SimulatorHandle:
    """A running simulator subprocess.

    ``url`` is its base URL, ``db_path`` its storage (reuse it to restart on
    the same state), ``log_path`` where its stderr goes.
    """

    url: str
    process: subprocess.Popen
    db_path: Path
    log_path: Path
    _cleanup_dir: Path | None = field(default=None, repr=False)

    def messages(self) -> list[dict[str, Any]]:
        """Every message the simulator accepted (``GET /v1/messages``)."""
        with urllib.request.urlopen(f"{self.url}/v1/messages", timeout=5) as response:
            return json.load(response)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode

    def kill(self) -> int:
        """SIGKILL without ceremony (a crash); returns the exit status."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def simulator_command(
    *,
    mode: str = "idempotent",
    db_path: Path,
    port: int = 0,
    host: str = "127.0.0.1",
    stall_after_accept: float | None = None,
    stall_probability: float | None = None,
    error_rate: float | None = None,
    throttle_rate: float | None = None,
    retry_after: int | None = None,
    reject_auth: bool = False,
    seed: int | None = None,
    quiet: bool = False,
    lookup_fault: str = "",
    lookup_stall: float | None = None,
    lookup_ignores_reference: bool = False,
) -> list[str]:
    """The argv that starts a simulator with these options."""
    command = [
        sys.executable,
        "-m",
        "connectors.simulator",
        "--mode",
        mode,
        "--db",
        str(db_path),
        "--port",
        str(port),
        "--host",
        host,
    ]
    numeric = {
        "--stall-after-accept": stall_after_accept,
        "--stall-probability": stall_probability,
        "--error-rate": error_rate,
        "--throttle-rate": throttle_rate,
        "--retry-after": retry_after,
        "--seed": seed,
        "--lookup-stall": lookup_stall,
    }
    for option, value in numeric.items():
        if value is not None:
            command += [option, str(value)]
    if reject_auth:
        command.append("--reject-auth")
    if lookup_fault:
        command += ["--lookup-fault", str(lookup_fault)]
    if lookup_ignores_reference:
        command.append("--lookup-ignores-reference")
    if quiet:
        command.append("--quiet")
    return command


def start_simulator(
    *,
    mode: str = "idempotent",
    db_path: Path | str | None = None,
    log_path: Path | str | None = None,
    startup_timeout: float = 10.0,
    **options: Any,
) -> SimulatorHandle:
    """Launch a simulator on a free port and wait until ``/health`` answers.

    ``options`` are ``simulator_command`` keywords (``stall_after_accept``,
    ``error_rate``, ``throttle_rate``, ``reject_auth``, ``seed``, ...).
    Without ``db_path`` a temporary directory is used and removed by
    ``running_simulator``. Raises ``SimulatorStartError`` (with the process
    log) when it does not come up within ``startup_timeout`` seconds.
    """
    cleanup_dir = None
    if db_path is None:
        cleanup_dir = Path(tempfile.mkdtemp(prefix="provider-simulator-"))
        db_path = cleanup_dir / "provider-simulator.sqlite3"
    db_path = Path(db_path).resolve()
    db_path.parent.mkdir(parents=True, exist_ok=True)
    log_path = Path(log_path) if log_path is not None else db_path.with_suffix(".log")

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    # stderr goes to a file, never a pipe: nobody drains a pipe during a test,
    # and a full pipe would freeze the simulator mid-run.
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            simulator_command(mode=mode, db_path=db_path, **options),
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )

    def fail(reason: str) -> SimulatorStartError:
        if process.poll() is None:
            process.kill()
        process.wait()
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        if cleanup_dir is not None:
            shutil.rmtree(cleanup_dir, ignore_errors=True)
        return SimulatorStartError(f"{reason}\n--- simulator log ({log_path}) ---\n{log}")

    deadline = time.monotonic() + startup_timeout
    first_line = _read_line(process, timeout=startup_timeout)
    match = _LISTENING.match(first_line or "")
    if match is None:
        raise fail(f"simulator did not announce its address (first line: {first_line!r})")
    url = match.group("url")
    while not _healthy(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise fail(f"simulator at {url} did not become healthy")
        time.sleep(0.02)
    return SimulatorHandle(url=url, process=process, db_path=db_path, log_path=log_path, _cleanup_dir=cleanup_dir)


@contextmanager
def running_simulator(
    mode: str = "idempotent",
    db_path: Path | str | None = None,
    **options: Any,
) -> Iterator[SimulatorHandle]:
    """A simulator subprocess for the duration of a ``with`` block.

    Accepts ``start_simulator``'s options. On exit the process is terminated
    (SIGTERM, then SIGKILL) and a temporary storage directory is removed; a
    ``db_path`` you gave is kept so a later simulator can reopen it.
    """
    handle = start_simulator(mode=mode, db_path=db_path, **options)
    try:
        yield handle
    finally:
        handle.stop()
        if handle._cleanup_dir is not None:
            shutil.rmtree(handle._cleanup_dir, ignore_errors=True)


def _read_line(process: subprocess.Popen, *, timeout: float) -> str | None:
    # readline() blocks with no timeout of its own, hence the helper thread.
    lines: queue.Queue[str] = queue.Queue(maxsize=1)
    reader = threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True)
    reader.start()
    try:
        return lines.get(timeout=timeout).strip()
    except queue.Empty:
        return None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
