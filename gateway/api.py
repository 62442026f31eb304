"""The agent API over HTTP (DESIGN §15), with django-ninja: `/api/v1/`,
its OpenAPI 3 document at `/api/v1/openapi.json` and docs at `/api/v1/docs`.

Thin: authenticate (`Authorization: Bearer dwk_…`), call one service of
`gateway.services`, answer its result — or its `Refused` as RFC 9457 problem
details (`application/problem+json`), as every other error here is too: a
body that is not JSON (400), too large (413) or of another content type
(415), a request the schemas refuse (422).
"""

import json
from typing import Literal

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.urls import re_path
from ninja import NinjaAPI, Query, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from jobs.actions import schema_actions
from jobs.states import State

from .problems import PROBLEM_CONTENT_TYPE, Refused, unauthorized
from .schemas import CURSOR_DESCRIPTION, ActionOut, Problem, ProposalCreated, ProposalIn, ProposalOut, ProposalPage, proposal_union
from .services import actions_list, agent_from_key, proposal_propose, proposal_read, proposals_list

DEFAULT_MAX_BODY_BYTES = 512 * 1024


def max_body_bytes() -> int:
    return int(getattr(settings, "GATEWAY_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES))


class KeyAuth(HttpBearer):
    """An agent's API key; the request's `auth` is the agent."""

    def authenticate(self, request, token):
        try:
            return agent_from_key(token)
        except Refused:
            return None


class StrictJson(Parser):
    """Only `application/json` bodies of at most GATEWAY_MAX_BODY_BYTES, and
    only strict JSON (no NaN, not nested past what a parser can walk)."""

    def parse_body(self, request):
        declared = request.META.get("CONTENT_LENGTH") or "0"
        limit = max_body_bytes()
        if (declared.isdigit() and int(declared) > limit) or len(request.body) > limit:
            raise Refused(413, "body-too-large", f"the body may be at most {limit} bytes")
        content_type = (request.content_type or "").lower()
        if content_type != "application/json":
            raise Refused(415, "unsupported-media-type",
                          f"the body must be application/json, not {content_type or 'unnamed'}")
        try:
            return json.loads(request.body, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise Refused(400, "malformed-json", f"the body is not valid JSON ({type(exc).__name__})") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class GatewayAPI(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        """The document a client generator can use: `servers` names the API's
        root and the paths are relative to it; a proposal is one of the
        proposable actions, each with its own payload schema, told apart by
        `action` (a discriminated union); every error answer is described as
        what it is (`application/problem+json`, 429's `Retry-After`)."""
        root = (path_prefix if path_prefix is not None else self.get_root_path(path_params or {})).rstrip("/")
        schema = super().get_openapi_schema(path_prefix="", path_params=path_params)
        schema["servers"] = [{"url": root, "description": "This API's root (the base URL of a generated client)"}]
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        if "ProposalIn" in components:
            components.update(proposal_union(components["ProposalIn"], schema_actions()))
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for status, answer in operation.get("responses", {}).items():
                    if int(status) >= 400 and "application/json" in answer.get("content", {}):
                        answer["content"] = {PROBLEM_CONTENT_TYPE: answer["content"]["application/json"]}
                    if int(status) == 429:
                        answer["headers"] = {"Retry-After": {"description": "Seconds until a proposal may succeed",
                                                             "schema": {"type": "integer"}}}
        return schema

    def _get_urls(self):
        # Last: any other path under the API is a problem document too, not the site's HTML page.
        urls = [url if url.name != "api-root" else re_path(r"^$", _unrouted, name="api-root")
                for url in super()._get_urls()]
        return [*urls, re_path(r"^.*$", _unrouted, name="unrouted")]


def _unrouted(request, *args, **kwargs):
    return problem_response(Refused(404, "not-found", f"no {request.method} {request.path[:200]} in this API "
                                                      f"(its document: /api/v1/openapi.json)"))


api = GatewayAPI(title="Durable workers — agent gateway", version="1", urls_namespace="gateway-api",
                 auth=KeyAuth(), parser=StrictJson(), docs_url="/docs", openapi_url="/openapi.json",
                 description="Agents propose work, learn its outcome and stay within limits (DESIGN §15). "
                             "Authenticate with `Authorization: Bearer dwk_<prefix>_<secret>`.")


def problem_response(refused: Refused) -> HttpResponse:
    response = HttpResponse(json.dumps(refused.problem()), status=refused.status, content_type=PROBLEM_CONTENT_TYPE)
    if refused.retry_after is not None:
        response["Retry-After"] = str(refused.retry_after)
    if refused.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="durable-workers"'
    return response


@api.exception_handler(Refused)
def _refused(request, exc: Refused):
    return problem_response(exc)


@api.exception_handler(RequestDataTooBig)
def _too_big_for_django(request, exc):
    # Past DATA_UPLOAD_MAX_MEMORY_SIZE Django itself refuses to read the body.
    return problem_response(Refused(413, "body-too-large", f"the body may be at most {max_body_bytes()} bytes"))


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return problem_response(unauthorized())


def _loc(loc) -> list[str]:
    # ninja names the parameter after the source ("body", "proposal", "key"):
    # the document's field path is what a client needs.
    parts = [str(p) for p in loc]
    if len(parts) >= 2 and parts[0] == "body" and parts[1] == "proposal":
        parts = ["body", *parts[2:]]
    return parts


@api.exception_handler(ValidationError)
def _invalid(request, exc: ValidationError):
    errors = [{"loc": _loc(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors]
    return problem_response(Refused(422, "validation-error", "the request does not match its schema", errors=errors))


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    if isinstance(exc.__cause__, Refused):  # raised by the parser, wrapped by ninja
        return problem_response(exc.__cause__)
    return problem_response(Refused(exc.status_code, "http-error", str(exc)))


ERRORS = {401: Problem, 422: Problem}


def _only_query(request, *known: str) -> None:
    """An unknown query parameter is refused (422), never ignored: a typo
    (`?stat=DONE`) must not silently list everything."""
    unknown = sorted(name for name in request.GET if name not in known)
    if unknown:
        raise Refused(422, "validation-error", f"unknown query parameter(s): {', '.join(unknown)[:200]}",
                      errors=[{"loc": ["query", name[:100]], "msg": "unknown query parameter", "type": "extra_forbidden"}
                              for name in unknown[:20]])
# The job states, as an enum in the document.
StateName = Literal[tuple(State.values)]


@api.get("/actions", response={200: list[ActionOut], **ERRORS}, summary="The actions this agent may propose",
         operation_id="list_actions")
def list_actions(request):
    """Each action: what it does, whether the tenant's policy sends it to a
    reviewer, and its payload's JSON Schema."""
    _only_query(request)
    return Status(200, actions_list(request.auth))


@api.post("/proposals", response={200: ProposalCreated, 201: ProposalCreated, 400: Problem, 403: Problem,
                                  409: Problem, 413: Problem, 415: Problem, 423: Problem, 429: Problem, **ERRORS},
          by_alias=True, summary="Propose work", operation_id="propose")
def propose(request, proposal: ProposalIn):
    """201 with the new proposal; the same key with the same action and
    payload again: 200 `created: false`; other content under the key: 409."""
    _only_query(request)
    view, created = proposal_propose(agent=request.auth, proposal=proposal)
    return Status(201 if created else 200, {**view, "created": created})


@api.get("/proposals/{key}", response={200: ProposalOut, 404: Problem, **ERRORS}, by_alias=True,
         summary="One proposal, its decision and outcome",
         operation_id="read_proposal")
def read_proposal(request, key: str):
    """A key the agent's tenant does not hold (another tenant's too): 404."""
    _only_query(request)
    return Status(200, proposal_read(agent=request.auth, key=key))


@api.get("/proposals", response={200: ProposalPage, **ERRORS}, by_alias=True, summary="This agent's proposals",
         operation_id="list_proposals")
def list_proposals(request, state: StateName | None = Query(None), cursor: str | None = Query(None, max_length=64, description=CURSOR_DESCRIPTION)):
    """Newest first, a page at a time; `next` is the cursor of the next page."""
    _only_query(request, "state", "cursor")
    return Status(200, proposals_list(agent=request.auth, state=state, cursor=cursor))
