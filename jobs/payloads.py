"""Action payloads, from the one schema an action declares (`@action(..., schema=…)`).

The schema (a pydantic model class, as far as the apps above are concerned;
the engine sees only `actions.PayloadSchema`) is the single declaration of
what an action's payload may be. From it come:

- `payload_validate`: the payload as stored, or `PayloadInvalid` with one
  error per field (an API answers 422 with them; an MCP tool its error);
- `payload_json_schema`: the JSON Schema an agent reads (the API's
  `GET /api/v1/actions`, the MCP tools' input schemas);
- `payload_display`: the payload for a person, field by field, with the
  schema's titles, in its order (the console's decision page);
- `correction_form_class`: the Django form of the fields the schema marks
  correctable (`"x-correctable": true`) — the reviewer's correct-and-approve.

A schema property may carry `"x-multiline": true` (shown and edited as a text
area) and `"x-correctable": true`.
"""

import json
from functools import cache

from django import forms

from .actions import action_spec, get_action

__all__ = ["PayloadInvalid", "payload_validate", "payload_json_schema", "payload_display", "correction_form_class"]


class PayloadInvalid(ValueError):
    """The payload does not match its action's schema. `errors` lists
    `{"loc": [field, …], "msg": …, "type": …}`, one per problem."""

    def __init__(self, errors: list[dict]):
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in errors))


def _errors_of(exc: Exception) -> list[dict]:
    listed = exc.errors() if callable(getattr(exc, "errors", None)) else [{"loc": (), "msg": str(exc)}]
    return [{"loc": [str(part) for part in error.get("loc", ())], "msg": str(error.get("msg", "")),
             "type": str(error.get("type", "value_error"))} for error in listed]


def payload_validate(action: str, payload) -> dict:
    """`payload` checked against `action`'s schema and normalised (defaults
    filled, values coerced) as it is to be stored. An action without a
    schema takes any JSON object as it is. Raises `PayloadInvalid` and
    `UnknownAction`."""
    spec = get_action(action)
    if spec.schema is None:
        if not isinstance(payload, dict):
            raise PayloadInvalid([{"loc": [], "msg": "the payload must be a JSON object", "type": "dict_type"}])
        return payload
    try:
        model = spec.schema.model_validate(payload)
    except ValueError as exc:
        raise PayloadInvalid(_errors_of(exc)) from None
    return model.model_dump(mode="json", exclude_none=True)


@cache
def _json_schema(action: str) -> dict:
    return get_action(action).schema.model_json_schema()


def payload_json_schema(action: str) -> dict | None:
    """The JSON Schema of `action`'s payload, or None when it declares none.
    Raises `UnknownAction`."""
    if get_action(action).schema is None:
        return None
    return json.loads(json.dumps(_json_schema(action)))  # a copy: callers may annotate it


def _properties(action: str) -> tuple[dict, set]:
    spec = action_spec(action)
    if spec is None or spec.schema is None:
        return {}, set()
    schema = _json_schema(action)
    return schema.get("properties", {}), set(schema.get("required", []))


def _generic_rows(payload) -> list[tuple[str, str, bool]]:
    if not isinstance(payload, dict):
        return [("payload", json.dumps(payload, indent=2, ensure_ascii=False), True)]
    return [_row(name, value, False) for name, value in payload.items()]


def _row(label: str, value, multiline: bool) -> tuple[str, str, bool]:
    if isinstance(value, str):
        return label, value, multiline or "\n" in value or len(value) > 80
    return label, json.dumps(value, indent=2, ensure_ascii=False), isinstance(value, dict | list)


def payload_display(action: str, payload) -> list[tuple[str, str, bool]]:
    """The payload for a person: (label, value, multiline) rows — the
    schema's fields first, in its order and with its titles, then anything
    else the payload holds under its own name."""
    properties, _ = _properties(action)
    if not properties or not isinstance(payload, dict):
        return _generic_rows(payload)
    rows = [_row(prop.get("title") or name, payload[name], bool(prop.get("x-multiline")))
            for name, prop in properties.items() if name in payload]
    rows += [_row(name, value, False) for name, value in payload.items() if name not in properties]
    return rows


def _types(prop: dict) -> set:
    if "type" in prop:
        return {prop["type"]} if isinstance(prop["type"], str) else set(prop["type"])
    return {t for option in prop.get("anyOf", []) for t in _types(option)}


def _form_field(prop: dict, required: bool) -> forms.Field:
    common = {"label": prop.get("title"), "help_text": prop.get("description", ""), "required": required}
    types = _types(prop) - {"null"}
    if types == {"integer"}:
        return forms.IntegerField(min_value=prop.get("minimum"), max_value=prop.get("maximum"), **common)
    if types == {"boolean"}:
        return forms.BooleanField(**{**common, "required": False})
    if prop.get("format") == "email":
        return forms.EmailField(max_length=prop.get("maxLength"), **common)
    widget = forms.Textarea(attrs={"rows": 6}) if prop.get("x-multiline") else None
    return forms.CharField(max_length=prop.get("maxLength"), min_length=prop.get("minLength"), widget=widget,
                           strip=False, **common)


@cache
def _schema_form(action: str) -> type | None:
    properties, required = _properties(action)
    fields = {name: _form_field(prop, name in required) for name, prop in properties.items()
              if prop.get("x-correctable")}
    if not fields:
        return None
    return type(f"{action.replace('.', '_')}_correction", (forms.Form,), fields)


def correction_form_class(action: str) -> type | None:
    """The form of the payload fields a reviewer may correct on `action`'s
    jobs: the action's own `review_form`, else the fields its schema marks
    correctable; None when there are none. What the form accepts is checked
    once more against the whole schema when the correction is taken
    (the review layer's correct-and-approve decision)."""
    spec = action_spec(action)
    if spec is None:
        return None
    return spec.review_form or _schema_form(action)
