"""Stopping the processes a tool started (worker fleets)."""

import signal
import subprocess


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
