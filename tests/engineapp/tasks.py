"""Test-only `@task` functions for the Django tasks backend (module level, as
the tasks API requires). Each leaves evidence a test can count: a line in a
file it is given."""

from django_tasks import task


@task()
def record(path: str, text: str) -> str:
    """Append `text` to the file at `path`; return it upper-cased."""
    with open(path, "a") as file:
        file.write(text + "\n")
    return text.upper()


@task(queue_name="default")
def explode(path: str) -> None:
    with open(path, "a") as file:
        file.write("exploded\n")
    raise ValueError("the task failed on purpose")


@task(takes_context=True)
def attempt_number(context, path: str) -> int:
    with open(path, "a") as file:
        file.write(f"attempt {context.attempt}\n")
    return context.attempt


@task()
async def record_async(path: str, text: str) -> str:
    """`record` as a coroutine function: the module's other tasks must not suffer for it."""
    with open(path, "a") as file:
        file.write(text + "\n")
    return text[::-1]


# The conformance suite's tasks are declared in an installed app's `tasks`
# module too (by importing theirs): a worker runs only the @task functions it
# finds there, never a module a payload names.
from tests.jobs.tasks_conformance import tasks as conformance_tasks  # noqa: E402,F401
