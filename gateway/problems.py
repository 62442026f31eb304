"""Refusals of the gateway, as RFC 9457 problem details.

Every service of the gateway raises `Refused` with the status the contract
gives it (DESIGN §15); the HTTP API answers it as `application/problem+json`
and the MCP server as a tool error carrying the same document, so the two
can never disagree.
"""

from http import HTTPStatus

PROBLEM_CONTENT_TYPE = "application/problem+json"


class Refused(Exception):
    """A request the gateway refuses: `status` (HTTP), a short `slug` naming
    the problem type, a `detail` for a person, field `errors` (422) and
    `retry_after` seconds (429). Nothing was written."""

    def __init__(self, status: int, slug: str, detail: str, *, errors: list | None = None,
                 retry_after: int | None = None):
        super().__init__(detail)
        self.status, self.slug, self.detail = status, slug, detail
        self.errors, self.retry_after = errors, retry_after

    def problem(self) -> dict:
        document = {"type": f"urn:durable-workers:problem:{self.slug}", "title": HTTPStatus(self.status).phrase,
                    "status": self.status, "detail": self.detail}
        if self.errors is not None:
            document["errors"] = self.errors
        if self.retry_after is not None:
            document["retry_after"] = self.retry_after
        return document


def unauthorized() -> Refused:
    # One answer for a missing, malformed, unknown or revoked key: it tells a
    # guesser nothing, and it never repeats what was sent.
    return Refused(401, "unauthorized", "a valid API key is required: Authorization: Bearer dwk_<prefix>_<secret> "
                                        "(missing, malformed or revoked)")


def field_errors(errors: list[dict], *, prefix: tuple = ()) -> list[dict]:
    """Field errors as the problem document lists them: `{"loc", "msg", "type"}`."""
    return [{"loc": [*prefix, *[str(p) for p in e.get("loc", ())]], "msg": str(e.get("msg", "")),
             "type": str(e.get("type", "value_error"))} for e in errors]
