"""Private PostgreSQL clusters for tests and drills that stop, crash or
promote a server: a primary and its streaming standbys, each in its own
temporary directory on a free port of 127.0.0.1, never the shared server.

    with PrivateClusters() as clusters:
        primary = clusters.primary()
        standby = clusters.standby(primary, synchronous=False)
        url = multi_host_url([primary, standby], "durable")
        ...
        primary.stop(mode="immediate")   # a crash: nothing flushed, no shutdown checkpoint
        standby.promote()

Every cluster runs as the `postgres` user when started by root (PostgreSQL
refuses to run as root), with trust authentication for 127.0.0.1 and its
Unix socket in its own directory. Leaving the `with` block stops every
cluster still running (immediately) and removes their directories, whatever
happened inside it. The binaries are PostgreSQL's own (`initdb`, `pg_ctl`,
`pg_basebackup`) from POSTGRES_BIN (default /usr/lib/postgresql/15/bin).

Dependency-free apart from psycopg (no Django), so any process may use it.
"""

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from durable.net import free_port

POSTGRES_BIN = Path(os.environ.get("POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))
# Settings for a disposable cluster: small, quick, never fsync'ing (the
# drills crash the server process, never the machine), streaming WAL to
# standbys that answer read-only queries.
SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
cluster_name = '{name}'
max_connections = 100
shared_buffers = 32MB
fsync = off
full_page_writes = off
wal_level = replica
max_wal_senders = 8
wal_keep_size = 256MB
hot_standby = on
hot_standby_feedback = on
logging_collector = off
"""
HBA = """
local all all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
"""


class ClusterError(Exception):
    """A private cluster could not be created, started, copied or promoted."""


def postgres_binaries_available() -> bool:
    return all(os.access(POSTGRES_BIN / name, os.X_OK) for name in ("initdb", "pg_ctl", "pg_basebackup"))


@dataclass
class Cluster:
    name: str
    port: int
    directory: Path

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def logfile(self) -> Path:
        return self.directory / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def start(self) -> None:
        _run(self, "pg_ctl", "start", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (a clean shutdown) or `immediate` (as a
        crash: the server processes exit at once, without a checkpoint)."""
        if self.running():
            _run(self, "pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "60")

    def promote(self) -> None:
        """Promote this standby; returns once it accepts writes."""
        _run(self, "pg_ctl", "promote", "-D", str(self.data), "-w", "-t", "60")
        deadline = time.monotonic() + 60
        while self.query("SELECT pg_is_in_recovery()")[0][0]:
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name} still in recovery 60 s after its promotion:\n{self.log()[-2000:]}")
            time.sleep(0.05)

    def stop_streaming(self) -> None:
        """This standby stops receiving WAL (its primary_conninfo emptied):
        what its primary commits from now on is missing here, as the last
        commits an asynchronous standby had not received when its primary
        crashed."""
        self.query("ALTER SYSTEM SET primary_conninfo = ''")
        self.query("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while self.query("SELECT count(*) FROM pg_stat_wal_receiver")[0][0]:
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name} still receives WAL 60 s after its primary_conninfo was emptied")
            time.sleep(0.05)

    def query(self, sql: str, params=None, *, dbname: str = "postgres") -> list[tuple]:
        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []


class PrivateClusters:
    """Clusters created under one temporary directory; all stopped and
    removed on leaving the `with` block (or on `close()`)."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="durable-clusters-"))
        self.clusters: list[Cluster] = []
        _give_to_postgres(self.root)

    def __enter__(self) -> "PrivateClusters":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for cluster in self.clusters:
            try:
                cluster.stop(mode="immediate")
            except ClusterError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def primary(self, name: str = "primary") -> Cluster:
        """A new, empty cluster, started."""
        cluster = self._new(name)
        _run(cluster, "initdb", "-D", str(cluster.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--locale=C", "--no-sync")
        self._configure(cluster)
        (cluster.data / "pg_hba.conf").write_text(HBA)
        cluster.start()
        return cluster

    def standby(self, primary: Cluster, *, name: str = "standby", synchronous: bool = False) -> Cluster:
        """A streaming standby copied from `primary` (pg_basebackup), started
        and streaming. Asynchronous by default; `synchronous=True` makes the
        primary acknowledge a commit only once this standby has flushed it."""
        cluster = self._new(name)
        _run(cluster, "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
             "-D", str(cluster.data), "-R", "-X", "stream", "-c", "fast", "--no-sync")
        self._configure(cluster)  # later lines win over the copied primary's
        cluster.start()
        if synchronous:
            primary.query("ALTER SYSTEM SET synchronous_standby_names = %s" % _literal(f'"{name}"'))
            primary.query("SELECT pg_reload_conf()")
        wanted = "sync" if synchronous else "async"
        deadline = time.monotonic() + 60
        while not primary.query(
            "SELECT 1 FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming' "
            "AND sync_state = %s", [name, wanted],
        ):
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} is not streaming ({wanted}) from {primary.name} after 60 s:\n"
                                   f"{cluster.log()[-2000:]}")
            time.sleep(0.05)
        return cluster

    def _new(self, name: str) -> Cluster:
        if any(c.name == name for c in self.clusters):
            raise ClusterError(f"a cluster named {name!r} exists already")
        directory = self.root / name
        directory.mkdir()
        _give_to_postgres(directory)
        cluster = Cluster(name=name, port=free_port(), directory=directory)
        self.clusters.append(cluster)
        return cluster

    def _configure(self, cluster: Cluster) -> None:
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write(SETTINGS.format(port=cluster.port, socket_dir=cluster.directory, name=cluster.name))


def multi_host_url(clusters: list[Cluster], dbname: str, **options: str) -> str:
    """The libpq multi-host URL that reaches whichever of `clusters`
    accepts writes (`target_session_attrs=read-write`)."""
    hosts = ",".join(f"127.0.0.1:{c.port}" for c in clusters)
    query = "&".join(f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **options}.items())
    return f"postgres://postgres@{hosts}/{dbname}?{query}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _as_postgres() -> dict:
    if os.geteuid() == 0:
        return {"user": "postgres", "group": "postgres", "extra_groups": []}
    return {}


def _give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, user="postgres", group="postgres")


def _run(cluster: Cluster, binary: str, *args: str) -> None:
    result = subprocess.run([str(POSTGRES_BIN / binary), *args], capture_output=True, text=True,
                            cwd=cluster.directory, stdin=subprocess.DEVNULL, **_as_postgres())
    if result.returncode != 0:
        raise ClusterError(f"{binary} {' '.join(args)} ({cluster.name}) exited {result.returncode}:\n"
                           f"{result.stdout[-1000:]}{result.stderr[-2000:]}\n{cluster.log()[-2000:]}")
