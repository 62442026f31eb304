"""`manage.py seed_demo` goes through the services and is idempotent."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from company.models import Customer, Invoice, Quote, Tenant
from jobs.models import OutboxEvent

pytestmark = pytest.mark.django_db


def test_seed_demo_twice_is_harmless_and_creates_no_users(capsys):
    call_command("seed_demo", "--tenant", "studio", "--quotes", "2", "--invoices", "3")
    assert "approved 2 quote(s), issued 3 invoice(s)" in capsys.readouterr().out
    events = OutboxEvent.objects.count()
    call_command("seed_demo", "--tenant", "studio", "--quotes", "2", "--invoices", "3")
    assert "approved 0 quote(s), issued 0 invoice(s)" in capsys.readouterr().out

    assert OutboxEvent.objects.count() == events
    assert sorted(Quote.objects.values_list("number", "status")) == [("Q-0001", "APPROVED"), ("Q-0002", "APPROVED")]
    assert OutboxEvent.objects.filter(event_type="quote.approved").count() == 2
    assert OutboxEvent.objects.filter(event_type="invoice.issued").count() == 3
    assert Invoice.objects.filter(tenant__slug="studio").count() == 3
    assert Customer.objects.filter(tenant__slug="studio").count() == 6
    assert not get_user_model().objects.exists()


def test_seed_demo_refuses_a_negative_count():
    with pytest.raises(CommandError, match="argument --quotes: must be a whole number at least 0"):
        call_command("seed_demo", "--quotes", "-1")
    assert not Quote.objects.exists()


def test_seed_demo_refuses_to_run_in_production(settings):
    settings.PRODUCTION = True
    with pytest.raises(CommandError, match="refuses to run with DURABLE_PRODUCTION=1"):
        call_command("seed_demo", "--tenant", "live")
    assert not Tenant.objects.exists() and not Quote.objects.exists()
