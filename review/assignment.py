"""Who took an item in a queue (DESIGN §16): "assign to me", release it, and
an operator (re)assigning it to a person who may decide it.

Assignment is not a decision: it changes no state and keeps nobody else
from deciding, but the queues show it and filter by it ("my items"). Each
change is a history row of the job (`assign` / `unassign`, actor, note) and
an admin `LogEntry`, written in the same transaction.
"""

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet

from durable.numbers import NumberRefused, whole_number
from jobs import access, interventions
from jobs.access import OPERATOR, DecisionRefused, decision_logged
from jobs.models import Job

__all__ = ["job_assign", "job_unassign", "may_assign_others", "assignable_users", "may_decide_in_queue",
           "jobs_assigned"]

# The decisions a queue's item waits for: who may take one of them is who
# the item may be given to (an operator's say on an operation is not one).
QUEUE_DECISIONS = {access.REVIEW_QUEUE: ("approve", "reject", "correct"),
                   access.ATTENTION_QUEUE: ("retry", "resolve", "cancel")}
QUEUE_STATES = frozenset(QUEUE_DECISIONS)


def jobs_assigned(jobs: QuerySet, value: str, *, user) -> QuerySet | None:
    """`jobs` narrowed by the assignee filter of the queues and the job list:
    "me" (the signed-in `user`), "none", or a user id (index job_assignee).
    None when `value` is none of those (the caller says so, or ignores it)."""
    if value == "me":
        return jobs.filter(assignee_id=user.pk)
    if value == "none":
        return jobs.filter(assignee__isnull=True)
    try:
        return jobs.filter(assignee_id=whole_number(value, minimum=1))
    except NumberRefused:
        return None


def may_decide_in_queue(user, job, *, scope=None) -> bool:
    """May `user` take one of the decisions the item's queue is for, now?"""
    scope = scope or access.scope_of(user)
    return any(access.may(user, name, job, scope=scope) for name in QUEUE_DECISIONS.get(job.state, ()))


def _may_decide(user, job) -> bool:
    return may_decide_in_queue(user, job)


def may_assign_others(user, job, *, scope=None) -> bool:
    """Operators (and superusers) of the job's tenant may give its items to
    someone else; everyone else assigns only themselves."""
    scope = scope or access.scope_of(user)
    return (scope.sees(job.tenant) and user.has_perm("jobs.operate_job")
            and scope.role(job.tenant) in (OPERATOR, "superuser"))


def assignable_users(job, *, candidates):
    """Those of `candidates` (users) who may decide `job` now: the people an
    item may be given to (the same tenant, a role of its queue)."""
    return [u for u in candidates if u.is_active and _may_decide(u, job)]


def _locked_visible(job_id: int, user) -> Job:
    job = access.get_visible_or_404(Job.objects.select_for_update(), user, pk=job_id)
    if job.state not in QUEUE_STATES:
        raise DecisionRefused(f"a {job.state} job is in no queue; only waiting items are assigned")
    return job


def job_assign(*, job_id: int, user, assignee_id: int | None = None, note: str = "") -> Job:
    """Give the item to `assignee_id` (default: `user` themselves).

    Refused (`DecisionRefused`) unless the item waits in a queue, the
    assignee may decide it (permission + a role of its queue in its tenant),
    and — for anyone but themselves — `user` is an operator of its tenant.
    `Http404` for a job, or an assignee, outside what `user` may see."""
    target_id = user.pk if assignee_id is None else assignee_id
    with transaction.atomic(durable=True):
        job = _locked_visible(job_id, user)
        if target_id != user.pk and not may_assign_others(user, job):
            raise DecisionRefused("only an operator of the tenant assigns items to someone else")
        assignee = get_user_model().objects.filter(pk=target_id, is_active=True).first()
        if assignee is None or not _may_decide(assignee, job):
            raise DecisionRefused("the item can be assigned only to a person of its tenant who may decide it")
        if job.assignee_id == assignee.pk:
            raise DecisionRefused(f"already assigned to {assignee.get_username()}")
        before = job.assignee.get_username() if job.assignee_id else ""
        changed = interventions.job_assign(job_id=job.pk, assignee_id=assignee.pk, actor=user.get_username(),
                                 reason=note or f"assigned to {assignee.get_username()}",
                                 detail={"assignee": assignee.get_username(), "before": before})
        decision_logged(user=user, obj=changed, message=f"Assigned to {assignee.get_username()}"
                                                        + (f" (was {before})" if before else ""))
    return changed


def job_unassign(*, job_id: int, user, note: str = "") -> Job:
    """Release the item: its assignee, or an operator of its tenant.
    `DecisionRefused` otherwise, or when nobody has it."""
    with transaction.atomic(durable=True):
        job = _locked_visible(job_id, user)
        if job.assignee_id is None:
            raise DecisionRefused("the item is assigned to nobody")
        if job.assignee_id != user.pk and not may_assign_others(user, job):
            raise DecisionRefused("only its assignee or an operator of the tenant releases an item")
        before = job.assignee.get_username()
        changed = interventions.job_assign(job_id=job.pk, assignee_id=None, actor=user.get_username(),
                                 reason=note or f"released (was {before})", detail={"before": before})
        decision_logged(user=user, obj=changed, message=f"Released (was {before})")
    return changed
