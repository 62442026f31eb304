"""The database this process runs on, asked once."""

import functools

from django.db import connection


@functools.cache
def vendor() -> str:
    """`connection.vendor`, read once: through Django's `connection` proxy
    each read looks this thread's connection up again, and a worker's claim
    and finish ask several times a job. A process's database does not
    change while it runs."""
    return connection.vendor
