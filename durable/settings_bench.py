"""The settings `bench_gateway` serves its server with: production's, plus
the reference endpoint (`durable.urls_bench`). Never a deployment's."""

from .settings import *  # noqa: F403

ROOT_URLCONF = "durable.urls_bench"
