"""Fixtures for the operations tests: real simulator subprocesses, real HTTP,
and the engine's own Store and handler context."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from connectors.simulator_process import SimulatorHandle, start_simulator


@pytest.fixture
def start_sim(tmp_path) -> Iterator[Callable[..., SimulatorHandle]]:
    """Start provider simulators (quiet, storage under tmp_path); all are stopped at teardown.

    `db_name` lets a later simulator reopen an earlier one's storage (a
    provider that comes back from an outage)."""
    started: list[SimulatorHandle] = []

    def start(mode: str = "idempotent", *, db_name: str = "provider.sqlite3", **options: Any) -> SimulatorHandle:
        handle = start_simulator(mode=mode, db_path=tmp_path / db_name, quiet=True, **options)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


@pytest.fixture
def provider(settings):
    """Point this process's connectors at a simulator, with short timeouts."""

    def aim(sim_or_url, *, read_timeout: float = 0.5) -> None:
        settings.PROVIDER_URL = sim_or_url if isinstance(sim_or_url, str) else sim_or_url.url
        settings.PROVIDER_CONNECT_TIMEOUT = 1.0
        settings.PROVIDER_READ_TIMEOUT = read_timeout

    return aim
