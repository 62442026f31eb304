"""The business: tenants and the people who act for them (DESIGN §14).

`Tenant.slug` is the engine's `tenant` string: jobs, operations, timers and
outbox events carry it, and the tenant scope (`DURABLE_TENANT_SCOPE`) maps a
user's memberships onto it.
"""

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
