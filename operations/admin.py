"""Operations in the admin: read-only evidence within the user's tenants
(intents, receipts, their history, connector pauses). Operators decide an
operation in doubt and clear connector pauses on their own pages, each a thin
shell over `operations.review` (permission, role in the tenant, state, note,
history row and LogEntry)."""

import json

from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from jobs import access
from jobs.access import DecisionRefused
from jobs.admin_scope import ScopedAdmin, TenantFilter
from jobs.errors import JobError
from jobs.selectors import newest_event
from review.decisions import NOTE_MAX_CHARS, seen_event_from
from review.masking import job_masker

from .errors import OperationStateError
from .models import IN_DOUBT, ConnectorPause, Operation, OperationEvent, Receipt
from .review import (
    OPERATION_DECISIONS,
    PROVIDER_REFERENCE_MAX_CHARS,
    connector_pause_decide,
    jobs_held_by_pause,
    operation_decide,
)


def _request_rows(request_data) -> list[tuple[str, str, bool]]:
    """An operation's request for a person: (field, value, multiline) rows,
    a nested value as indented JSON."""
    if not isinstance(request_data, dict):
        return [("request", json.dumps(request_data, indent=2, ensure_ascii=False), True)]
    rows = []
    for name, value in request_data.items():
        if isinstance(value, str):
            rows.append((name, value, "\n" in value or len(value) > 80))
        else:
            rows.append((name, json.dumps(value, indent=2, ensure_ascii=False), isinstance(value, dict | list)))
    return rows


def _seen_event(text) -> int:
    """A form's seen state (the job's newest history row its page showed), or its refusal as a form error."""
    try:
        return seen_event_from(text)
    except DecisionRefused as exc:
        raise forms.ValidationError(str(exc)) from None


def _decision_text(label: str, help_text: str, *, rows: int, required: bool = True) -> forms.CharField:
    # The service enforces the same maximum; the form shows it (maxlength).
    return forms.CharField(label=label, required=required, max_length=NOTE_MAX_CHARS, help_text=help_text,
                           widget=forms.Textarea(attrs={"rows": rows}))


class HumanDecisionForm(forms.Form):
    """What an operator found at the provider for an operation in doubt."""

    decision = forms.ChoiceField(label="What the provider shows", widget=forms.RadioSelect,
                                 choices=list(OPERATION_DECISIONS.items()))
    provider_reference = forms.CharField(required=False, label="Provider reference",
                                         max_length=PROVIDER_REFERENCE_MAX_CHARS,
                                         help_text="The provider's id for the message (when sent).")
    reason = _decision_text("Note", "Why you are sure.", rows=2)
    evidence = _decision_text("Evidence", "What you looked at (dashboard, support ticket, …).", rows=3,
                              required=False)
    # Required: the decision is taken on the job as this page showed it.
    seen_event = forms.CharField(widget=forms.HiddenInput, required=False)

    def clean_seen_event(self):
        return _seen_event(self.cleaned_data.get("seen_event"))

    def clean(self):
        data = super().clean()
        if data.get("decision") == "sent" and not (data.get("provider_reference") or "").strip():
            self.add_error("provider_reference", "A receipt needs the provider's reference.")
        return data


def operation_masker(request, operation):
    """How this reader reads an operation and what is told about it: its
    job's masker (`review.masking.job_masker`), knowing its request too."""
    return job_masker(operation.job, also=[operation.request],
                      sees_sensitive=access.sees_sensitive(operation.tenant, scope=access.request_scope(request)))


class _EvidenceInline:
    """History and receipts are evidence: shown, never edited here. Its
    free texts (`masked_texts`: notes, reasons, details) are read through the
    operation's masker by a reader who sees the sensitive fields masked."""

    extra = 0
    can_delete = False
    masked_texts: tuple[str, ...] = ()

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_fields(self, request, obj=None):
        self._masker = operation_masker(request, obj) if obj is not None else None
        if self._masker is None or not self._masker.active:
            return self.fields
        return tuple(f"masked_{f}" if f in self.masked_texts else f for f in self.fields)

    def get_readonly_fields(self, request, obj=None):
        return self.get_fields(request, obj)

    @admin.display(description="Reason")
    def masked_reason(self, row):
        return self._masker.text(row.reason)

    @admin.display(description="Evidence")
    def masked_evidence(self, row):
        return self._masker.text(row.evidence)

    @admin.display(description="Detail")
    def masked_detail(self, row):
        return json.dumps(self._masker.data(row.detail), ensure_ascii=False)


