"""`manage.py bench_gateway` runs against a real server and cleans up after
itself (its figures are printed, never asserted)."""

from io import StringIO

import pytest
from django.core.management import call_command

from company.models import Tenant
from gateway.models import Agent
from jobs.models import Job
from operations.models import Operation
from proving.models import BenchRow


@pytest.mark.django_db(transaction=True)
def test_bench_gateway_prints_its_figures_and_leaves_nothing_behind():
    out = StringIO()
    call_command("bench_gateway", clients=2, requests=3, operations=2000, repeat=2, server=["asgi", "runserver"],
                 stdout=out, stderr=StringIO())
    text = out.getvalue()
    # Each server in turn: the production one and runserver.
    assert "against the production server (uvicorn, durable.asgi)" in text and "against runserver" in text
    assert text.count("201×6") == 4 and text.count("POST /api/v1/proposals (new)") == 2
    # Beside the reference on the same server, in the same run: its row and the ratio.
    assert text.count("reference: ninja POST, one row") == 2 and text.count("proposal POST ÷ reference POST") == 2
    assert "GET /api/v1/proposals/{key}" in text and "200×6" in text
    assert "effect limit 1,000/24 h" in text and "EXPLAIN" in text
    assert not Job.objects.filter(tenant="bench-gateway").exists()
    assert not Operation.objects.filter(tenant="bench-gateway").exists()
    assert not BenchRow.objects.exists() and not Agent.objects.exists() and not Tenant.objects.filter(slug="bench-gateway").exists()


@pytest.mark.django_db
def test_the_reference_endpoint_is_not_served_by_the_site(client):
    from proving.bench_reference import REFERENCE_PATH

    response = client.post(REFERENCE_PATH, '{"name": "x"}', content_type="application/json")
    assert response.status_code == 404 and not BenchRow.objects.exists()
