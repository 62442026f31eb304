"""Built-in actions."""

from .actions import action


@action("jobs.noop")
def noop(ctx):
    """Does nothing: for smoke tests and benchmarks."""
    return None


@action("jobs.bench_noop")
def bench_noop(ctx):
    """Does nothing: the benchmark's own jobs. Its workers run with
    `--action jobs.bench_noop`, so they never take anyone else's work."""
    return None
