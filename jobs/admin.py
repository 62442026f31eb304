"""Jobs in the admin: staff read; operators retry, resolve or cancel through
the Store (the admin is a thin shell — every decision is a Store transition
with its history row)."""

from django.contrib import admin, messages

from .errors import JobError
from .models import Job, JobEvent
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