class ReceiptInline(_EvidenceInline, admin.StackedInline):
    model = Receipt
    fields = ("provider_reference", "accepted_at", "how", "recorded_by", "reason", "evidence", "created_at")
    readonly_fields = fields
    masked_texts = ("reason", "evidence")


class OperationEventInline(_EvidenceInline, admin.TabularInline):
    model = OperationEvent
    fields = ("created_at", "kind", "from_state", "to_state", "actor", "epoch", "reason", "detail")
    readonly_fields = fields
    ordering = ("id",)
    masked_texts = ("reason", "detail")


class InDoubtFilter(admin.SimpleListFilter):
    """Operations in doubt (`IN_DOUBT`): intended, unknown or under
    investigation — the health panel's link."""

    title = "doubt"
    parameter_name = "doubt"

    def lookups(self, request, model_admin):
        return [("yes", "In doubt")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(state__in=IN_DOUBT)
        return queryset


@admin.register(Operation)
class OperationAdmin(ScopedAdmin):
    list_display = ("id", "tenant", "job", "step", "provider", "kind", "state", "attempts", "updated_at")
    list_filter = ("state", InDoubtFilter, TenantFilter)
    search_fields = ("=id",)
    ordering = ("-updated_at",)
    list_select_related = ("job",)
    inlines = [ReceiptInline, OperationEventInline]
    readonly_fields = ("decide_link", "waiting_for_operator", "masked_request", "masked_last_error")
    fields = ("id", "intent_key", "tenant", "job", "step", "provider", "kind", "request_digest", "request", "state",
              "attempts", "last_dispatched_at", "last_error", "created_at", "updated_at")

    def get_fields(self, request, obj=None):
        fields = self.fields
        if obj is not None and not access.sees_sensitive(obj.tenant, scope=access.request_scope(request)):
            # A viewer reads the request with the action's sensitive fields masked.
            fields = tuple({"request": "masked_request", "last_error": "masked_last_error"}.get(f, f) for f in fields)
        # The decision control only for those allowed to use it.
        if obj is None or obj.state not in IN_DOUBT:
            return fields
        allowed = access.may(request.user, "decide_operation", obj.job, scope=access.request_scope(request))
        return ("decide_link" if allowed else "waiting_for_operator", *fields)

    @admin.display(description="Request")
    def masked_request(self, operation):
        masker = job_masker(operation.job, sees_sensitive=False, also=[operation.request])
        return json.dumps(masker.data(operation.request), indent=2, ensure_ascii=False)

    @admin.display(description="Last error")
    def masked_last_error(self, operation):
        return job_masker(operation.job, sees_sensitive=False, also=[operation.request]).text(operation.last_error)

    def history_masker(self, request, operation):
        return operation_masker(request, operation)

    @admin.display(description="Operator decision")
    def decide_link(self, operation):
        url = reverse("admin:operations_operation_decide", args=[operation.pk])
        return format_html('<a class="button" href="{}">Decide what became of it…</a>', url)

    @admin.display(description="Operator decision")
    def waiting_for_operator(self, operation):
        return f"{operation.state}: waiting for an operator of tenant {operation.tenant}"

    def get_urls(self):
        decide = self.admin_site.admin_view(self.decide_view)
        return [path("<uuid:object_id>/decide/", decide, name="operations_operation_decide"), *super().get_urls()]

    def decide_view(self, request, object_id):
        """An operator records what the provider shows for an operation in doubt."""
        operation = access.get_visible_or_404(Operation.objects.select_related("job"), request.user, pk=object_id)
        refused = access.refusal(request.user, "decide_operation", tenant=operation.tenant,
                                 state=operation.job.state)
        form = HumanDecisionForm(request.POST or None, initial={"seen_event": getattr(newest_event(operation.job_id), "id", None)})
        if request.method == "POST" and not refused and form.is_valid():
            data = form.cleaned_data
            try:
                operation_decide(operation_id=operation.pk, user=request.user, decision=data["decision"],
                                 note=data["reason"], seen_event=data["seen_event"],
                                 provider_reference=data["provider_reference"], evidence=data["evidence"])
            except (DecisionRefused, OperationStateError, JobError) as exc:
                form.add_error(None, str(exc))
            else:
                self.message_user(request, f"Recorded your decision on operation {operation.id}.", messages.SUCCESS)
                return redirect("admin:operations_operation_change", operation.pk)
        # A viewer reads the request with the action's sensitive fields masked.
        masker = operation_masker(request, operation)
        request_data = masker.data(operation.request)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Decide operation {operation.id}",
            "operation": operation,
            "request_rows": _request_rows(request_data),
            "request_json": json.dumps(request_data, indent=2, ensure_ascii=False, sort_keys=True),
            "last_error": masker.text(operation.last_error),
            "events": [(e, masker.text(e.reason)) for e in operation.events.order_by("-id")[:50]],
            "form": form,
            "refused": refused,
        }
        return TemplateResponse(request, "admin/operations/operation/decide.html", context,
                                status=403 if refused and request.method == "POST" else 200)


