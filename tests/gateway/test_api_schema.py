"""The API against its own OpenAPI document (schemathesis, property-based):
for any request generated from the document — valid and invalid — no
server error, and every answer matches what the document says (status,
content type, headers, body). Derandomized and bounded (the hypothesis
profile of tests/conftest.py), so it is repeatable and fast."""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from company.services import tenant_ensure
from gateway.keys import key_generate
from gateway.models import ApiKey
from gateway.services import agent_create

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance, negative_data_rejection]


# Known before any database exists: schemathesis builds some cases while collecting.
KEY = key_generate()


@schema.auth()
class AgentKey:
    """The test agent's key on every request: schemathesis knows the request
    is authenticated, so its invalid cases vary the request, not the key."""

    def get(self, case, context):
        return KEY.key

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def agent_key(db):
    # The WSGI handler is called directly (no Django test client), so keep
    # it from closing the test's connection at each request, as the test
    # client does.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    tenant = tenant_ensure(slug="studio")
    agent, _ = agent_create(tenant=tenant, name="fuzzer", actor="test", proposals_per_minute=1000)
    ApiKey.objects.create(agent=agent, prefix=KEY.prefix, secret_hash=KEY.secret_hash)
    yield KEY.key
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@hypothesis_settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_the_api_keeps_its_documented_contract_for_any_input(case, agent_key):
    case.call_and_validate(checks=CHECKS)
