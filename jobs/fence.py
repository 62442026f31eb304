"""The fence: the one rule every write a worker makes on a job obeys.

A worker writes on a job (renew, finish, wait, fail, release, an operation's
records under `Store.under_fence`) only while the job is LEASED, to that
worker, under the `lease_epoch` it claimed the job with; when the fence
moved — another worker took the job over, or recovery took it back — the
write touches nothing and raises `Conflict` (DESIGN §4). It is stated here
once for each place it is checked:

- in SQL, on the row a write updates: `BY_KEY` for a single write (the job
  named by its business key), `batch` for a batch's finishes and renewals
  (each job by its id and its own epoch) — the text is `jobs/sql/fence.sql`;
- in Python, on a job in hand (`fence_holds`), with the `Conflict` every
  refused write raises (`fence_conflict`)."""

from .errors import Conflict
from .models import Job
from .sql import fill, query
from .states import State

__all__ = ["BY_KEY", "batch", "fence_holds", "fence_conflict", "fence_checked"]

# A single write's condition; bound: tenant, key, epoch, worker (fence.sql).
BY_KEY = query("fence_of_key")
_BATCH = query("fence_of_batch")


def batch(*, t: str, key: str, epoch: str) -> str:
    """A batch's fence: the WHERE of an UPDATE of jobs_job AS `t`; `key` the
    condition on `t`.id, `epoch` the expression of each row's own epoch."""
    return fill(_BATCH, t=t, key=key, epoch=epoch)


def fence_holds(job: Job, *, worker_id: str, epoch: int) -> bool:
    """Whether `job`, as read, is held under the fence (`worker_id`, `epoch`)."""
    return job.state == State.LEASED and job.lease_epoch == epoch and job.worker_id == worker_id


def fence_conflict(job: Job, *, worker_id: str, epoch: int) -> Conflict:
    """The `Conflict` of a write under (`worker_id`, `epoch`) that no longer
    holds on `job`: what the fence was, and where the job is now."""
    return Conflict(
        f"{job.tenant}/{job.key}: fence (epoch {epoch}, {worker_id}) no longer holds; "
        f"the job is {job.state} at epoch {job.lease_epoch} ({job.worker_id or 'no worker'})"
    )


def fence_checked(job: Job, *, worker_id: str, epoch: int) -> Job:
    """`job` if the fence holds on it, else raises `fence_conflict`."""
    if not fence_holds(job, worker_id=worker_id, epoch=epoch):
        raise fence_conflict(job, worker_id=worker_id, epoch=epoch)
    return job
