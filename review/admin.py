"""Jobs in the admin: read-only evidence within the user's tenants
(`jobs.admin_scope.ScopedAdmin`), registered on the engine's `Job`, so its
pages are /admin/jobs/job/…. Decisions are not admin actions: they are taken
on pages of the app that offers them (a note, the state the person saw, their
role in the tenant — `review.decisions`). That app adds its links to a job's
page with `register_job_link`, and the entries of its own records about a job
to the job's evidence timeline with `register_timeline_source`; this module
names no page of an app above it."""

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html_join

from jobs import access
from jobs.admin_scope import ActionFilter, ScopedAdmin, TenantFilter
from jobs.models import Job
from jobs.search import AGES, SEARCH_MAX_CHARS, SEARCH_MIN_CHARS, jobs_matching, jobs_with_key_prefix
from jobs.selectors import expired_leases

from .assignment import QUEUE_STATES, jobs_assigned
from .masking import job_masker


class LeaseFilter(admin.SimpleListFilter):
    """LEASED jobs whose lease ran out: a worker died and recovery has not
    taken them back yet (index job_leased_expiry)."""

    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("expired", "Expired")]

    def queryset(self, request, queryset):
        if self.value() == "expired":
            return expired_leases(at=timezone.now(), jobs=queryset)
        return queryset


class AssigneeFilter(admin.SimpleListFilter):
    """Items assigned to the signed-in user, to nobody, or (`?assignee=<user
    id>`, as the queues take it) to one person (index job_assignee)."""

    title = "assigned"
    parameter_name = "assignee"

    def lookups(self, request, model_admin):
        return [("me", "To me"), ("none", "To nobody")]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        # A value that is not one of the filter's (a crafted URL) filters nothing.
        assigned = jobs_assigned(queryset, self.value(), user=request.user)
        return queryset if assigned is None else assigned


class ProposerFilter(admin.SimpleListFilter):
    """Who proposed the job (`Job.proposed_by`). The choices are the
    proposers of the oldest queue items in the user's tenants (index
    job_queue_order, bounded); any other works as `?proposer=<name>`."""

    title = "proposer"
    parameter_name = "proposer"

    def lookups(self, request, model_admin):
        # The proposers of the oldest queue items (never a DISTINCT or a
        # count over the table: the job list must stay cheap at millions).
        names = (model_admin.get_queryset(request).filter(state__in=QUEUE_STATES).exclude(proposed_by="")
                 .order_by("updated_at", "id").values_list("proposed_by", flat=True)[:200])
        return [(name, name) for name in sorted(set(names))[:50]]

    def queryset(self, request, queryset):
        return queryset.filter(proposed_by=self.value()) if self.value() else queryset


class AgeFilter(admin.SimpleListFilter):
    """Jobs whose last change is older than an age (the queues' `age`)."""

    title = "unchanged for"
    parameter_name = "age"

    def lookups(self, request, model_admin):
        return [(name, f"more than {name}") for name in AGES]

    def queryset(self, request, queryset):
        if self.value() in AGES:
            return queryset.filter(updated_at__lte=timezone.now() - AGES[self.value()])
        return queryset


# (label, function(job) -> URL, or "" when the link does not apply to this job)
_job_links: list[tuple[str, Callable[[Job], str]]] = []


def register_job_link(label: str, url_for: Callable[[Job], str]) -> None:
    """Show a link on each job's admin page (another app's page about the
    job). Registering the same label again replaces it."""
    _job_links[:] = [(known, fn) for known, fn in _job_links if known != label]
    _job_links.append((label, url_for))


@dataclass(frozen=True)
class TimelineItem:
    """One entry another app adds to a job's evidence timeline (a delivery
    made about the job, say): `link` is an admin URL name reversed with `pk`."""

    at: datetime
    kind: str
    title: str
    detail: str = ""
    actor: str = ""
    link: str = ""
    pk: object = None


# function(job, *, since, until, limit) -> list[TimelineItem]: the items
# about `job` in [since, until) (None: unbounded), newest first, at most `limit`.
_timeline_sources: list[Callable] = []


