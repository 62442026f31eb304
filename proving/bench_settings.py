"""The settings `bench_gateway` serves its server with: production's, plus
the reference endpoint (`proving.bench_urls`). Never a deployment's."""

from durable.settings import *  # noqa: F403

ROOT_URLCONF = "proving.bench_urls"
