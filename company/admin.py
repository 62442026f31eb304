"""The business records in the admin: lists and pages only; every change a
person makes here goes through a service (approving a quote emits its outbox
event, which sends the email through a worker)."""

from django.contrib import admin, messages

from .models import Customer, Invoice, Proposal, Quote, TenantPolicy
from .services import QuoteStateError, quote_approve


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ["email", "name", "tenant", "suppressed", "suppressed_reason"]
    list_filter = ["suppressed"]
    search_fields = ["email", "name"]
    readonly_fields = ["suppressed", "suppressed_reason"]


@admin.register(Quote)
class QuoteAdmin(admin.ModelAdmin):
    list_display = ["number", "tenant", "customer", "amount", "status", "version", "sent_at", "answered_at"]
    list_filter = ["status"]
    search_fields = ["number", "customer__email"]
    readonly_fields = ["status", "version", "approved_by", "sent_at", "answered_at"]
    actions = ["approve"]

    @admin.action(description="Approve the selected quotes (their emails are sent by a worker)",
                  permissions=["change"])
    def approve(self, request, queryset):
        for quote in queryset:
            try:
                quote_approve(quote=quote, actor=request.user.get_username())
            except QuoteStateError as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(request, f"quote {quote.number} approved; its email is queued")


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ["number", "tenant", "customer", "amount", "balance", "due_date", "terms", "version"]
    search_fields = ["number", "customer__email"]
    readonly_fields = ["balance", "version"]

    def has_change_permission(self, request, obj=None):
        # Balances, due dates and terms change through the invoice services,
        # which bump the version the reminder timers re-read.
        return False


@admin.register(Proposal)
class ProposalAdmin(admin.ModelAdmin):
    list_display = ["job_key", "action", "proposed_by", "needs_review", "tenant", "created_at"]
    list_filter = ["needs_review", "proposed_by", "action"]
    search_fields = ["job_key", "rationale"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(TenantPolicy)
class TenantPolicyAdmin(admin.ModelAdmin):
    list_display = ["tenant", "runs_without_review", "quote_follow_up_after", "invoice_reminder_after"]
