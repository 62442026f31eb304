"""The benchmark's own action (found by the engine's discovery of every app's
`handlers` module). Its name keeps the `jobs.` prefix it has always had:
jobs stored under it, and every `--action jobs.bench_noop`, stay valid."""

from jobs.actions import action


@action("jobs.bench_noop")
def bench_noop(ctx):
    """Does nothing: the benchmark's own jobs. Its workers run with
    `--action jobs.bench_noop`, so they never take anyone else's work. With
    `payload["hold"]` seconds it holds its slot that long (`bench --pooler`
    counts a busy worker's connections)."""
    hold = float((ctx.payload or {}).get("hold", 0) or 0)
    if hold > 0:
        ctx.cancelled.wait(min(hold, 60.0))
    return None
