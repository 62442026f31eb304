"""The tenant scope (DESIGN §14, setting `DURABLE_TENANT_SCOPE`): which
tenants a user may see and the role held in each, from `Membership`.

The engine's console asks only this function (through `jobs.access`), so a
deployment with another notion of people and tenants replaces one function.
"""

from jobs.access import Scope

from .models import Membership, Tenant


def tenant_scope(user) -> Scope:
    """A superuser sees every tenant (every job, even of tenants without a
    `Tenant` row); anyone else the tenants of their memberships, in the role
    the membership gives."""
    if user.is_superuser:
        return Scope(roles={slug: "superuser" for slug in Tenant.objects.values_list("slug", flat=True)},
                     everything=True)
    return Scope(roles=dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role")))