@admin.register(Receipt)
class ReceiptAdmin(ScopedAdmin):
    tenant_field = "operation__tenant"
    list_display = ("provider_reference", "operation", "how", "accepted_at", "recorded_by")
    list_filter = ("how", TenantFilter)
    search_fields = ("=provider_reference", "=operation__id")
    list_select_related = ("operation",)
    ordering = ("-id",)

    class Media:
        css = {"all": ("operations/operations.css",)}
    fields = ("operation", "provider_reference", "accepted_at", "how", "evidence", "recorded_by", "reason",
              "created_at")


class ClearPauseForm(forms.Form):
    """Clear a pause and retry the held jobs chosen — each as this page
    showed it (a hidden `seen_<job id>` per job: its newest history row)."""

    note = _decision_text("Note", "What was fixed (new credentials, provider ticket…).", rows=2)
    retry = forms.MultipleChoiceField(label="Retry the jobs it held back", required=False,
                                      widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args, held=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["retry"].choices = [(str(job.pk), f"{job.key} — {job.action}") for job in held]
        self.initial.setdefault("retry", [str(job.pk) for job in held])
        for job in held:
            self.fields[f"seen_{job.pk}"] = forms.CharField(
                widget=forms.HiddenInput, required=False, initial=getattr(newest_event(job.pk), "id", ""))

    def chosen(self) -> dict[int, int | None]:
        """The jobs chosen for a retry → the state the page showed of each
        (None when that is missing or not an event id: the retry is refused)."""
        chosen = {}
        for job_id in self.cleaned_data["retry"]:
            try:
                chosen[int(job_id)] = seen_event_from(self.cleaned_data.get(f"seen_{job_id}"))
            except DecisionRefused:
                chosen[int(job_id)] = None
        return chosen


@admin.register(ConnectorPause)
class ConnectorPauseAdmin(ScopedAdmin):
    list_display = ("provider", "tenant", "status_code", "paused_at", "cleared_at", "cleared_by")
    list_filter = ("provider", TenantFilter, ("cleared_at", admin.EmptyFieldListFilter))
    ordering = ("-paused_at",)
    readonly_fields = ("clear_link",)
    fields = ("tenant", "provider", "status_code", "reason", "operation", "paused_at", "cleared_at",
              "cleared_by", "clear_reason")

    def get_fields(self, request, obj=None):
        # The control only for those allowed to use it.
        if obj is None or not obj.active or access.refusal(request.user, "clear_pause", tenant=obj.tenant,
                                                           scope=access.request_scope(request)):
            return self.fields
        return ("clear_link", *self.fields)

    @admin.display(description="Operator decision")
    def clear_link(self, pause):
        url = reverse("admin:operations_connectorpause_clear", args=[pause.pk])
        return format_html('<a class="button" href="{}">Clear the pause…</a>', url)

    def get_urls(self):
        clear = self.admin_site.admin_view(self.clear_view)
        return [path("<int:object_id>/clear/", clear, name="operations_connectorpause_clear"), *super().get_urls()]

    def clear_view(self, request, object_id):
        """Clear a pause (credentials fixed) and retry the jobs it held back."""
        pause = access.get_visible_or_404(ConnectorPause.objects.all(), request.user, pk=object_id)
        refused = access.refusal(request.user, "clear_pause", tenant=pause.tenant)
        held = list(jobs_held_by_pause(pause)[:200])
        form = ClearPauseForm(request.POST or None, held=held)
        if request.method == "POST" and not refused and form.is_valid():
            chosen = form.chosen()
            try:
                _, retried = connector_pause_decide(pause_id=pause.pk, user=request.user,
                                                    note=form.cleaned_data["note"], retry=chosen)
            except DecisionRefused as exc:
                form.add_error(None, str(exc))
            else:
                skipped = len(chosen) - len(retried)
                moved = f"; {skipped} had changed since you saw them and were left as they are" if skipped else ""
                self.message_user(request, f"Cleared {pause}; retried {len(retried)} job(s){moved}.",
                                  messages.SUCCESS)
                return redirect("admin:operations_connectorpause_change", pause.pk)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Clear the pause of {pause.provider} for {pause.tenant}",
            "pause": pause,
            "form": form,
            "refused": refused,
        }
        return TemplateResponse(request, "admin/operations/connectorpause/clear.html", context,
                                status=403 if refused and request.method == "POST" else 200)
