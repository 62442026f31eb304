"""The business: tenants and the people who act for them (DESIGN §14).

`Tenant.slug` is the engine's `tenant` string: jobs, operations, timers and
outbox events carry it, and the tenant scope (`DURABLE_TENANT_SCOPE`) maps a
user's memberships onto it.
"""

from datetime import timedelta

from django.conf import settings
from django.db import models


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True, help_text="The engine's tenant string.")
    name = models.CharField(max_length=200)

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.name or self.slug


class Membership(models.Model):
    """A user acting for a tenant in one role. A user sees and acts on the
    tenants of their memberships only; a superuser sees all."""

    class Role(models.TextChoices):
        REVIEWER = "reviewer", "Reviewer"
        OPERATOR = "operator", "Operator"
        VIEWER = "viewer", "Viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")]

    def __str__(self):
        return f"{self.user} — {self.role} at {self.tenant.slug}"


class TenantPolicy(models.Model):
    """What a tenant lets run without a person (DESIGN §1: the agent proposes,
    the engine decides) and the business delays its timers use."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="policy")
    runs_without_review = models.JSONField(
        default=list, blank=True,
        help_text="Action names an agent's proposal may run without a reviewer, e.g. [\"company.send_quote\"].",
    )
    quote_follow_up_after = models.DurationField(
        default=timedelta(days=7), help_text="How long after a quote was sent a missing reply prompts a follow-up."
    )
    invoice_reminder_after = models.DurationField(
        default=timedelta(days=1), help_text="How long after 09:00 UTC on the due date an open invoice is reminded."
    )
    review_digest_every = models.DurationField(
        null=True, blank=True, default=timedelta(days=1),
        help_text="Each reviewer gets at most one email per period listing what waits for review; empty: none.",
    )

    class Meta:
        verbose_name_plural = "tenant policies"

    def __str__(self):
        return f"policy of {self.tenant.slug}"


class ReviewPolicy(models.Model):
    """How a tenant's reviews of one action (or, with `action` empty, of
    every action without its own row) are held to time and to four eyes
    (`company.review_policy` hands these to the engine as `ReviewTerms`)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="review_policies")
    action = models.CharField(max_length=100, blank=True, default="",
                              help_text="The action this applies to; empty: the tenant's default.")
    approvals = models.PositiveSmallIntegerField(
        default=1, choices=[(1, "One reviewer"), (2, "Two different reviewers (four eyes)")])
    due_after = models.DurationField(null=True, blank=True,
                                     help_text="From entering review to overdue; empty: never due.")
    reject_after = models.DurationField(null=True, blank=True,
                                        help_text="From overdue to a rejection by the policy; empty: never.")
    reset_due_on_correction = models.BooleanField(
        default=False, help_text="A correction awaiting its second approval starts the clock again.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "action"], name="review_policy_unique_tenant_action"),
            models.CheckConstraint(condition=models.Q(approvals__in=[1, 2]), name="review_policy_approvals_1_or_2"),
        ]
        verbose_name_plural = "review policies"

    def __str__(self):
        return f"review policy of {self.tenant.slug} for {self.action or 'every action'}"


class Customer(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="customers")
    email = models.EmailField()
    name = models.CharField(max_length=200)
    # Set when the customer asked not to be chased: no reminder goes out.
    suppressed = models.BooleanField(default=False)
    suppressed_reason = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["tenant", "email"]
        constraints = [models.UniqueConstraint(fields=["tenant", "email"], name="customer_unique_tenant_email")]

    def __str__(self):
        # The name alone: a title, a breadcrumb or a history row names the
        # customer to readers who see the address masked (company.admin).
        return self.name


class Quote(models.Model):
    class Status(models.TextChoices):
        DRAFT = "DRAFT", "Draft"
        PENDING_APPROVAL = "PENDING_APPROVAL", "Pending approval"
        APPROVED = "APPROVED", "Approved"
        SENT = "SENT", "Sent"
        ACCEPTED = "ACCEPTED", "Accepted"
        DECLINED = "DECLINED", "Declined"
        EXPIRED = "EXPIRED", "Expired"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotes")
    number = models.CharField(max_length=40)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="quotes")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.DRAFT)
    # Bumped by every change; a timer set for one version re-reads a newer one.
    version = models.PositiveIntegerField(default=1)
    approved_by = models.CharField(max_length=200, blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    # The follow-up email the provider accepted (DESIGN §18: a business
    # effect is recorded on its business record, which outlives the job
    # that sent it; retention deletes finished jobs).
    followed_up_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "number"]
        constraints = [models.UniqueConstraint(fields=["tenant", "number"], name="quote_unique_tenant_number")]
        indexes = [models.Index(fields=["tenant", "status"], name="quote_tenant_status")]
        # A decision (DESIGN §14): the plain `change` permission does not approve.
        permissions = [("approve_quote", "Can approve quotes (their emails are then sent)")]

    def __str__(self):
        return f"{self.number} [{self.status}]"


class Invoice(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invoices")
    number = models.CharField(max_length=40)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="invoices")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    balance = models.DecimalField(max_digits=12, decimal_places=2, help_text="What is still owed; 0 means paid.")
    due_date = models.DateField()
    terms = models.CharField(max_length=100, default="Net 30", help_text="Payment terms, quoted in reminders.")
    # Bumped by every change that matters to a reminder (balance, due date,
    # terms): a reminder timer set for an older version re-plans itself.
    version = models.PositiveIntegerField(default=1)
    # The reminder the provider accepted, and its reference: one reminder per
    # invoice for the invoice's life, whatever retention did to the job that
    # sent it (DESIGN §18).
    reminded_at = models.DateTimeField(null=True, blank=True)
    reminder_reference = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "number"]
        constraints = [models.UniqueConstraint(fields=["tenant", "number"], name="invoice_unique_tenant_number")]

    def __str__(self):
        return f"{self.number} (balance {self.balance})"

    @property
    def is_paid(self) -> bool:
        return self.balance <= 0


class Proposal(models.Model):
    """Who proposed which work and why (DESIGN §1). The job it created
    carries the same facts in its creation event (contract C1)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="proposals")
    proposed_by = models.CharField(max_length=200, help_text="e.g. agent:rules")
    action = models.CharField(max_length=200)
    job_key = models.CharField(max_length=255, help_text="The business key: proposing it again proposes nothing.")
    subject_type = models.CharField(max_length=100, blank=True, default="")
    subject_id = models.CharField(max_length=100, blank=True, default="")
    subject_version = models.PositiveIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    rationale = models.TextField()
    needs_review = models.BooleanField(help_text="False when the tenant's policy let it run at once.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["tenant", "job_key"], name="proposal_unique_tenant_key")]

    def __str__(self):
        return f"{self.proposed_by}: {self.action} {self.job_key}"
