"""Peers: `Store.enqueue_many` beside pgqueuer's list enqueue (its
`SyncQueries.enqueue` given lists: with one dedupe key per job and
`on_conflict="skip"`, keys deduplicated as ours are; and without keys), the
same number of jobs at each size, in turns (the order reversed every
round), over the same psycopg on the same server. pgqueuer is an optional extra (`pip install
.[peers]`); without it the row is skipped with a line saying so. Its schema
lives in a scratch database this module creates beside the bench's and
drops after."""

import importlib.util
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection

from jobs.store import JobSpec, Store

from .common import TENANT_ENQUEUE, delete_tenants, in_turns, vacuum

PGQUEUER_ENTRYPOINT = "bench_noop"


@dataclass
class PeerEnqueue:
    """One size: the seconds of each run, ours and the peer's, run in turns."""

    peer: str
    jobs: int
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Per pair, our rate over the peer's (> 1: ours is faster)."""
        return sorted(t / o for o, t in zip(self.ours, self.theirs, strict=True))


def pgqueuer_missing() -> str | None:
    """Why the pgqueuer row cannot run here (None when it can)."""
    if connection.vendor != "postgresql":
        return "pgqueuer row skipped: it needs PostgreSQL"
    if importlib.util.find_spec("pgqueuer") is None:
        return "pgqueuer row skipped: pgqueuer is not installed (pip install '.[peers]')"
    return None


def enqueue_vs_pgqueuer(sizes: list[int], repeat: int, progress: Callable[[str], None]) -> list[PeerEnqueue]:
    """Per size, `repeat` rounds of three runs in turns: ours, pgqueuer with
    a dedupe key per job (`on_conflict="skip"`: what ours does), pgqueuer
    without keys. Two rows per size, one per pgqueuer variant, each beside
    the same runs of ours."""
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    store = Store()
    rows = []
    with _scratch_database("pgqueuer") as peer:
        queries = SyncQueries(SyncPsycopgDriver(peer))
        for jobs in sizes:
            keyed, plain = PeerEnqueue("pgqueuer, a dedupe key per job", jobs), PeerEnqueue("pgqueuer, no keys", jobs)
            plain.ours = keyed.ours
            keys = [f"peer-{i:07d}" for i in range(jobs)]

            def ours() -> None:
                specs = [JobSpec(TENANT_ENQUEUE, key) for key in keys]
                started = time.perf_counter()
                store.enqueue_many(specs)
                keyed.ours.append(time.perf_counter() - started)
                delete_tenants([TENANT_ENQUEUE])
                vacuum()

            def theirs(row: PeerEnqueue, dedupe_keys: list[str] | None) -> None:
                entrypoints, payloads, priorities = [PGQUEUER_ENTRYPOINT] * jobs, [b"{}"] * jobs, [0] * jobs
                started = time.perf_counter()
                queries.enqueue(entrypoints, payloads, priorities, None, dedupe_keys,
                                on_conflict="skip" if dedupe_keys else "raise")
                row.theirs.append(time.perf_counter() - started)
                peer.execute("TRUNCATE pgqueuer, pgqueuer_log")
                peer.execute("VACUUM pgqueuer, pgqueuer_log")

            for i in range(repeat):
                progress(f"enqueue vs pgqueuer: {jobs:,} jobs (round {i + 1} of {repeat})")
                for run in in_turns(i, (ours, lambda: theirs(keyed, list(keys)), lambda: theirs(plain, None))):
                    run()
            rows += [keyed, plain]
    return rows


@contextmanager
def _scratch_database(suffix: str):
    """An autocommit psycopg connection to a new database beside the
    bench's (its name + `_` + `suffix`) with pgqueuer's schema; dropped on
    the way out, also when the body fails."""
    import psycopg
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment

    params = {k: v for k, v in connection.get_connection_params().items()
              if k in ("dbname", "user", "password", "host", "port", "sslmode")}
    name = f"{params['dbname']}_{suffix}"
    quoted = psycopg.sql.Identifier(name)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {}").format(quoted))
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(quoted))
        try:
            with psycopg.connect(**{**params, "dbname": name}, autocommit=True) as peer:
                peer.execute(QueryBuilderEnvironment().build_install_query())
                yield peer
        finally:
            admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(quoted))
