"""Built-in actions."""

from .actions import action


@action("jobs.noop")
def noop(ctx):
    """Does nothing: for smoke tests and benchmarks."""
    return None
