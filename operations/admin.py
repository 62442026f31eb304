"""Operations in the admin: staff read intents, receipts and their history;
operators clear connector pauses. Thin shells over `services.py`."""

from django.contrib import admin, messages

from .errors import OperationStateError
from .models import ConnectorPause, Operation, OperationEvent, Receipt
from .services import connector_pause_clear


class _ReadOnly:
    """Evidence is never edited: staff may look, nobody may change it here."""

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReceiptInline(_ReadOnly, admin.StackedInline):
    model = Receipt
    extra = 0
    fields = ("provider_reference", "accepted_at", "how", "recorded_by", "reason", "evidence", "created_at")
    readonly_fields = fields


class OperationEventInline(_ReadOnly, admin.TabularInline):
    model = OperationEvent
    extra = 0
    fields = ("created_at", "kind", "from_state", "to_state", "actor", "epoch", "reason", "detail")
    readonly_fields = fields
    ordering = ("id",)


@admin.register(Operation)
class OperationAdmin(_ReadOnly, admin.ModelAdmin):
    list_display = ("id", "tenant", "job", "step", "provider", "kind", "state", "attempts", "updated_at")
    list_filter = ("state", "provider", "kind", "tenant")
    search_fields = ("=id", "job__key", "tenant")
    ordering = ("-updated_at",)
    list_select_related = ("job",)
    inlines = [ReceiptInline, OperationEventInline]
    readonly_fields = ("id", "tenant", "job", "step", "provider", "kind", "request_digest", "request", "state",
                       "attempts", "last_dispatched_at", "last_error", "created_at", "updated_at")
    fields = readonly_fields


@admin.register(Receipt)
class ReceiptAdmin(_ReadOnly, admin.ModelAdmin):
    list_display = ("provider_reference", "operation", "how", "accepted_at", "recorded_by")
    list_filter = ("how",)
    search_fields = ("provider_reference", "=operation__id")
    list_select_related = ("operation",)
    readonly_fields = ("operation", "provider_reference", "accepted_at", "how", "evidence", "recorded_by",
                       "reason", "created_at")
    fields = readonly_fields


@admin.action(description="Clear pause (credentials fixed)", permissions=["change"])
def clear_pause(modeladmin, request, queryset):
    cleared = 0
    for pause in queryset.filter(cleared_at__isnull=True):
        try:
            if connector_pause_clear(tenant=pause.tenant, provider=pause.provider,
                                     actor=request.user.get_username(), reason="cleared in the admin"):
                cleared += 1
        except OperationStateError as exc:
            modeladmin.message_user(request, f"{pause}: {exc}", messages.ERROR)
    modeladmin.message_user(request, f"Cleared {cleared} pause(s). Retry the jobs they held from the jobs list.",
                            messages.SUCCESS)


@admin.register(ConnectorPause)
class ConnectorPauseAdmin(admin.ModelAdmin):
    list_display = ("provider", "tenant", "status_code", "paused_at", "cleared_at", "cleared_by")
    list_filter = ("provider", "tenant", ("cleared_at", admin.EmptyFieldListFilter))
    actions = [clear_pause]
    readonly_fields = ("tenant", "provider", "status_code", "reason", "operation", "paused_at", "cleared_at",
                       "cleared_by", "clear_reason")
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