def register_timeline_source(source: Callable) -> None:
    """Add entries of another app's records to each job's evidence timeline
    (the console shows them among the job's own). Registering twice is harmless."""
    if source not in _timeline_sources:
        _timeline_sources.append(source)


def timeline_sources() -> list[Callable]:
    return list(_timeline_sources)


@admin.register(Job)
class JobAdmin(ScopedAdmin):
    list_display = ("key", "tenant", "action", "state", "attempts", "lease_epoch", "next_attempt_at", "updated_at")
    list_filter = ("state", TenantFilter, ActionFilter, ProposerFilter, AgeFilter, AssigneeFilter, LeaseFilter)
    search_fields = ("key",)
    search_help_text = ("Any part of the key, subject, proposer, rationale or the fields the action declares "
                        "searchable (an email's recipient and subject), any case, in any state; a term shorter "
                        f"than {SEARCH_MIN_CHARS} characters: the start of the key.")
    # Newest first by primary key: the pk index serves it at any size.
    ordering = ("-id",)
    # The tenant scope and filter through the job's search row, whose unique
    # (tenant, key) index serves them: jobs_job has no index led by the
    # tenant over every state (migration 0018).
    tenant_field = "search__tenant"
    # What a viewer reads instead of the fields that may quote an action's
    # sensitive payload fields (review.masking; who: access.sees_sensitive).
    MASKED = {"payload": "masked_payload", "wait_reason": "masked_wait_reason", "last_error": "masked_last_error",
              "result": "masked_result"}
    readonly_fields = ("links", *MASKED.values())
    fieldsets = (
        (None, {"fields": ("links", "tenant", "key", "action", "state", "wait_reason", "last_error", "payload")}),
        ("Attempts and lease", {"fields": ("attempts", "max_attempts", "recoveries", "first_attempt_at",
                                           "next_attempt_at", "lease_epoch", "lease_until", "worker_id", "wake_at")}),
        ("Subject and result", {"fields": ("subject_type", "subject_id", "subject_version", "priority", "result",
                                           "created_at", "updated_at", "finished_at")}),
    )

    def get_search_results(self, request, queryset, search_term):
        # The search text of the job's search row (jobs.search), served by
        # its trigram index on PostgreSQL; a term too short for a trigram is
        # a key prefix, which the search rows' key index serves. Never a scan
        # over a million rows.
        term = search_term.strip()
        if not term:
            return queryset, False
        if len(term) < SEARCH_MIN_CHARS:
            return jobs_with_key_prefix(queryset, term), False
        return jobs_matching(queryset, term[:SEARCH_MAX_CHARS], every_state=True,
                             masked=access.masked_tenants(access.request_scope(request))), False

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or access.sees_sensitive(obj.tenant, scope=access.request_scope(request)):
            return fieldsets
        return [(name, {**options, "fields": [self.MASKED.get(f, f) for f in options["fields"]]})
                for name, options in fieldsets]

    @staticmethod
    def _masker(job):
        return job_masker(job, sees_sensitive=False)

    def history_masker(self, request, job):
        return job_masker(job, sees_sensitive=access.sees_sensitive(job.tenant, scope=access.request_scope(request)))

    @admin.display(description="Payload")
    def masked_payload(self, job):
        return json.dumps(self._masker(job).data(job.payload), indent=2, ensure_ascii=False)

    @admin.display(description="Result")
    def masked_result(self, job):
        return json.dumps(self._masker(job).data(job.result), indent=2, ensure_ascii=False)

    @admin.display(description="Wait reason")
    def masked_wait_reason(self, job):
        return self._masker(job).text(job.wait_reason)

    @admin.display(description="Last error")
    def masked_last_error(self, job):
        return self._masker(job).text(job.last_error)

    @admin.display(description="Console")
    def links(self, job):
        shown = [(url, label) for label, url_for in _job_links if (url := url_for(job))]
        return format_html_join(" · ", '<a href="{}">{}</a>', shown) or "—"
