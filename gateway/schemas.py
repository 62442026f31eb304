"""The gateway's request and answer documents (DESIGN §15), as pydantic
models: the HTTP API validates and documents with them (OpenAPI), the MCP
server derives its tools' input schemas from them. An action's payload is
described by the action's own schema (`jobs.payloads`), not here."""

import json
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from connectors.registry import provider_names
from jobs.payloads import payload_json_schema
from jobs.states import State
from jobs.validation import whole_number
from operations.handlers import TEXT_PATTERN

# A business key: letters, digits and . _ : @ -, at most 200 characters.
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$"
ACTION_PATTERN = r"^[a-z0-9_]+(\.[a-z0-9_]+)+$"
SUBJECT_TYPE_PATTERN = r"^[a-z0-9_]+(\.[a-z0-9_]+)*$"
SUBJECT_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,100}$"
CURSOR_DESCRIPTION = ("Opaque: the `next` of the page before, passed back unchanged; absent for the first page. "
                      "Its contents are not part of the contract.")
# Every time the gateway shows (API, MCP, callbacks): RFC 3339, UTC, with `Z`.
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"},
                                 description="RFC 3339, UTC, with Z (2026-01-31T09:30:00.123456Z)")]
JobState = Annotated[str, Field(json_schema_extra={"enum": [str(s) for s in State]})]


class SubjectIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: str = Field(max_length=100, pattern=SUBJECT_TYPE_PATTERN, description="e.g. company.quote")
    id: whole_number(ge=0, le=2**53) | Annotated[str, Field(pattern=SUBJECT_ID_PATTERN)] = Field(
        description="The record's id in the tenant.")
    version: whole_number(ge=0, le=2**31 - 1) | None = Field(None, description="The record's version the proposal saw.")


class ProposalIn(BaseModel):
    """What an agent proposes: the action, its business key (proposing it
    again proposes nothing), why, the payload the action's schema describes
    and, optionally, the record it is about."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: str = Field(max_length=100, pattern=ACTION_PATTERN)
    key: str = Field(max_length=200, pattern=KEY_PATTERN)
    rationale: str = Field(min_length=1, max_length=4000, pattern=TEXT_PATTERN,
                           description="Why: the reviewer decides on it.")
    payload: dict[str, Any] = Field(default_factory=dict, description="As the action's payload_schema says.")
    subject: SubjectIn | None = None


class DecisionOut(BaseModel):
    decision: str
    by: str
    at: Timestamp
    note: str


class ReceiptOut(BaseModel):
    provider: str
    reference: str
    how: str


class OutcomeOut(BaseModel):
    state: JobState
    result: Any = None
    receipts: list[ReceiptOut]


class LinksOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    self_: str = Field(alias="self")
    console: str


class ProposalOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    key: str
    action: str
    state: JobState
    needs_review: bool
    created_at: Timestamp
    decision: DecisionOut | None
    outcome: OutcomeOut | None
    links: LinksOut


class ProposalCreated(ProposalOut):
    created: bool


class ProposalPage(BaseModel):
    items: list[ProposalOut]
    next: str | None = Field(description="The cursor of the next page (opaque), or null on the last page.")


class ActionOut(BaseModel):
    name: str
    description: str
    needs_review: bool
    payload_schema: dict[str, Any]


class FieldError(BaseModel):
    loc: list[str]
    msg: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] | None = None
    retry_after: int | None = None


def payload_alternatives(actions: list[str]) -> tuple[list[dict], dict]:
    """Each action's payload schema (its own declaration, `jobs.payloads`),
    titled by the action, and the definitions they refer to: what a
    proposal's `payload` may be, for the OpenAPI document and the MCP
    `propose` tool alike."""
    alternatives, definitions = [], {}
    for name in actions:
        declared = payload_json_schema(name) or {"type": "object"}
        definitions.update(declared.pop("$defs", {}))
        alternatives.append({**declared, "title": f"payload of {name}"})
    return alternatives, definitions


def timestamp(moment: datetime) -> str:
    """`moment` as every time the gateway shows: RFC 3339, UTC, `Z`, microseconds."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def proposal_union(proposal: dict, actions: list[str]) -> dict:
    """The OpenAPI components of a proposal as a discriminated union: one
    `Proposal_<action>` per proposable action — its `action` a constant, its
    `payload` that action's own schema — and `ProposalIn` the `oneOf` of them,
    told apart by `action`. (`proposal` is ProposalIn's generated schema.)"""
    payloads, definitions = payload_alternatives(actions)
    payloads = [_providers_listed(payload) for payload in payloads]
    components, mapping = {}, {}
    for name, payload in zip(actions, payloads):
        variant = json.loads(json.dumps(proposal))
        variant["title"] = f"Proposal of {name}"
        variant["properties"]["action"] = {"type": "string", "const": name, "enum": [name], "title": "Action"}
        variant["properties"]["payload"] = {**payload, "description": f"The payload of {name}."}
        if payload.get("required"):  # the default, {}, would not do
            variant["required"] = [*variant.get("required", []), "payload"]
        component = "Proposal_" + name.replace(".", "_")
        components[component] = variant
        mapping[name] = f"#/components/schemas/{component}"
    components["ProposalIn"] = {"title": "ProposalIn", "description": proposal.get("description", ""),
                                "oneOf": [{"$ref": ref} for ref in mapping.values()],
                                "discriminator": {"propertyName": "action", "mapping": mapping}}
    # An action schema's own definitions live beside the other components.
    text = json.dumps({**components, **definitions}).replace('"#/$defs/', '"#/components/schemas/')
    return json.loads(text)


def _providers_listed(schema):
    """`schema` with each provider choice (`x-provider`) listing the providers
    configured now: what the document allows is what a proposal may name."""
    if isinstance(schema, list):
        return [_providers_listed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    listed = {key: _providers_listed(value) for key, value in schema.items()}
    if listed.get("x-provider"):
        listed["enum"] = provider_names()
    return listed
