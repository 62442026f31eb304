"""What every admin page's header shows: how many items wait for the
signed-in user's review."""

from jobs import access
from jobs.models import Job
from jobs.states import State


# The header says "99+" past this: it reads at most CAP + 1 ids, never counts a big table.
CAP = 99


def waiting_for_review_count(request) -> int | str:
    """Items waiting for review in the tenants where the user may review
    (reviewer role, or a superuser), with the permission to review: at most
    `CAP` + 1 ids read through the partial index `job_state_tenant` ("99+"
    beyond), so every admin page pays one small bounded query."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_staff or not user.has_perm("jobs.review_job"):
        return 0
    scope = access.request_scope(request)
    jobs = Job.objects.filter(state=State.WAITING_REVIEW)
    if not scope.everything:
        tenants = [tenant for tenant, role in scope.roles.items() if role == access.REVIEWER]
        if not tenants:
            return 0
        jobs = jobs.filter(tenant__in=tenants)
    found = len(jobs.values_list("pk", flat=True)[: CAP + 1])
    return f"{CAP}+" if found > CAP else found


def review_waiting(request) -> dict:
    # A callable: the template calls it only on pages that show the header,
    # so a JSON download or a redirect costs no query.
    return {"review_waiting_count": lambda: waiting_for_review_count(request)}
