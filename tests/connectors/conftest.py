"""Fixtures for the connector tests: real simulator subprocesses, real HTTP.

Nothing here touches Django's database.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from connectors.email_http import HttpEmailConnector
from connectors.registry import build_http_connector
from connectors.simulator_process import SimulatorHandle


@pytest.fixture
def connector_for() -> Callable[..., HttpEmailConnector]:
    """A connector with a provider's declared capabilities, aimed at a given simulator."""

    def build(provider_name: str, sim_or_url: SimulatorHandle | str, *, read_timeout: float = 3.0) -> HttpEmailConnector:
        url = sim_or_url if isinstance(sim_or_url, str) else sim_or_url.url
        return build_http_connector(
            provider_name, base_url=url, api_key="test-key", connect_timeout=1.0, read_timeout=read_timeout
        )

    return build

