"""The action registry and the API handlers are written against.

    from jobs.actions import action, Wait

    @action("quotes.send", timeout=60, retry=RetryPolicy(max_attempts=8))
    def send_quote(ctx):
        ...
        return {"sent": True}          # → DONE, stored as the job's result
        return Wait.external("customer reply", wake_at=..., provider="mailer")   # → WAITING_EXTERNAL

A handler raises `TransientError`, `PermanentError` or `AuthError` (jobs.errors)
to say what a failure means; any other exception counts as transient.
Modules named `handlers` in installed apps are imported at start-up so their
actions register themselves.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from .errors import UnknownAction
from .retry import DEFAULT_POLICY, RetryPolicy
from .states import State


@dataclass(frozen=True)
class ActionSpec:
    name: str
    handler: Callable[["JobContext"], Any]
    retry: RetryPolicy = DEFAULT_POLICY
    timeout: float | None = None  # seconds; past it the lease is no longer renewed
    # A Django form class naming the payload fields a reviewer may correct
    # before approving (correct-and-approve); None: no correction offered
    # (or, with a `schema`, the fields it marks correctable: jobs.payloads).
    review_form: type | None = None
    # Called by the worker once it has recorded an outcome of one of this
    # action's jobs: `(job, failure)`, `failure` being what the handler raised
    # (None for a success). See `action`.
    on_recorded: Callable[[Any, BaseException | None], None] | None = None
    # The payload's declaration (`PayloadSchema`): validation, the JSON
    # Schema agents read, the console's rendering and correction form all
    # come from it (jobs.payloads). None: a payload the engine knows nothing of.
    schema: "PayloadSchema | None" = None
    description: str = ""
    # `preview(job) -> Preview`: what approving the job will do, rendered now
    # from the records (see `Preview`); None: the console shows the payload.
    preview: Callable[[Any], "Preview"] | None = None
    # Payload fields a viewer sees masked (by the review layer), wherever the job's
    # data is shown: its payload, preview, history and requests.
    sensitive: frozenset[str] = frozenset()
    # What of a job of this action the console's text search reads besides
    # its key, subject, proposer and rationale (jobs.search): payload field
    # names, or a function `(job) -> texts` for values that live elsewhere
    # (an email rendered from its record: its recipient and subject).
    searchable: tuple[str, ...] | Callable[[Any], Any] = ()


@dataclass(frozen=True)
class PreviewField:
    name: str  # the payload or request field it shows (masking and correction go by it)
    label: str
    value: str
    multiline: bool = False


@dataclass(frozen=True)
class Preview:
    """What approving a job will do, as the person deciding should see it:
    `summary` ("Approving sends this email through sim-idempotent, once"),
    the effect's `fields` exactly as they will leave (an email's to, subject
    and body), and a `note` when what leaves is rendered again later (from a
    record that may change before then) or was already fixed earlier."""

    summary: str
    fields: tuple[PreviewField, ...] = ()
    note: str = ""


@runtime_checkable
class PayloadSchema(Protocol):
    """What the engine needs of a payload schema — the shape of a pydantic
    model class, which the apps above declare; the engine imports no library
    for it. `model_validate` raises a `ValueError` whose `errors()` lists
    `{"loc", "msg", "type"}` for each problem, and returns an object whose
    `model_dump(mode="json")` is the payload as stored."""

    @classmethod
    def model_json_schema(cls) -> dict: ...

    @classmethod
    def model_validate(cls, obj: Any) -> Any: ...


_registry: dict[str, ActionSpec] = {}


def action(name: str, *, retry: RetryPolicy | None = None, timeout: float | None = None, review_form=None,
           on_recorded=None, schema: PayloadSchema | None = None, description: str = "", preview=None,
           sensitive=(), searchable: tuple[str, ...] | Callable[[Any], Any] = ()):
    """Register the decorated function as the handler of `name`.

    `review_form`: a Django form class whose fields are the payload fields a
    reviewer may correct (validated by the form) before approving a job of
    this action that waits for review.

    `on_recorded(job, failure)`: called by the worker after an outcome of
    the handler has been committed (a success, a failure, a wait) — never
    for an outcome that was not written (the fence moved, the database was
    lost). `job` is the job as claimed; `failure` is the exception the
    handler raised, or None. A failure's callback runs while that exception
    is being handled. An exception the callback raises is logged and changes
    nothing: the outcome is already recorded.

    `schema`: the payload's declaration (see `PayloadSchema`, `jobs.payloads`);
    an action with one can be proposed by an outside agent.
    `description`: what the action does, for an agent choosing it (default:
    the first paragraph of the handler's docstring).

    `preview(job) -> Preview`: what approving a job of this action will do,
    rendered from the records as they are now (the decision page shows it
    first). It only reads; an exception it raises is shown, not raised.
    `sensitive`: payload field names a viewer sees masked (`access.sees_sensitive`).
    `searchable`: the payload field names the console's search reads (the
    recipient, a subject line), or a function `(job) -> iterable of str`
    computing them (called when the job is created or corrected; it must
    not fail: what it raises leaves those texts out)."""

    if schema is not None and not isinstance(schema, PayloadSchema):
        raise TypeError(f"action {name!r}: schema must offer model_json_schema() and model_validate()")

    def register(handler):
        existing = _registry.get(name)
        if existing is not None and existing.handler is not handler:
            if getattr(existing.handler, "__qualname__", None) != handler.__qualname__:
                raise ValueError(f"action {name!r} is already registered to {existing.handler!r}")
        text = description or (handler.__doc__ or "").strip().split("\n\n")[0]
        _registry[name] = ActionSpec(name, handler, retry or DEFAULT_POLICY, timeout, review_form, on_recorded,
                                     schema, " ".join(text.split()), preview, frozenset(sensitive),
                                     tuple(searchable) if not callable(searchable) else searchable)
        return handler

    return register


def get_action(name: str) -> ActionSpec:
    """The registered action, or `UnknownAction` naming what is registered."""
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry)) or "none"
        raise UnknownAction(f"no handler is registered for action {name!r} (registered: {known})") from None


def retry_policy(name: str) -> RetryPolicy:
    spec = _registry.get(name)
    return spec.retry if spec else DEFAULT_POLICY


def review_form(name: str):
    """The correction form `name` declares, or None."""
    spec = _registry.get(name)
    return spec.review_form if spec else None


def action_preview(job) -> Preview | None:
    """What approving `job` will do, from its action's `preview` (None when
    the action declares none). A preview that fails says so instead: the
    decision page must still open, and the person must not mistake an
    unrendered effect for an empty one."""
    spec = _registry.get(job.action)
    if spec is None or spec.preview is None:
        return None
    try:
        return spec.preview(job)
    except Exception as exc:  # noqa: BLE001 - shown to the person deciding, never swallowed silently
        return Preview(summary=f"The effect of approving could not be rendered now: {type(exc).__name__}: {exc}",
                       note="Open the job's subject to see what it is about before approving.")


def registered_actions() -> list[str]:
    return sorted(_registry)


def action_spec(name: str) -> ActionSpec | None:
    """The registered action, or None."""
    return _registry.get(name)


def schema_actions() -> list[str]:
    """The actions that declare a payload schema, sorted: what an outside
    agent may be allowed to propose."""
    return sorted(name for name, spec in _registry.items() if spec.schema is not None)


@dataclass(frozen=True)
class Wait:
    """A handler's request to wait without holding a worker: the job is
    released and becomes READY again on a reply, a timer or a decision."""

    state: State
    reason: str
    wake_at: datetime | float | None = None
    # Which inbound provider may end this external wait (DESIGN §7): an
    # event from another provider never resumes it; "" = no provider's
    # event does (only a timer or an operator).
    provider: str = ""

    @classmethod
    def external(cls, reason: str, *, wake_at=None, provider: str = "") -> "Wait":
        return cls(State.WAITING_EXTERNAL, reason, wake_at, provider)

    @classmethod
    def review(cls, reason: str, *, wake_at=None) -> "Wait":
        return cls(State.WAITING_REVIEW, reason, wake_at)


class Cancellation:
    """`threading.Event`'s `set`, `is_set`, `wait` and `clear`, cheap to
    make: a batch worker makes one per job it claims, and an Event (a
    condition and its lock) is dear to make. The event behind
    `wait` is made only for a handler that waits."""

    __slots__ = ("_flag", "_event")
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._lock:
            self._flag = True
            if self._event is not None:
                self._event.set()

    def clear(self) -> None:
        with self._lock:
            self._flag = False
            if self._event is not None:
                self._event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self._flag:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


@dataclass
class JobContext:
    """What a handler sees: the job, its fence and a cancellation flag.

    `cancelled` is set when the worker lost the lease (a renewal hit
    `Conflict`) or is shutting down past its grace period; a long handler
    checks it between steps. Nothing a cancelled handler returns is written.
    """

    job: Any  # jobs.models.Job as claimed
    worker_id: str
    store: Any  # jobs.store.Store
    cancelled: Cancellation = field(default_factory=Cancellation)

    @property
    def tenant(self) -> str:
        return self.job.tenant

    @property
    def key(self) -> str:
        return self.job.key

    @property
    def epoch(self) -> int:
        return self.job.lease_epoch

    @property
    def payload(self) -> dict:
        return self.job.payload

    def under_fence(self):
        """`Store.under_fence` for this job's lease: write other rows (an
        operation intent, a receipt) only while the lease is still ours."""
        return self.store.under_fence(self.tenant, self.key, self.worker_id, self.epoch)
