"""The business records in the admin (DESIGN §14, as every admin page of the
project): read-only lists and pages within the user's tenants (the engine's
`ScopedAdmin`: another tenant's record answers 404, filters list the user's
tenants). Records change through the services; the one decision taken here,
approving quotes, goes through `company.review.quote_approve_by` (permission
`company.approve_quote` + a reviewer's role in the quote's tenant; its email
is then sent by a worker)."""

import json

from django.contrib import admin, messages
from django.db.models import BooleanField, Q, Value
from django.db.models.expressions import ExpressionWrapper

from jobs import access
from jobs.access import DecisionRefused
from jobs.admin_scope import ActionFilter, ScopedAdmin, TenantFilter
from jobs.models import Job
from jobs.selectors import job_by_key
from review.masking import MASK, job_masker

from .models import Customer, Invoice, Proposal, Quote, ReviewPolicy, TenantPolicy
from .review import TENANT_FIELD, quote_approve_by, quote_send_approvals
from .services import QuoteStateError


class CompanyAdmin(ScopedAdmin):
    """A business record of the user's tenants; the tenant is a `Tenant` row.

    A customer's address is the value the email jobs send to, and those
    mask it for a reader who sees the tenant's sensitive fields masked (a
    viewer, `access.sees_sensitive`): so do the business records — lists,
    pages and searches show such a reader the customer's name, never the
    address (`masked_fields`: the field → what the reader sees instead)."""

    tenant_field = TENANT_FIELD
    list_select_related = ("tenant",)
    masked_fields = {"email": "shown_email", "customer": "shown_customer"}
    sensitive_search_fields = ("email", "customer__email")

    def get_queryset(self, request):
        # Each row knows whether this reader sees its tenant's sensitive
        # values masked (the list's columns take no request).
        masked = access.masked_tenants(access.request_scope(request))
        condition = ExpressionWrapper(Q(tenant__slug__in=masked), output_field=BooleanField()) if masked else Value(False)
        return super().get_queryset(request).annotate(reader_sees_masked=condition)

    def _shown(self, names, masked: bool):
        shown = [name for name in names if name not in self.masked_fields.values()]
        return [self.masked_fields.get(name, name) if masked else name for name in shown]

    def get_list_display(self, request):
        masked = bool(access.masked_tenants(access.request_scope(request)))
        return self._shown(super().get_list_display(request), masked)

    def get_fields(self, request, obj=None):
        return self._shown(super().get_fields(request, obj), getattr(obj, "reader_sees_masked", False))

    @admin.display(description="Email")
    def shown_email(self, record):
        return MASK if record.reader_sees_masked else record.email

    @admin.display(description="Customer")
    def shown_customer(self, record):
        customer = record.customer
        return customer.name if record.reader_sees_masked else f"{customer.name} <{customer.email}>"


@admin.register(Customer)
class CustomerAdmin(CompanyAdmin):
    list_display = ["email", "name", "tenant", "suppressed", "suppressed_reason"]
    list_filter = ["suppressed", TenantFilter]
    search_fields = ["email", "name"]
    readonly_fields = ["shown_email"]


@admin.register(Quote)
class QuoteAdmin(CompanyAdmin):
    list_display = ["number", "tenant", "customer", "amount", "status", "version", "sent_at", "answered_at"]
    list_filter = ["status", TenantFilter]
    search_fields = ["number", "customer__email"]
    readonly_fields = ["shown_customer"]
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
    readonly_fields = ["shown_customer"]


@admin.register(Proposal)
class ProposalAdmin(CompanyAdmin):
    list_display = ["job_key", "action", "proposed_by", "needs_review", "tenant", "created_at"]
    list_filter = ["needs_review", ActionFilter, TenantFilter]
    search_fields = ["job_key", "rationale"]
    # The rationale may quote the payload's sensitive values (an address).
    masked_fields = {"payload": "shown_payload", "rationale": "shown_rationale"}
    sensitive_search_fields = ("rationale",)
    readonly_fields = ["shown_payload", "shown_rationale"]

    @staticmethod
    def _masker(proposal):
        # The job it made knows every value the payload held (corrections);
        # one deleted by retention leaves the proposal's own payload.
        job = job_by_key(tenant=proposal.tenant.slug, key=proposal.job_key)
        job = job or Job(action=proposal.action, payload=proposal.payload)
        return job_masker(job, sees_sensitive=False, also=[proposal.payload])

    @admin.display(description="Payload")
    def shown_payload(self, proposal):
        return json.dumps(self._masker(proposal).data(proposal.payload), indent=2, ensure_ascii=False)

    @admin.display(description="Rationale")
    def shown_rationale(self, proposal):
        return self._masker(proposal).text(proposal.rationale)


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
