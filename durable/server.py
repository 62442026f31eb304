"""The web app's production server: uvicorn serving `durable.asgi` (Django
and `/mcp`), as docs/howto/deploy.md runs it. The one command line the demo,
the benchmarks and the tests start, so what they serve is what production
serves.

Dependency-free (no Django, no app), like `durable.net`.
"""

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPLICATION = "durable.asgi:application"


def server_argv(*, port: int, host: str = "127.0.0.1", workers: int = 1) -> list[str]:
    """uvicorn with the ASGI lifespan required (`/mcp` needs it: a server
    that cannot run it must not start answering)."""
    return [sys.executable, "-m", "uvicorn", APPLICATION, "--host", host, "--port", str(port),
            "--workers", str(workers), "--lifespan", "on", "--no-server-header"]


def server_start(*, port: int, env: dict, workers: int = 1, **popen) -> subprocess.Popen:
    """Start the server on 127.0.0.1:`port` and return once it accepts
    connections (`server_listening`)."""
    return server_listening(subprocess.Popen(server_argv(port=port, workers=workers), cwd=ROOT, env=env, **popen),
                            port)


def server_listening(process: subprocess.Popen, port: int) -> subprocess.Popen:
    """`process` once it accepts connections on 127.0.0.1:`port`; if it
    stops or does not within 60 s, it is stopped and RuntimeError raised."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.2)
    server_stop(process)
    raise RuntimeError(f"the server on port {port} did not start within 60 s")


def server_stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
