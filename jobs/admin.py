"""The engine's records in the admin, read-only within the user's tenants
(`admin_scope.ScopedAdmin`): outbox events, inbound events and timers, each
with the operator's admin action where one applies (an admin `LogEntry` per
decision), and django-q2's schedules (`schedule_admin`). Jobs themselves are
shown by the review layer's admin, which registers on `Job`."""

from django.contrib import admin, messages
from django.utils import timezone

from . import access
from . import schedule_admin  # noqa: F401 - django-q2's Schedule, superuser-only and allow-listed
from .access import decision_logged
from .admin_scope import ScopedAdmin, TenantFilter
from .errors import JobError
from .models import InboundEvent, OutboxEvent, Timer


class OverdueFilter(admin.SimpleListFilter):
    """PENDING timers already due (index timer_pending_due)."""

    title = "due"
    parameter_name = "overdue"

    def lookups(self, request, model_admin):
        return [("yes", "Overdue")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(state=Timer.Status.PENDING, scheduled_for__lte=timezone.now())
        return queryset


def _operator_action(description: str, decision: str, call, error_types):
    """An admin action over events of the user's tenants: each one needs the
    decision's permission and role in that event's tenant, and leaves an
    admin LogEntry."""

    def run(modeladmin, request, queryset):
        done = 0
        scope = access.request_scope(request)
        for obj in queryset:
            refused = access.refusal(request.user, decision, tenant=obj.tenant, scope=scope)
            if refused:
                modeladmin.message_user(request, f"{obj}: {refused}", messages.ERROR)
                continue
            try:
                call(obj, request.user.get_username())
            except error_types as exc:
                modeladmin.message_user(request, f"{obj}: {exc}", messages.ERROR)
            else:
                decision_logged(user=request.user, obj=obj, message=description)
                done += 1
        if done:
            modeladmin.message_user(request, f"{description}: {done}.", messages.SUCCESS)

    run.__name__ = decision
    run.short_description = description
    run.allowed_permissions = ("operate",)
    return run


def _requeue(event, actor):
    from .outbox import outbox_event_requeue

    outbox_event_requeue(event_id=event.pk, actor=actor)


def _resolve(event, actor):
    from .inbound import inbound_event_resolve

    inbound_event_resolve(event_pk=event.pk, actor=actor, note="marked resolved in the admin")


@admin.register(OutboxEvent)
class OutboxEventAdmin(ScopedAdmin):
    list_display = ("created_at", "tenant", "event_type", "aggregate_type", "aggregate_id", "sequence", "state",
                    "attempts", "published_at")
    list_filter = ("state", TenantFilter)
    search_fields = ("=aggregate_id",)
    ordering = ("-created_at",)
    actions = [_operator_action("Requeue quarantined events", "requeue_outbox", _requeue, JobError)]


@admin.register(InboundEvent)
class InboundEventAdmin(ScopedAdmin):
    list_display = ("received_at", "provider", "event_id", "event_type", "tenant", "state", "job")
    list_filter = ("state", "provider", TenantFilter)
    search_fields = ("=event_id",)
    ordering = ("-received_at",)
    raw_id_fields = ("job",)
    list_select_related = ("job",)
    actions = [_operator_action("Mark unmatched events resolved", "resolve_inbound", _resolve, JobError)]


@admin.register(Timer)
class TimerAdmin(ScopedAdmin):
    list_display = ("scheduled_for", "tenant", "reason", "job", "subject_type", "subject_id", "subject_version",
                    "state", "decided_at")
    list_filter = ("state", OverdueFilter, TenantFilter)
    search_fields = ("=subject_id", "=job__key")
    ordering = ("-scheduled_for",)
    raw_id_fields = ("job", "superseded_by")
    list_select_related = ("job",)
