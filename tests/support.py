"""Plain helpers shared across the suite."""

import time


def wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` until it returns something truthy (returned), or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
