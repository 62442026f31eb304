"""Who may see and do what on the admin pages of jobs (DESIGN §14) — the one place.

The engine knows nothing about companies or memberships: it asks the function
named by the setting `DURABLE_TENANT_SCOPE` (a dotted path, provided by
the business app) which tenants a user may see and the role held in each, and
combines that with the decision's permission and the job's state. Every
admin list, page, action, filter, search, autocomplete and export, every
custom view and every decision service asks here; nothing re-derives it in a
template.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.http import Http404
from django.utils.module_loading import import_string

from .states import TRANSITIONS, WAITING, State

REVIEWER, OPERATOR, VIEWER = "reviewer", "operator", "viewer"
ROLES = (REVIEWER, OPERATOR, VIEWER)


@dataclass(frozen=True)
class Scope:
    """The tenants a user may see (`roles`: tenant slug → role) — or, for a
    superuser, every tenant (`everything`), with `roles` listing the known
    ones for filters."""

    roles: Mapping[str, str] = field(default_factory=dict)
    everything: bool = False

    def sees(self, tenant: str) -> bool:
        return self.everything or tenant in self.roles

    def role(self, tenant: str) -> str | None:
        if self.everything:
            return "superuser"
        return self.roles.get(tenant)

    def tenants(self) -> list[str]:
        """Known tenant slugs the user may see, sorted (filter choices)."""
        return sorted(self.roles)

    def filter(self, queryset, tenant_field: str = "tenant"):
        """`queryset` narrowed to these tenants (an IN list on an indexed column)."""
        if self.everything:
            return queryset
        return queryset.filter(**{f"{tenant_field}__in": list(self.roles)})


NOBODY = Scope()


@dataclass(frozen=True)
class Decision:
    """A human decision: the permission it needs, the roles that may take it
    in the job's tenant and the job states it applies to (none: a decision on
    a tenant's object, not on a job)."""

    name: str
    label: str
    permission: str
    roles: frozenset
    states: frozenset


# Where people take job decisions: reviewers on items waiting for review,
# operators on items that need attention.
REVIEW_QUEUE, ATTENTION_QUEUE = State.WAITING_REVIEW, State.NEEDS_ATTENTION


def job_decision(name: str, label: str, permission: str, role: str, *, transition: str, queue: str) -> Decision:
    """A decision that is one transition of the state machine, taken on the
    items of one queue: it applies to the states the transition leaves from
    (`states.TRANSITIONS`), narrowed to that queue — never a state the table
    does not allow."""
    states = TRANSITIONS[transition].sources & {queue}
    if not states:
        raise ValueError(f"decision {name}: transition {transition} does not leave {queue}")
    return Decision(name, label, permission, frozenset({role}), frozenset(states))


DECISIONS: dict[str, Decision] = {}


def register_decision(decision: Decision) -> None:
    """Add a decision (the app that owns it registers it, with its own
    permission: the app recording external calls registers its own). Registering
    the same decision again is harmless; another with the same name is an error."""
    known = DECISIONS.setdefault(decision.name, decision)
    if known != decision:
        raise ValueError(f"another decision is already registered as {decision.name!r}")


for _decision in [
    job_decision("approve", "Approve", "jobs.review_job", REVIEWER, transition="approve", queue=REVIEW_QUEUE),
    job_decision("reject", "Reject", "jobs.review_job", REVIEWER, transition="reject", queue=REVIEW_QUEUE),
    job_decision("correct", "Correct and approve", "jobs.review_job", REVIEWER, transition="correct",
                 queue=REVIEW_QUEUE),
    job_decision("retry", "Retry now", "jobs.operate_job", OPERATOR, transition="retry", queue=ATTENTION_QUEUE),
    job_decision("resolve", "Resolve with evidence", "jobs.operate_job", OPERATOR, transition="resolve",
                 queue=ATTENTION_QUEUE),
    job_decision("cancel", "Cancel", "jobs.operate_job", OPERATOR, transition="cancel", queue=ATTENTION_QUEUE),
    # Tenant-level operator decisions on the engine's own events (no job state involved).
    Decision("requeue_outbox", "Requeue outbox event", "jobs.operate_job", frozenset({OPERATOR}), frozenset()),
    Decision("resolve_inbound", "Resolve inbound event", "jobs.operate_job", frozenset({OPERATOR}), frozenset()),
    # Operators on a job's waits and timers: no transition of their own
    # except ending an external wait, which is the cancel one.
    Decision("run_timer", "Run timer now", "jobs.operate_job", frozenset({OPERATOR}), frozenset(WAITING)),
    Decision("reschedule_timer", "Reschedule timer", "jobs.operate_job", frozenset({OPERATOR}), frozenset(WAITING)),
    job_decision("cancel_wait", "Cancel the wait", "jobs.operate_job", OPERATOR, transition="cancel",
                 queue=State.WAITING_EXTERNAL),
]:
    register_decision(_decision)


