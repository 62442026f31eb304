"""What the engine accepts and what it can store, checked in one place.

The database is the last line, not the first: a value PostgreSQL or SQLite
cannot store (NaN in JSON, a NUL character in text or JSON, a lone
surrogate) must be refused — or, for a free-text reason, made storable —
before it is written, so a write never fails half-way through a worker's
outcome and a caller gets a `ValueError` naming the field instead of a
`DataError` (or, worse, a CHECK violation mistaken for a lost race).
"""

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from django.conf import settings
from pydantic import BeforeValidator, Field

from .clock import to_datetime

# JSON nested deeper than this is refused (a document is data, not a stack test).
MAX_JSON_DEPTH = 64
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024

# Field lengths of jobs.models.Job the caller can set.
JOB_FIELD_LIMITS = {"tenant": 64, "key": 200, "action": 100, "subject_type": 100, "subject_id": 100}


def _whole(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


def whole_number(**limits):
    """An integer as JSON Schema counts one: a number with no fraction,
    written `7` or `7.0` (a strict pydantic model takes only the first
    otherwise). `limits` are `Field`'s (`ge`, `le`); they stay in the JSON
    Schema as `minimum` and `maximum`."""
    return Annotated[Annotated[int, Field(**limits)], BeforeValidator(_whole)]


def json_problem(value, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why `value` is not strict, storable JSON (None when it is).

    Strict: only dict (string keys), list/tuple, str, int, float, bool and
    None; no NaN or ±Infinity (not JSON at all); no NUL character and no
    lone surrogate in any string (PostgreSQL's jsonb and text refuse both).
    Walks iteratively, so a deeply nested value cannot exhaust the stack.
    """
    stack = [(value, "", 1)]
    while stack:
        item, where, depth = stack.pop()
        at = where or "the value"
        if depth > max_depth:
            return f"{at} is nested deeper than {max_depth} levels"
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{at} is {item!r}, which JSON cannot represent"
            continue
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"{at} {problem}"
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    return f"{at} has a key {k!r} that is not a string"
                problem = text_problem(k)
                if problem:
                    return f"{at} has a key that {problem}"
                stack.append((v, f"{where}.{k}" if where else k, depth + 1))
            continue
        if isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
            continue
        return f"{at} is a {type(item).__name__}, which is not JSON"
    return None


def text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


# `json.dumps(value, sort_keys=True, allow_nan=False)`, its encoder made once
# (json.dumps makes one per call when given options).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, allow_nan=False)


def strict_json(value, *, field: str) -> str:
    """`value` as canonical JSON text, or `ValueError` naming `field`."""
    problem = json_problem(value)
    if problem:
        raise ValueError(f"{field}: {problem}")
    return _CANONICAL_JSON.encode(value)


def storable_text(text: str) -> str:
    """Free text (a reason, an error message) made storable on every back end:
    NUL and lone surrogates become visible escapes rather than failing the
    write that records what happened."""
    text = str(text)
    if text_problem(text) is None:
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def describe_exception(exc: BaseException, limit: int = 2000) -> str:
    """`Type: message` of any exception — even one whose `__str__` raises —
    made storable and bounded, for a job's reason or a log line."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the report
        message = "<unprintable message>"
    return storable_text(f"{type(exc).__name__}: {message}")[:limit]


def max_payload_bytes() -> int:
    return int(getattr(settings, "JOBS_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES))


@dataclass(frozen=True)
class CheckedJob:
    """A job's caller-supplied fields, validated and in their stored form."""

    payload_json: str
    payload: dict
    run_at: datetime | None
    max_attempts: int


# The keys of jobs the system makes for itself begin with one of these:
# callback deliveries (gateway), review escalations and their mails (review,
# company), timers scheduled without a key (jobs.timers) and Django tasks
# (jobs.tasks_backend). Whoever proposes from outside (an agent, through the
# gateway) is refused a key here: a key taken first would keep the system's
# own job from ever being made (enqueueing an existing key makes nothing).
SYSTEM_KEY_PREFIXES = ("callback-", "review-", "task-", "timer-")


def system_key(key: str) -> bool:
    """Whether `key` lies in the namespace of the system's own jobs."""
    return key.startswith(SYSTEM_KEY_PREFIXES)


def job_validate(
    *,
    tenant,
    key,
    action,
    payload,
    priority,
    run_at,
    max_attempts: int | None,
    default_max_attempts: int,
    subject_type="",
    subject_id="",
    subject_version=None,
) -> CheckedJob:
    """Validate one job as `Store.enqueue` and `Store.enqueue_many` receive it;
    `ValueError` names the first bad field. `max_attempts=None` takes the
    action's policy; an explicit value must be at least 1."""
    for name, value in (("tenant", tenant), ("key", key), ("action", action)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, not {value!r:.60}")
    for name, value in (("tenant", tenant), ("key", key), ("action", action), ("subject_type", subject_type),
                        ("subject_id", str(subject_id or ""))):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, not {type(value).__name__}")
        if len(value) > JOB_FIELD_LIMITS[name]:
            raise ValueError(f"{name} is {len(value)} characters long (at most {JOB_FIELD_LIMITS[name]})")
        problem = text_problem(value)
        if problem:
            raise ValueError(f"{name} {problem}")
    payload = {} if payload is None else payload
    if not isinstance(payload, dict):
        raise ValueError(f"payload must be a JSON object (a dict), not {type(payload).__name__}")
    payload_json = strict_json(payload, field="payload")
    size, limit = len(payload_json.encode("utf-8")), max_payload_bytes()
    if size > limit:
        raise ValueError(f"payload is {size} bytes as JSON (at most {limit}, setting JOBS_MAX_PAYLOAD_BYTES)")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -32768 <= priority <= 32767:
        raise ValueError(f"priority must be an integer from -32768 to 32767, not {priority!r:.60}")
    if max_attempts is None:
        max_attempts = default_max_attempts
    elif isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 2**31 - 1:
        raise ValueError(f"max_attempts must be an integer of at least 1, not {max_attempts!r:.60}")
    if subject_version is not None and (isinstance(subject_version, bool) or not isinstance(subject_version, int)
                                        or not -(2**31) <= subject_version < 2**31):
        raise ValueError(f"subject_version must be an integer, not {subject_version!r:.60}")
    return CheckedJob(payload_json, payload, to_datetime(run_at, field="run_at"), max_attempts)
