"""The OpenAPI document is one a generator can use (DESIGN §15): it names its
`servers` (paths are relative to the API's root), ties each action's payload
to its `action` (a discriminated union) and calls the cursor opaque; a
client generated from it by openapi-python-client proposes, reads and lists
against a running server with the README's base URL."""

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from company.services import tenant_ensure
from connectors.registry import provider_names
from gateway.services import agent_create
from jobs.actions import schema_actions
from jobs.payloads import payload_json_schema

from .conftest import EMAIL


def test_the_document_names_its_server_and_its_paths_are_relative_to_it(client, db):
    document = client.get("/api/v1/openapi.json").json()
    assert document["servers"][0]["url"] == "/api/v1"
    assert set(document["paths"]) == {"/actions", "/proposals", "/proposals/{key}"}
    operations = {op["operationId"] for path in document["paths"].values() for op in path.values()}
    assert operations == {"list_actions", "propose", "read_proposal", "list_proposals"}


def test_each_actions_payload_is_tied_to_its_action_by_a_discriminated_union(client, db):
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    union = schemas["ProposalIn"]
    mapping = union["discriminator"]["mapping"]
    assert union["discriminator"]["propertyName"] == "action" and set(mapping) == set(schema_actions())
    assert [alternative["$ref"] for alternative in union["oneOf"]] == list(mapping.values())
    for action, ref in mapping.items():
        variant = schemas[ref.rsplit("/", 1)[1]]
        assert variant["properties"]["action"]["const"] == action
        payload = variant["properties"]["payload"]
        assert set(payload["properties"]) == set(payload_json_schema(action)["properties"])
        # A provider the document offers is one a proposal may name (no schema-valid 422).
        provider = payload["properties"].get("provider")
        if provider is not None:
            assert provider["anyOf"][0]["enum"] == provider_names()


def test_the_cursor_is_described_as_opaque(client, db):
    document = client.get("/api/v1/openapi.json").json()
    cursor = next(p for p in document["paths"]["/proposals"]["get"]["parameters"] if p["name"] == "cursor")
    assert "opaque" in cursor["description"].lower()
    assert "opaque" in document["components"]["schemas"]["ProposalPage"]["properties"]["next"]["description"]


@pytest.fixture
def generated_client(live_server, tmp_path):
    """A client package generated from the document the running server serves."""
    base_url = f"{live_server.url}/api/v1"  # the README's API root: http://127.0.0.1:8000/api/v1
    spec = tmp_path / "openapi.json"
    spec.write_bytes(httpx.get(f"{base_url}/openapi.json").raise_for_status().content)
    generator = Path(sys.executable).with_name("openapi-python-client")
    environment = {**os.environ, "PATH": f"{generator.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run([str(generator), "generate", "--path", str(spec), "--output-path",
                    str(tmp_path / "durable_client"), "--meta", "none"],
                   check=True, capture_output=True, env=environment, timeout=240)
    sys.path.insert(0, str(tmp_path))
    try:
        yield base_url, importlib.import_module("durable_client")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "durable_client" or n.startswith("durable_client.")]:
            del sys.modules[name]
        shutil.rmtree(tmp_path / "durable_client", ignore_errors=True)


@pytest.mark.django_db(transaction=True)
def test_a_generated_client_proposes_reads_and_lists_with_the_readmes_base_url(generated_client):
    base_url, package = generated_client
    _, issued = agent_create(tenant=tenant_ensure(slug="studio"), name="generated", actor="t")
    api = type("Operations", (), {name: importlib.import_module(f"durable_client.api.default.{name}")
                                   for name in ("list_actions", "propose", "read_proposal", "list_proposals")})
    models = importlib.import_module("durable_client.models")
    client = package.AuthenticatedClient(base_url=base_url, token=issued.key)

    actions = api.list_actions.sync_detailed(client=client)
    assert actions.status_code == 200 and "connectors.send_email" in {a.name for a in actions.parsed}

    body = models.ProposalOfConnectorsSendEmail.from_dict(
        {"action": "connectors.send_email", "key": "welcome-ada-1", "rationale": "asked", "payload": EMAIL})
    created = api.propose.sync_detailed(client=client, body=body)
    assert created.status_code == 201, created.content
    assert created.parsed.key == "welcome-ada-1" and created.parsed.created is True
    assert created.parsed.created_at.utcoffset().total_seconds() == 0
    assert json.loads(created.content)["created_at"].endswith("Z")

    read = api.read_proposal.sync_detailed(client=client, key="welcome-ada-1")
    assert read.status_code == 200 and read.parsed.action == "connectors.send_email"
    assert read.parsed.links.console.startswith("/admin/console/jobs/")

    page = api.list_proposals.sync_detailed(client=client)
    assert page.status_code == 200 and [p.key for p in page.parsed.items] == ["welcome-ada-1"]

    missing = api.read_proposal.sync_detailed(client=client, key="nobody-proposed-this")
    assert missing.status_code == 404 and missing.parsed.status == 404
