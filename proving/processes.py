"""The processes a tool starts: `manage.py` commands run to their end, and
stopping worker fleets."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def terminate(processes, *, timeout: float = 20.0) -> None:
    """SIGTERM every process still running, then wait for each up to
    `timeout` seconds (a worker finishes its running jobs within its grace
    period); one that has not exited by then is SIGKILLed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def manage(*args: str, env: dict, timeout: float = 300) -> str:
    """Run `manage.py` with `args` in a process of its own whose environment
    is ours updated with `env` (a DATABASE_URL of its own, say); returns its
    output, or raises RuntimeError with the end of it when it fails."""
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env={**os.environ, **env}, cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} exited {result.returncode}:\n{result.stdout[-2000:]}\n"
                           f"{result.stderr[-2000:]}")
    return result.stdout
