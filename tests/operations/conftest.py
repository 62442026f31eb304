"""Fixtures for the operations tests: real simulator subprocesses, real HTTP,
and the engine's own Store and handler context."""


import pytest



@pytest.fixture
def provider(settings):
    """Point this process's connectors at a simulator, with short timeouts."""

    def aim(sim_or_url, *, read_timeout: float = 0.5) -> None:
        settings.PROVIDER_URL = sim_or_url if isinstance(sim_or_url, str) else sim_or_url.url
        settings.PROVIDER_CONNECT_TIMEOUT = 1.0
        settings.PROVIDER_READ_TIMEOUT = read_timeout

    return aim


@pytest.fixture
def sim(start_sim, provider):
    """An idempotent simulator, this process's connectors aimed at it."""
    handle = start_sim("idempotent")
    provider(handle)
    return handle
