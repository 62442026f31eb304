"""A free local TCP port, for the processes this project starts itself on
127.0.0.1 (the demo's admin, a bench's PgBouncer or server, a test's metrics
endpoint).

Dependency-free (no Django, no app), like `durable.numbers`: every app and
the tests may use it.
"""

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listened on a moment ago: the kernel
    picks it for a socket bound to port 0, which is closed again. Another
    process may take it before the caller binds it; callers start a server
    on it at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
