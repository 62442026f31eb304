"""Jobs in the admin: staff read; operators retry, resolve or cancel through
the Store (the admin is a thin shell — every decision is a Store transition
with its history row)."""

from django.contrib import admin, messages

from . import schedule_admin  # noqa: F401 - django-q2's Schedule, superuser-only and allow-listed
from .errors import JobError
from .models import InboundEvent, Job, JobEvent, OutboxEvent, Timer
from .store import Store


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    fields = ("created_at", "kind", "from_state", "to_state", "epoch", "worker_id", "actor", "reason", "detail")
    readonly_fields = fields
    ordering = ("id",)

    def has_add_permission(self, request, obj=None):
        return False


def _operator_action(name: str, description: str):
    def run(modeladmin, request, queryset):
        store = Store()
        done = 0
        for job in queryset:
            try:
                getattr(store, name)(job.tenant, job.key, reason=f"{description} in the admin",
                                     actor=request.user.get_username())
                done += 1
            except JobError as exc:
                modeladmin.message_user(request, f"{job.tenant}/{job.key}: {exc}", messages.ERROR)
        if done:
            modeladmin.message_user(request, f"{description}: {done} job(s).", messages.SUCCESS)

    run.__name__ = f"operator_{name}"
    run.short_description = description
    run.allowed_permissions = ("change",)
    return run


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("key", "tenant", "action", "state", "attempts", "lease_epoch", "worker_id",
                    "next_attempt_at", "updated_at")
    list_filter = ("state", "tenant", "action")
    search_fields = ("key", "subject_id", "worker_id")
    ordering = ("-updated_at",)
    inlines = [JobEventInline]
    actions = [
        _operator_action("retry", "Retry"),
        _operator_action("resolve", "Mark resolved"),
        _operator_action("cancel", "Cancel"),
    ]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Job._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# ---------------------------------------------------------------- outbox, inbound events, timers (read-only)


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Staff read; the only changes are the operator actions, each a service call."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _service_action(description: str, call, error_types):
    def run(modeladmin, request, queryset):
        done = 0
        for obj in queryset:
            try:
                call(obj, request.user.get_username())
                done += 1
            except error_types as exc:
                modeladmin.message_user(request, f"{obj}: {exc}", messages.ERROR)
        if done:
            modeladmin.message_user(request, f"{description}: {done}.", messages.SUCCESS)

    run.short_description = description
    run.allowed_permissions = ("change",)
    return run


def _requeue(event, actor):
    from .outbox import outbox_event_requeue

    outbox_event_requeue(event_id=event.pk, actor=actor)


def _resolve(event, actor):
    from .inbound import inbound_event_resolve

    inbound_event_resolve(event_pk=event.pk, actor=actor, note="marked resolved in the admin")


@admin.register(OutboxEvent)
class OutboxEventAdmin(_ReadOnlyAdmin):
    list_display = ("created_at", "tenant", "event_type", "aggregate_type", "aggregate_id", "sequence", "state",
                    "attempts", "published_at")
    list_filter = ("state", "event_type", "tenant")
    search_fields = ("aggregate_id", "event_type")
    ordering = ("-created_at",)
    actions = [_service_action("Requeue quarantined events", _requeue, JobError)]


@admin.register(InboundEvent)
class InboundEventAdmin(_ReadOnlyAdmin):
    list_display = ("received_at", "provider", "event_id", "event_type", "tenant", "state", "job")
    list_filter = ("state", "provider", "event_type")
    search_fields = ("event_id", "note")
    ordering = ("-received_at",)
    raw_id_fields = ("job",)
    actions = [_service_action("Mark unmatched events resolved", _resolve, JobError)]


@admin.register(Timer)
class TimerAdmin(_ReadOnlyAdmin):
    list_display = ("scheduled_for", "tenant", "reason", "job", "subject_type", "subject_id", "subject_version",
                    "state", "decided_at")
    list_filter = ("state", "tenant", "subject_type")
    search_fields = ("reason", "subject_id", "job__key")
    ordering = ("-scheduled_for",)
    raw_id_fields = ("job", "superseded_by")
