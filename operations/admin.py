"""Operations in the admin: staff read intents, receipts and their history;
operators decide operations in doubt (the provider holds it: a human receipt;
it does not: send again) and clear connector pauses. Thin shells over
`services.py`."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from jobs.errors import JobError

from .errors import OperationStateError
from .models import IN_DOUBT, ConnectorPause, Operation, OperationEvent, Receipt
from .services import connector_pause_clear, operation_confirm_not_accepted, operation_resolve_by_human


class HumanDecisionForm(forms.Form):
    """What an operator found at the provider for an operation in doubt."""

    decision = forms.ChoiceField(
        widget=forms.RadioSelect,
        choices=[
            ("sent", "The provider holds it — record a receipt and resolve the job"),
            ("not_sent", "The provider does not hold it — send it again (same operation id)"),
        ],
    )
    provider_reference = forms.CharField(required=False, help_text="The provider's id for the message (when sent).")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), help_text="Why you are sure.")
    evidence = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                               help_text="What you looked at (dashboard, support ticket, …).")

    def clean(self):
        data = super().clean()
        if data.get("decision") == "sent" and not data.get("provider_reference"):
            self.add_error("provider_reference", "A receipt needs the provider's reference.")
        return data


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
                       "human_decision", "attempts", "last_dispatched_at", "last_error", "created_at", "updated_at")
    fields = readonly_fields

    @admin.display(description="Operator decision")
    def human_decision(self, operation):
        if operation.state not in IN_DOUBT:
            return "—"
        url = reverse("admin:operations_operation_decide", args=[operation.pk])
        return format_html('<a class="button" href="{}">Decide what became of it…</a>', url)

    def get_urls(self):
        decide = self.admin_site.admin_view(self.decide_view)
        return [path("<uuid:object_id>/decide/", decide, name="operations_operation_decide"), *super().get_urls()]

    def decide_view(self, request, object_id):
        """An operator records what the provider shows for an operation in doubt."""
        if not request.user.has_perm("operations.change_operation"):
            raise PermissionDenied
        operation = get_object_or_404(Operation, pk=object_id)
        form = HumanDecisionForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data, actor = form.cleaned_data, request.user.get_username()
            evidence = {"note": data["evidence"]} if data["evidence"] else {}
            try:
                if data["decision"] == "sent":
                    operation_resolve_by_human(operation=operation, actor=actor, evidence=evidence,
                                               provider_reference=data["provider_reference"], reason=data["reason"])
                else:
                    operation_confirm_not_accepted(operation=operation, actor=actor, evidence=evidence,
                                                   reason=data["reason"])
            except (OperationStateError, JobError) as exc:
                form.add_error(None, str(exc))
            else:
                self.message_user(request, f"Recorded your decision on operation {operation.id}.", messages.SUCCESS)
                return redirect("admin:operations_operation_change", operation.pk)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Decide operation {operation.id}",
            "operation": operation,
            "events": operation.events.order_by("id"),
            "form": form,
        }
        return TemplateResponse(request, "admin/operations/operation/decide.html", context)


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
