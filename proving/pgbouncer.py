"""A private PgBouncer (transaction mode, or session mode) in front of one database, for the
pooler tests and `manage.py bench --pooler` (CI starts its own in `.ci/run`).

It runs as the `postgres` user when started by root (PgBouncer refuses to
run as root), with its ini, log and pid files under a temporary directory,
on a free port of 127.0.0.1, `auth_type = any` and one `[databases]` line
that logs in to PostgreSQL as `postgres`. The database must exist: it is
created and migrated directly, never through the pooler (CREATE/DROP
DATABASE cannot go through it: PgBouncer keeps server connections open to
the database it serves).
"""

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from durable.net import free_port

BINARY_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


class PgBouncerError(Exception):
    """PgBouncer is missing or did not start."""


def pgbouncer_binary() -> str | None:
    """The PgBouncer executable, or None when it is not installed."""
    for candidate in BINARY_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("pgbouncer")


@dataclass
class PgBouncer:
    process: subprocess.Popen
    port: int
    dbname: str
    directory: Path

    @property
    def url(self) -> str:
        """A DATABASE_URL through the pooler."""
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: PgBouncer closes its connections and exits
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_pgbouncer(*, dbname: str, host: str = "127.0.0.1", port: int = 5432, pool_size: int = 4,
                    max_client_conn: int = 500, pool_mode: str = "transaction") -> PgBouncer:
    """Start PgBouncer (`pool_mode` transaction or session, `pool_size`
    server connections) in front of `dbname` on `host:port`; returns once
    it accepts logins."""
    if pool_mode not in ("transaction", "session"):
        raise PgBouncerError(f"pool_mode is transaction or session, not {pool_mode!r}")
    binary = pgbouncer_binary()
    if binary is None:
        raise PgBouncerError("PgBouncer is not installed (Debian: apt-get install pgbouncer)")
    directory = Path(tempfile.mkdtemp(prefix="durable-pgbouncer-"))
    as_postgres = os.geteuid() == 0
    listen = free_port()
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{dbname} = host={host} port={port} dbname={dbname} user=postgres\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {listen}\n"
        "unix_socket_dir =\n"
        "auth_type = any\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "min_pool_size = 0\n"
        "reserve_pool_size = 0\n"
        f"max_client_conn = {max_client_conn}\n"
        "server_reset_query =\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {directory / 'pgbouncer.log'}\n"
        f"pidfile = {directory / 'pgbouncer.pid'}\n"
    )
    if as_postgres:
        shutil.chown(directory, user="postgres")
        for path in directory.iterdir():
            shutil.chown(path, user="postgres")
    process = subprocess.Popen(
        [binary, str(directory / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=directory,
        **({"user": "postgres", "group": "postgres", "extra_groups": []} if as_postgres else {}),
    )
    bouncer = PgBouncer(process, listen, dbname, directory)
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            log = bouncer.log()
            bouncer.stop()
            raise PgBouncerError(f"PgBouncer exited with code {process.returncode}:\n{log[-2000:]}")
        try:
            import psycopg

            with psycopg.connect(bouncer.url, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return bouncer
        except Exception as exc:  # noqa: BLE001 - not listening yet
            if time.monotonic() > deadline:
                log = bouncer.log()
                bouncer.stop()
                raise PgBouncerError(f"PgBouncer did not accept a login within 20 s ({exc}):\n{log[-2000:]}") from exc
            time.sleep(0.1)
