"""Approving a quote in the admin goes through quote_approve (its outbox
event enqueues the email)."""

from decimal import Decimal

import pytest

from company.services import customer_ensure, quote_create, tenant_ensure
from jobs.models import OutboxEvent
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_approving_a_quote_in_the_admin_emits_its_event_once(client):
    admin = UserFactory(username="boss", superuser=True)
    client.force_login(admin)
    tenant = tenant_ensure(slug="studio")
    customer = customer_ensure(tenant=tenant, email="ada@example.com", name="Ada")
    quote = quote_create(tenant=tenant, number="Q-9", customer=customer, amount=Decimal("10"))

    for _ in range(2):
        response = client.post("/admin/company/quote/", {"action": "approve", "_selected_action": [quote.pk]},
                               follow=True)
        assert response.status_code == 200
    quote.refresh_from_db()
    assert (quote.status, quote.approved_by) == ("APPROVED", "boss")
    assert OutboxEvent.objects.filter(event_type="quote.approved").count() == 1
    assert "is APPROVED; quote.approved needs one of" in response.content.decode()
