"""The company admin obeys DESIGN §14 like every admin page: a user sees the
business records of their tenants only (another tenant's answers 404), and
approving a quote is a decision that needs the permission
`company.approve_quote` AND a reviewer's membership in the quote's tenant —
not the plain `change` permission — and is recorded in the admin history."""

from datetime import date
from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission
from django.http import Http404

from company.models import Quote
from company.review import quote_approve_by
from company.services import (
    customer_ensure,
    invoice_issue,
    proposal_submit,
    quote_create,
    quote_submit,
    tenant_ensure,
)
from jobs.access import DecisionRefused
from jobs.models import OutboxEvent
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

MODELS = ["customer", "quote", "invoice", "proposal", "tenantpolicy"]


def business(slug: str) -> Quote:
    """A tenant with a customer, an invoice, a proposal and a quote pending approval."""
    tenant = tenant_ensure(slug=slug)
    customer = customer_ensure(tenant=tenant, email=f"buyer@{slug}.example", name=f"Buyer of {slug}")
    invoice_issue(tenant=tenant, number=f"INV-{slug}", customer=customer, amount=Decimal("10"),
                  due_date=date(2030, 1, 1), terms="Net 30", actor="test")
    proposal_submit(tenant=tenant, proposed_by="agent:rules", action="jobs.noop", job_key=f"proposal-{slug}",
                    rationale=f"rationale of {slug}")
    quote = quote_create(tenant=tenant, number=f"Q-{slug}", customer=customer, amount=Decimal("100"))
    return quote_submit(quote=quote, actor="sales")


def person(name: str, tenant: str, role: str, group: str):
    return MembershipFactory(user__username=name, user__groups=[Group.objects.get(name=group)],
                             tenant=tenant_ensure(slug=tenant), role=role).user


def approve_in_admin(client, quote):
    return client.post("/admin/company/quote/", {"action": "approve", "_selected_action": [quote.pk]}, follow=True)


def approvals() -> int:
    return OutboxEvent.objects.filter(event_type="quote.approved").count()


def test_every_company_list_and_page_shows_only_the_users_tenants(client):
    business("studio")
    theirs = business("acme")
    client.force_login(person("rita", "studio", "reviewer", "reviewers"))
    for model in MODELS:
        listing = client.get(f"/admin/company/{model}/")
        assert listing.status_code == 200, model
        page = listing.content.decode()
        assert "acme" not in page.replace("?tenant=acme", ""), model
        assert "?tenant=studio" in page and "?tenant=acme" not in page, model  # the tenant filter
        if model != "tenantpolicy":  # the only one without a search
            assert client.get(f"/admin/company/{model}/?q=acme").context["cl"].result_count == 0, model
    assert "Q-studio" in client.get("/admin/company/quote/").content.decode()
    assert client.get(f"/admin/company/quote/{theirs.pk}/change/").status_code == 404
    assert client.get(f"/admin/company/customer/{theirs.customer_id}/change/").status_code == 404
    assert client.get(f"/admin/company/tenantpolicy/{theirs.tenant.policy.pk}/change/").status_code == 404
    # Records change through the services: no add, edit or delete here.
    assert client.get("/admin/company/customer/add/").status_code == 403


def test_a_reviewer_approves_a_quote_of_their_tenant_and_the_admin_history_tells_it(client):
    quote = business("studio")
    client.force_login(person("rita", "studio", "reviewer", "reviewers"))

    response = approve_in_admin(client, quote)

    assert "Q-studio approved; its email is queued" in response.content.decode()
    quote.refresh_from_db()
    assert (quote.status, quote.approved_by) == ("APPROVED", "rita")
    assert approvals() == 1
    entry = LogEntry.objects.get(object_id=str(quote.pk), content_type__model="quote")
    assert entry.user.username == "rita" and "Approved quote Q-studio" in entry.get_change_message()


def test_another_tenants_quote_is_not_approved_by_a_crafted_post(client):
    theirs = business("acme")
    rita = person("rita", "studio", "reviewer", "reviewers")
    # Every company permission there is, and a reviewer's role — in studio only.
    rita.user_permissions.add(*Permission.objects.filter(content_type__app_label="company"))
    client.force_login(rita)

    approve_in_admin(client, theirs)

    theirs.refresh_from_db()
    assert theirs.status == "PENDING_APPROVAL" and approvals() == 0
    with pytest.raises(Http404):
        quote_approve_by(quote_id=theirs.pk, user=rita)


def test_approving_needs_the_permission_and_a_reviewers_role_each_on_its_own(client):
    quote = business("studio")
    # The role without the permission (a viewer's group), and the old way in: `change_quote`.
    no_permission = person("vic", "studio", "reviewer", "viewers")
    no_permission.user_permissions.add(Permission.objects.get(codename="change_quote"))
    # The permission without the role (a viewer of this tenant in the reviewers' group).
    no_role = person("val", "studio", "viewer", "reviewers")

    client.force_login(no_permission)
    actions = client.get("/admin/company/quote/").context["action_form"]
    assert actions is None or "approve" not in [name for name, _ in actions.fields["action"].choices]
    for user in (no_permission, no_role):
        client.force_login(user)
        approve_in_admin(client, quote)
    quote.refresh_from_db()
    assert quote.status == "PENDING_APPROVAL" and approvals() == 0

    with pytest.raises(DecisionRefused, match=r"company\.approve_quote"):
        quote_approve_by(quote_id=quote.pk, user=no_permission)
    with pytest.raises(DecisionRefused, match="your role in tenant studio is viewer"):
        quote_approve_by(quote_id=quote.pk, user=no_role)
    client.force_login(no_role)
    refused = approve_in_admin(client, quote).content.decode()
    assert "your role in tenant studio is viewer" in refused
    assert Quote.objects.get(pk=quote.pk).status == "PENDING_APPROVAL" and approvals() == 0


def test_the_migration_gives_the_approval_permission_to_reviewers_only():
    perms = {g.name: {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all()}
             for g in Group.objects.filter(name__in=["reviewers", "operators", "viewers"])}
    assert "company.approve_quote" in perms["reviewers"]
    assert "company.approve_quote" not in perms["operators"] | perms["viewers"]
    for group in perms.values():
        assert {f"company.view_{model}" for model in MODELS} <= group
        assert not {p for p in group if p.startswith("company.") and not p.split(".")[1].startswith("view_")
                    and p != "company.approve_quote"}


def test_a_superuser_sees_and_approves_every_tenants_quotes(client):
    theirs = business("acme")
    client.force_login(UserFactory(username="boss", superuser=True))
    assert "Q-acme" in client.get("/admin/company/quote/").content.decode()
    approve_in_admin(client, theirs)
    assert Quote.objects.get(pk=theirs.pk).status == "APPROVED"
