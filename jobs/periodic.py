"""The registry of periodic maintenance tasks (timers firing, outbox relay …).

It stands apart from the worker runtime that drives it: a module registers
its task here with `@periodic_task` and never imports the worker; the worker
(`jobs.worker`) runs `registered()` tasks on its own schedule.

Contract for a task: `run(worker_id=..., limit=...) -> int` does at most
`limit` items per call, returns how many it handled, and uses SKIP LOCKED (or
its own fence) so several workers may run it at once.
"""

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PeriodicTask", "periodic_task", "register", "unregister", "registered"]


@dataclass(frozen=True)
class PeriodicTask:
    name: str
    run: Callable[..., int]  # run(worker_id=..., limit=...) -> how many items it handled
    every: float  # seconds between runs in one worker


_tasks: dict[str, PeriodicTask] = {}


def register(task: PeriodicTask) -> None:
    """Add (or replace, by name) a task."""
    _tasks[task.name] = task


def unregister(name: str) -> None:
    """Remove a task by name (tests); unknown names are ignored."""
    _tasks.pop(name, None)


def registered() -> list[PeriodicTask]:
    """The tasks, in registration order."""
    return list(_tasks.values())


def periodic_task(name: str, *, every: float):
    """Register the decorated function as a task the worker runs every
    `every` seconds (see the module's contract)."""

    def decorate(fn):
        register(PeriodicTask(name, fn, every))
        return fn

    return decorate