class DecisionRefused(Exception):
    """The user may not take this decision (permission, role or tenant), or
    the job is not in a state it applies to. Nothing was written."""


@cache
def _scope_function():
    return import_string(settings.DURABLE_TENANT_SCOPE)


def scope_of(user) -> Scope:
    """The user's scope, asked of `DURABLE_TENANT_SCOPE`. Anonymous or
    inactive users see nothing."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NOBODY
    return _scope_function()(user)


def request_scope(request) -> Scope:
    """`scope_of(request.user)`, computed once per request."""
    scope = getattr(request, "_durable_scope", None)
    if scope is None:
        scope = request._durable_scope = scope_of(request.user)
    return scope


def may_view_jobs(user) -> bool:
    """May `user` open the pages about jobs at all (queues, decision
    pages, timelines, queue health)? Which jobs they then see is their scope."""
    return user.has_perm("jobs.view_job")


# The roles that read a job's sensitive payload fields in clear: those who
# decide on it need the address they approve or correct. A viewer reads the
# story with those fields masked (by the review layer's masking).
SEES_SENSITIVE = frozenset({REVIEWER, OPERATOR, "superuser"})


def sees_sensitive(tenant: str, *, scope: Scope) -> bool:
    """May the holder of `scope` read the sensitive fields of a job of
    `tenant` in clear? Reviewers, operators and superusers: yes; viewers
    (and anyone without a role there): no."""
    return scope.role(tenant) in SEES_SENSITIVE


def masked_tenants(scope: Scope) -> list[str]:
    """The tenants of `scope` whose sensitive fields its holder reads masked
    (`sees_sensitive` is false): their texts must not answer a search either,
    or a viewer could find which job holds a masked address."""
    if scope.everything:
        return []
    return sorted(tenant for tenant in scope.roles if not sees_sensitive(tenant, scope=scope))


def refusal(user, decision: str, *, tenant: str, state: str | None = None, scope: Scope | None = None) -> str:
    """Why `user` may not take `decision` on an object of `tenant` in `state`
    ("" when they may). `state=None` skips the state check (tenant-level
    decisions). Raises `Http404` when the tenant is outside the user's scope:
    another tenant's object does not exist for them."""
    d = DECISIONS[decision]
    scope = scope or scope_of(user)
    if not scope.sees(tenant):
        raise Http404("no such object")
    if not user.has_perm(d.permission):
        return f"you do not have the permission to {d.label.lower()} ({d.permission})"
    role = scope.role(tenant)
    if role != "superuser" and role not in d.roles:
        return f"your role in tenant {tenant} is {role}; {d.label.lower()} needs {' or '.join(sorted(d.roles))}"
    if state is not None and d.states and state not in d.states:
        return f"a {state} job cannot be decided with {d.label.lower()}"
    return ""


def may(user, decision: str, job, *, scope: Scope | None = None) -> bool:
    """May `user` take `decision` on `job` now (permission + role in the
    job's tenant + the job's state)? Never raises for another tenant: False."""
    scope = scope or scope_of(user)
    if not scope.sees(job.tenant):
        return False
    return not refusal(user, decision, tenant=job.tenant, state=job.state, scope=scope)


def require(user, decision: str, job, *, scope: Scope | None = None) -> None:
    """`DecisionRefused` unless `may(user, decision, job)`; `Http404` for a job
    outside the user's tenants."""
    reason = refusal(user, decision, tenant=job.tenant, state=job.state, scope=scope)
    if reason:
        raise DecisionRefused(reason)


def allowed_decisions(user, job, *, scope: Scope | None = None) -> list[Decision]:
    """The job decisions `user` may take on `job` now (what the page shows)."""
    scope = scope or scope_of(user)
    return [d for d in DECISIONS.values() if d.states and may(user, d.name, job, scope=scope)]


def get_visible_or_404(queryset, user=None, *, scope: Scope | None = None, tenant_field: str = "tenant", **lookup):
    """One object of `queryset` the user may see, or `Http404` — for another
    tenant's object exactly as for a missing one."""
    scope = scope or scope_of(user)
    obj = scope.filter(queryset, tenant_field).filter(**lookup).first()
    if obj is None:
        raise Http404("no such object")
    return obj


def decision_logged(*, user, obj, message: str) -> None:
    """The admin's History entry for a decision (same transaction as it):
    every human decision, of the engine's pages or of an app above, is told
    by the object's History button too."""
    LogEntry.objects.log_actions(user.pk, [obj], CHANGE, change_message=message, single_object=True)
