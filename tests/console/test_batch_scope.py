"""A decision batch's page is its author's, and that of whoever sees every
tenant it touched: another tenant's reviewer reads none of it, not even an
empty preview's (batch ids are sequential); a viewer reads the filters it was
chosen by with the values they see masked elsewhere hidden."""

import pytest

from jobs.models import DecisionBatch
from review.masking import MASK

from .test_queues import preview, proposed

pytestmark = pytest.mark.django_db


def test_another_tenants_reviewer_cannot_open_an_empty_previews_batch(client, people):
    client.force_login(people["reviewer"])
    batch, _ = preview(client, q="nothing-matches-this")
    assert batch.items == [] and batch.tenants == []
    assert client.get(f"/admin/console/batches/{batch.pk}/").status_code == 200
    client.force_login(people["other"])
    assert client.get(f"/admin/console/batches/{batch.pk}/").status_code == 404
    client.force_login(people["viewer"])
    assert client.get(f"/admin/console/batches/{batch.pk}/").status_code == 404


def test_another_tenants_reviewer_cannot_open_a_batch_of_studio(client, people):
    proposed("bulk-1")
    client.force_login(people["reviewer"])
    batch, _ = preview(client, q="bulk")
    assert batch.tenants == ["studio"]
    client.force_login(people["other"])
    assert client.get(f"/admin/console/batches/{batch.pk}/").status_code == 404


def test_a_viewer_reads_a_batchs_filters_masked(client, people):
    proposed("remind-1", to="ana-secret@example.com")
    client.force_login(people["reviewer"])
    batch, _ = preview(client, q="ana-secret@example.com")
    assert DecisionBatch.objects.get(pk=batch.pk).tenants == ["studio"]
    assert "ana-secret@example.com" in client.get(f"/admin/console/batches/{batch.pk}/").content.decode()
    client.force_login(people["viewer"])
    page = client.get(f"/admin/console/batches/{batch.pk}/").content.decode()
    assert "ana-secret" not in page and f"q={MASK}" in page
