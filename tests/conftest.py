"""Shared fixtures. The suite runs on whichever database DATABASE_URL names
(SQLite by default); tests marked `postgres` need a feature only PostgreSQL
has (NOTIFY, row locks across connections, pg_terminate_backend), are skipped
elsewhere and run in CI's PostgreSQL pass.

Hypothesis profiles (HYPOTHESIS_PROFILE, default `ci`): `ci` is
derandomized with a fixed number of examples and keeps no example database,
so a run is repeatable and writes nothing into the project folder; `deep`
(`make test-deep`) explores far longer and keeps its example database under
the system's temporary directory."""

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.db import connection
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase

ROOT = Path(__file__).resolve().parent.parent

hypothesis_settings.register_profile(
    "ci", derandomize=True, database=None, max_examples=50, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
hypothesis_settings.register_profile(
    "deep", max_examples=400, stateful_step_count=120, deadline=None,
    database=DirectoryBasedExampleDatabase(Path(tempfile.gettempdir()) / "durable-hypothesis"),
    suppress_health_check=[HealthCheck.too_slow],
)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# Hypothesis also caches what it learns from the source (constants) in its
# home directory: under the temporary directory too, never the project's.
set_hypothesis_home_dir(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
                        or Path(tempfile.gettempdir()) / "durable-hypothesis-home")


def pytest_collection_modifyitems(config, items):
    from django.conf import settings

    from proving.pgbouncer import pgbouncer_binary

    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://…)")
        for item in items:
            if "postgres" in item.keywords or "pooler" in item.keywords:
                item.add_marker(skip)
        return
    if os.environ.get("DATABASE_POOL_MODE") == "transaction":
        skip = pytest.mark.skip(reason="this run is behind a pooler already; these tests start their own in front "
                                       "of a direct database")
        for item in items:
            if "pooler" in item.keywords:
                item.add_marker(skip)
    elif pgbouncer_binary() is None:
        # CI (.ci/run) installs it; a developer's machine may not have it.
        skip = pytest.mark.skip(reason="needs PgBouncer (Debian: apt-get install pgbouncer)")
        for item in items:
            if "pooler" in item.keywords:
                item.add_marker(skip)


if os.environ.get("DATABASE_POOL_MODE") == "transaction":
    # The suite behind a transaction-mode pooler (.ci/run's pooler pass): a
    # test database cannot be created or dropped through the pooler, so the
    # tests run on the database DATABASE_URL names, which the caller created
    # and migrated directly and drops afterwards (transaction tests flush it,
    # the others roll back). Child processes reach it through the pooler too.
    @pytest.fixture(scope="session")
    def django_db_setup():
        from django.conf import settings

        name = settings.DATABASES["default"]["NAME"]
        if not name.startswith("durable_ci_pool"):
            raise pytest.UsageError(
                f"DATABASE_POOL_MODE=transaction runs the tests on the database itself, which they flush: "
                f"use one made for it (named durable_ci_pool…), not {name!r}")


@pytest.fixture
def start_sim(tmp_path):
    """Start provider simulator subprocesses (quiet, storage under tmp_path);
    all are stopped at teardown. `db_name` lets a later simulator reopen an
    earlier one's storage (a provider that comes back from an outage)."""
    from connectors.simulator_process import start_simulator

    started = []

    def start(mode: str = "idempotent", *, db_name: str = "provider.sqlite3", **options):
        handle = start_simulator(mode=mode, db_path=tmp_path / db_name, quiet=True, **options)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


@pytest.fixture
def refused_url():
    """A URL on which nothing listens: connecting to it is refused. The port
    comes from the OS and stays bound (never listening) for the whole test,
    so no other process can start listening on it meanwhile."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture
def store():
    from jobs.store import Store

    return Store()


@pytest.fixture
def test_database_url(transactional_db):
    """A DATABASE_URL that points child processes at the test database."""
    settings_dict = connection.settings_dict
    if connection.vendor == "postgresql":
        user = settings_dict.get("USER") or "postgres"
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        return f"postgres://{user}@{host}:{port}/{settings_dict['NAME']}"
    return f"sqlite:///{settings_dict['NAME']}"


@pytest.fixture
def pgbouncer(test_database_url):
    """Start private PgBouncers (transaction mode unless `pool_mode="session"`)
    in front of the test database, which pytest-django created directly —
    never through the pooler; `pgbouncer(pool_size=N)` returns one (`.url`
    leads through it).
    All are stopped at teardown, before the test database is flushed or
    dropped. For tests marked `pooler`."""
    from proving.pgbouncer import start_pgbouncer

    settings_dict = connection.settings_dict
    started = []

    def start(*, pool_size: int = 4, pool_mode: str = "transaction"):
        bouncer = start_pgbouncer(dbname=settings_dict["NAME"], host=settings_dict.get("HOST") or "127.0.0.1",
                                  port=int(settings_dict.get("PORT") or 5432), pool_size=pool_size,
                                  pool_mode=pool_mode)
        started.append(bouncer)
        return bouncer

    yield start
    for bouncer in started:
        bouncer.stop()


@pytest.fixture
def manage(test_database_url):
    """Run or start `manage.py` subcommands as real processes on the test database."""

    class Manage:
        env = {**os.environ, "DATABASE_URL": test_database_url, "PYTHONUNBUFFERED": "1"}

        def run(self, *args, timeout=120, check=True, env=None):
            result = subprocess.run(
                [sys.executable, str(ROOT / "manage.py"), *args],
                env={**self.env, **(env or {})}, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
            )
            if check and result.returncode != 0:
                raise AssertionError(f"manage.py {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
            return result

        def start(self, *args, **kwargs):
            return subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), *args],
                env={**self.env, **kwargs.pop("env", {})}, cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs,
            )

    return Manage()
