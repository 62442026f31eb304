"""Who the review emails go to: the tenant's current reviewers — a reviewer's
membership there and the permission to review — asked again when each email
is sent, so a viewer, an operator, or a reviewer demoted after the digest was
planned gets nothing; and the demo's users have addresses to send to."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Group

from company import review_notify
from company.models import Membership, Tenant
from company.review_notify import NOTIFY_REVIEWER, review_digests_plan
from company.review_policy import review_policy_set
from company.services import tenant_policy_set
from jobs.models import Job
from jobs.store import Store
from tests.console.conftest import ensure_roles
from tests.factories import MembershipFactory, TenantFactory

from .support import run_one
from .test_review_digest import waiting_item

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def staff():
    """studio's people, each with an email address: two reviewers, a viewer,
    an operator, and one with a reviewer's membership but a viewer's group
    (no permission to review)."""
    ensure_roles()
    tenant = TenantFactory(slug="studio")

    def person(name, group, role):
        return MembershipFactory(user__username=name, user__email=f"{name}@example.com",
                                 user__groups=[Group.objects.get(name=group)], tenant=tenant, role=role).user

    return {"rita": person("rita", "reviewers", "reviewer"), "rosa": person("rosa", "reviewers", "reviewer"),
            "vera": person("vera", "viewers", "viewer"), "otto": person("otto", "operators", "operator"),
            "ria": person("ria", "viewers", "reviewer")}


@pytest.fixture
def sent(monkeypatch):
    """The emails handed to the provider (through the operation protocol's send)."""
    emails = []

    def send_once(ctx, *, step, render):
        emails.append(render())
        return SimpleNamespace(provider_reference=f"ref-{len(emails)}", how="sent")

    monkeypatch.setattr(review_notify, "_send_once", send_once)
    return emails


def run_all(action):
    store, outcomes = Store(), []
    while (job := store.claim_next("test-worker", actions=[action], ttl=60)) is not None:
        outcomes.append(run_one(store, job))
    return outcomes


def test_digests_go_to_the_tenants_reviewers_only(staff, sent):
    tenant_policy_set(tenant=Tenant.objects.get(slug="studio"), review_digest_every=timedelta(hours=6))
    waiting_item()
    assert review_digests_plan(now=T0) == 1
    run_all("company.plan_review_digests")
    run_all(NOTIFY_REVIEWER)
    assert sorted(email["to"] for email in sent) == ["rita@example.com", "rosa@example.com"]


def test_a_reviewer_demoted_after_the_digest_was_planned_gets_none(staff, sent):
    tenant_policy_set(tenant=Tenant.objects.get(slug="studio"), review_digest_every=timedelta(hours=6))
    waiting_item()
    review_digests_plan(now=T0)
    run_all("company.plan_review_digests")
    assert Job.objects.filter(action=NOTIFY_REVIEWER).count() == 2
    # rosa is moved from the reviewers' group to the viewers'; rita's role in studio becomes viewer.
    staff["rosa"].groups.set([Group.objects.get(name="viewers")])
    Membership.objects.filter(user=staff["rita"]).update(role="viewer")

    outcomes = run_all(NOTIFY_REVIEWER)
    assert sent == []
    assert all(outcome["sent"] is False and "no longer a reviewer" in outcome["why"] for outcome in outcomes)


def test_an_overdue_item_is_told_to_the_tenants_reviewers_only(staff, sent):
    from tests.console.test_review_policy import run_escalations

    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=timedelta(hours=1))
    Store().enqueue_once("studio", "q-1", action="connectors.send_email",
                         payload={"to": "ada@example.com", "subject": "Your quote", "body": "Hello"},
                         actor="agent:rules", review="proposed by agent:rules", now=T0)
    run_escalations(T0 + timedelta(hours=1))
    staff["rosa"].groups.set([Group.objects.get(name="viewers")])  # demoted after the item went overdue
    run_all(NOTIFY_REVIEWER)
    assert [email["to"] for email in sent] == ["rita@example.com"]


def test_the_demo_users_have_email_addresses(settings):
    from company.management.commands.demo import Command

    ensure_roles()
    command = Command()
    command.tenant_slug = "demo"
    command._users("demo-password")
    from django.contrib.auth import get_user_model

    users = {u.username: u.email for u in get_user_model().objects.all()}
    assert set(users) == {"admin", "reviewer", "operator", "staff"}
    assert all(users.values()), users
    assert [u.username for u in review_notify.reviewers_of("demo")] == ["reviewer"]
