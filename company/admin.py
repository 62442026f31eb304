"""The business records in the admin (DESIGN §14, as every admin page of the
project): read-only lists and pages within the user's tenants (the engine's
`ScopedAdmin`: another tenant's record answers 404, filters list the user's
tenants). Records change through the services; the one decision taken here,
approving quotes, goes through `company.review.quote_approve_by` (permission
`company.approve_quote` + a reviewer's role in the quote's tenant; its email
is then sent by a worker)."""

from django.contrib import admin, messages

from jobs.access import DecisionRefused
from jobs.admin_scope import ActionFilter, ScopedAdmin, TenantFilter

from .models import Customer, Invoice, Proposal, Quote, ReviewPolicy, TenantPolicy
from .review import TENANT_FIELD, quote_approve_by, quote_send_approvals
from .services import QuoteStateError


class CompanyAdmin(ScopedAdmin):
    """A business record of the user's tenants; the tenant is a `Tenant` row."""

    tenant_field = TENANT_FIELD
    list_select_related = ("tenant",)


@admin.register(Customer)
class CustomerAdmin(CompanyAdmin):
    list_display = ["email", "name", "tenant", "suppressed", "suppressed_reason"]
    list_filter = ["suppressed", TenantFilter]
    search_fields = ["email", "name"]


@admin.register(Quote)
class QuoteAdmin(CompanyAdmin):
    list_display = ["number", "tenant", "customer", "amount", "status", "version", "sent_at", "answered_at"]
    list_filter = ["status", TenantFilter]
    search_fields = ["number", "customer__email"]
    list_select_related = ("tenant", "customer")
    actions = ["approve"]

    def has_approve_permission(self, request):
        return request.user.has_perm("company.approve_quote")

    @admin.action(description="Approve the selected quotes (their emails are sent by a worker)",
                  permissions=["approve"])
    def approve(self, request, queryset):
        for quote in queryset:
            try:
                quote_approve_by(quote_id=quote.pk, user=request.user)
            except (DecisionRefused, QuoteStateError) as exc:
                self.message_user(request, f"{quote.number}: {exc}", messages.ERROR)
            else:
                required = quote_send_approvals(quote.tenant.slug)
                self.message_user(request, f"quote {quote.number} approved; its email is queued" if required == 1 else
                                  f"quote {quote.number} approved; its email waits for a second reviewer's "
                                  f"approval in the review queue (its review policy needs {required} approvals)")


@admin.register(Invoice)
class InvoiceAdmin(CompanyAdmin):
    # Balances, due dates and terms change through the invoice services,
    # which bump the version the reminder timers re-read.
    list_display = ["number", "tenant", "customer", "amount", "balance", "due_date", "terms", "version"]
    list_filter = [TenantFilter]
    search_fields = ["number", "customer__email"]
    list_select_related = ("tenant", "customer")


@admin.register(Proposal)
class ProposalAdmin(CompanyAdmin):
    list_display = ["job_key", "action", "proposed_by", "needs_review", "tenant", "created_at"]
    list_filter = ["needs_review", ActionFilter, TenantFilter]
    search_fields = ["job_key", "rationale"]


@admin.register(TenantPolicy)
class TenantPolicyAdmin(CompanyAdmin):
    # A policy changes through `tenant_policy_set`.
    list_display = ["tenant", "runs_without_review", "quote_follow_up_after", "invoice_reminder_after",
                    "review_digest_every"]
    list_filter = [TenantFilter]


@admin.register(ReviewPolicy)
class ReviewPolicyAdmin(CompanyAdmin):
    # A review policy changes through `company.review_policy.review_policy_set`.
    list_display = ["tenant", "action", "approvals", "due_after", "reject_after", "reset_due_on_correction"]
    list_filter = [TenantFilter]
