"""The provider simulator: an HTTP email provider standing in for the outside world.

It is a separate service with its own storage (a SQLite file, never Django's
database), so a test can kill a worker, restart the simulator, and still ask
the outside world what it actually accepted. Standard library only: it starts
with ``python -m connectors.simulator`` without Django.

Modes (DESIGN §10):

- ``idempotent`` honours ``Idempotency-Key`` with Stripe-v1 semantics and
  supports lookup by ``client_reference``;
- ``lookup`` ignores the key (a resend is a second message) but supports
  lookup;
- ``bare`` supports neither; its lookup route answers 404.

API::

    POST /v1/messages                         accept a message (auth required)
    GET  /v1/messages/<id>                    one message (auth required)
    GET  /v1/messages?client_reference=X      lookup (auth; not in bare mode)
    GET  /v1/messages                         every accepted message (no auth)
    GET  /health                              liveness (no auth)

The unauthenticated listing and ``/health`` are the simulator's window for
tests and people, not part of the provider API, so ``--reject-auth`` leaves
them open: a test must still be able to see that nothing was accepted.

Faults are applied to each POST in this order: auth, throttle, error-rate,
validation, idempotency, store, optional stall, respond. Throttled and failed
requests store nothing; a stall happens *after* the message is committed, which
is exactly the "accepted but the answer was lost" case a client must survive.

Lookups (the reconciliation path) have faults of their own, so a client can be
tested against a lookup that itself fails: ``--lookup-fault 500|429|401``
answers every lookup with that status, ``--lookup-stall SECONDS`` holds each
lookup answer (past a client's read timeout: a timeout), and
``--lookup-ignores-reference`` answers a lookup with every message, as a
provider whose filter is broken or ignored would.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import sqlite3
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qs, urlsplit

from durable.numbers import number_flag, whole_flag

MODES = ("idempotent", "lookup", "bare")
LOOKUP_FAULTS = ("", "500", "429", "401")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8025
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB_PATH = PROJECT_ROOT / "var" / "provider-simulator.sqlite3"
DEFAULT_RETRY_AFTER_SECONDS = 1

# A bound on what one request may make us buffer; an email body is far smaller.
MAX_BODY_BYTES = 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               TEXT NOT NULL UNIQUE,
    idempotency_key  TEXT,
    client_reference TEXT NOT NULL,
    to_address       TEXT NOT NULL,
    subject          TEXT NOT NULL,
    body             TEXT NOT NULL,
    request_digest   TEXT NOT NULL,
    accepted_at      TEXT NOT NULL
);
-- Serves the lookup route (GET /v1/messages?client_reference=X).
CREATE INDEX IF NOT EXISTS messages_client_reference ON messages (client_reference);

-- Only idempotent mode writes here: the first answer given for a key, replayed
-- verbatim to every later request with the same key and the same digest.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key             TEXT PRIMARY KEY,
    request_digest  TEXT NOT NULL,
    message_id      TEXT NOT NULL REFERENCES messages (id),
    response_status INTEGER NOT NULL,
    response_body   TEXT NOT NULL,
    created_at      TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class SimulatorConfig:
    """How one simulator process behaves. Raises ``ValueError`` when inconsistent."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    db_path: Path = DEFAULT_DB_PATH
    mode: str = "idempotent"
    stall_after_accept: float = 0.0
    stall_probability: float = 1.0
    error_rate: float = 0.0
    throttle_rate: float = 0.0
    retry_after: int = DEFAULT_RETRY_AFTER_SECONDS
    reject_auth: bool = False
    seed: int | None = None
    quiet: bool = False
    lookup_fault: str = ""
    lookup_stall: float = 0.0
    lookup_ignores_reference: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.lookup_fault not in LOOKUP_FAULTS:
            raise ValueError(f"lookup_fault must be one of {', '.join(LOOKUP_FAULTS[1:])}, not {self.lookup_fault!r}")
        if self.lookup_stall < 0:
            raise ValueError("lookup_stall must not be negative")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        if self.stall_after_accept < 0:
            raise ValueError("stall_after_accept must not be negative")
        if self.retry_after < 0:
            raise ValueError("retry_after must not be negative")
        for name in ("stall_probability", "error_rate", "throttle_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {value}")


def request_digest(payload: Any) -> str:
    """SHA-256 of the canonical JSON of a request body (sorted keys, no spaces).

    Two bodies that differ only in key order or whitespace are the same request.
    """
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def validation_problem(payload: Any) -> str | None:
    """Why ``payload`` is not an acceptable message, or ``None`` when it is."""
    if not isinstance(payload, dict):
        return "request body must be a JSON object"
    to = payload.get("to")
    if not isinstance(to, str) or "@" not in to:
        return "'to' must be an email address"
    for name in ("subject", "body"):
        if not isinstance(payload.get(name), str):
            return f"'{name}' must be a string"
    client_reference = payload.get("client_reference")
    if not isinstance(client_reference, str) or not client_reference:
        return "'client_reference' must be a non-empty string"
    return None


def _utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class StoredResponse:
    """The first answer given for an idempotency key."""

    request_digest: str
    status: int
    body: dict[str, Any]


class MessageStore:
    """The simulator's own durable storage: a SQLite file in WAL mode.

    Every method opens its own connection, so request threads never share one;
    SQLite's file locks (``BEGIN IMMEDIATE`` for writes) order concurrent
    writers. A message and its idempotency record are committed in one
    transaction, so a crash can never leave a key without its message.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as connection:
            # WAL lets the listing read while a request thread writes.
            connection.execute("PRAGMA journal_mode=WAL")
            connection.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        connection.row_factory = sqlite3.Row
        return connection

    @contextmanager
    def _write_transaction(self) -> Iterator[sqlite3.Connection]:
        with closing(self._connect()) as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    @staticmethod
    def _as_message(row: sqlite3.Row) -> dict[str, Any]:
        # The customer-visible effect of a message (DESIGN §10): exactly these
        # keys, in the listing, in lookups, in GET by id and in the 201 answer.
        return {
            "id": row["id"],
            "idempotency_key": row["idempotency_key"],
            "client_reference": row["client_reference"],
            "to": row["to_address"],
            "subject": row["subject"],
            "accepted_at": row["accepted_at"],
        }

    def accept(
        self,
        payload: Mapping[str, Any],
        *,
        digest: str,
        idempotency_key: str | None,
        remember_key: bool,
    ) -> dict[str, Any]:
        """Commit a new message and return its public representation.

        With ``remember_key`` the 201 answer is stored under ``idempotency_key``
        in the same transaction, for replay. Raises ``sqlite3.IntegrityError``
        if that key is already recorded (callers check first under a lock).
        """
        message = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "idempotency_key": idempotency_key,
            "client_reference": payload["client_reference"],
            "to": payload["to"],
            "subject": payload["subject"],
            "accepted_at": _utc_now_iso(),
        }
        with self._write_transaction() as connection:
            connection.execute(
                "INSERT INTO messages (id, idempotency_key, client_reference, to_address,"
                " subject, body, request_digest, accepted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    message["id"],
                    idempotency_key,
                    message["client_reference"],
                    message["to"],
                    message["subject"],
                    payload["body"],
                    digest,
                    message["accepted_at"],
                ),
            )
            if remember_key:
                connection.execute(
                    "INSERT INTO idempotency_keys (key, request_digest, message_id,"
                    " response_status, response_body, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (idempotency_key, digest, message["id"], 201, json.dumps(message), message["accepted_at"]),
                )
        return message

    def stored_response(self, idempotency_key: str) -> StoredResponse | None:
        """The answer first given for ``idempotency_key``, or ``None``."""
        with closing(self._connect()) as connection:
            row = connection.execute(
                "SELECT request_digest, response_status, response_body FROM idempotency_keys WHERE key = ?",
                (idempotency_key,),
            ).fetchone()
        if row is None:
            return None
        return StoredResponse(row["request_digest"], row["response_status"], json.loads(row["response_body"]))

    def get(self, message_id: str) -> dict[str, Any] | None:
        with closing(self._connect()) as connection:
            row = connection.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return None if row is None else self._as_message(row)

    def find_by_client_reference(self, client_reference: str) -> list[dict[str, Any]]:
        """Messages for one client reference, oldest first (index messages_client_reference)."""
        with closing(self._connect()) as connection:
            rows = connection.execute(
                "SELECT * FROM messages WHERE client_reference = ? ORDER BY seq", (client_reference,)
            ).fetchall()
        return [self._as_message(row) for row in rows]

    def all_messages(self) -> list[dict[str, Any]]:
        """Every message ever accepted, in acceptance order."""
        with closing(self._connect()) as connection:
            rows = connection.execute("SELECT * FROM messages ORDER BY seq").fetchall()
        return [self._as_message(row) for row in rows]


@dataclass
class Reply:
    """One HTTP answer: status, JSON body, extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    stall_seconds: float = 0.0


class ProviderSimulator:
    """The simulator's behaviour, independent of the socket plumbing.

    Idempotency (idempotent mode only) follows Stripe v1: the first answer for
    a key is stored with the message and replayed for the same key and body;
    the same key with a different body is refused (422 ``idempotency_error``);
    a key whose first request is still being answered — e.g. during a stall —
    is refused with 409 ``idempotency_conflict``. The in-flight set lives in
    memory: after a restart no request is in flight, and the stored answer is
    replayed.
    """

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.store = MessageStore(config.db_path)
        # Seeded so a chaos run can be replayed; only fault decisions use it,
        # never message ids (those must stay unique across restarts).
        self._random = random.Random(config.seed)
        self._random_lock = threading.Lock()
        # Held from "is this key known?" to "the key is recorded or in flight",
        # so two concurrent first requests cannot both be accepted.
        self._keys_lock = threading.Lock()
        self._keys_in_flight: set[str] = set()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- fault decisions ---------------------------------------------------

    def _happens(self, probability: float) -> bool:
        if probability <= 0.0:
            return False
        with self._random_lock:
            return self._random.random() < probability

    def _stall_seconds(self) -> float:
        stall = self.config.stall_after_accept
        if stall > 0 and self._happens(self.config.stall_probability):
            return stall
        return 0.0

    @staticmethod
    def authorized(authorization: str | None) -> bool:
        """A request is authorized by any non-empty bearer token."""
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        return scheme.lower() == "bearer" and bool(token.strip())

    # -- the API -----------------------------------------------------------

    def reject_unauthorized(self, authorization: str | None) -> Reply | None:
        if self.config.reject_auth or not self.authorized(authorization):
            return Reply(401, {"error": "unauthorized"}, {"WWW-Authenticate": "Bearer"})
        return None

    @contextmanager
    def submit(self, raw_body: bytes, *, authorization: str | None, idempotency_key: str | None) -> Iterator[Reply]:
        """Decide the answer to ``POST /v1/messages``; yields the reply to send.

        The message (if any) is already committed when this yields. A key
        accepted here stays "in flight" until the context exits — the caller
        stalls inside the context and answers after it — so resends during
        the stall see 409 and resends after the answer see the replay.
        """
        reply = self.reject_unauthorized(authorization)
        if reply is None and self._happens(self.config.throttle_rate):
            reply = Reply(
                429,
                {"error": "rate_limited", "detail": "too many requests"},
                {"Retry-After": str(self.config.retry_after)},
            )
        if reply is None and self._happens(self.config.error_rate):
            reply = Reply(500, {"error": "internal_error"})
        if reply is not None:
            yield reply
            return

        try:
            payload = json.loads(raw_body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            yield Reply(400, {"error": "invalid_json", "detail": str(exc)})
            return
        problem = validation_problem(payload)
        if problem is not None:
            yield Reply(422, {"error": "validation_error", "detail": problem})
            return

        digest = request_digest(payload)
        dedupe = self.config.mode == "idempotent" and idempotency_key is not None
        if not dedupe:
            # lookup and bare modes record the key for the listing but do not
            # honour it: a resend is a second message, by design.
            message = self.store.accept(payload, digest=digest, idempotency_key=idempotency_key, remember_key=False)
            yield Reply(201, message, stall_seconds=self._stall_seconds())
            return

        accepted_here = False
        with self._keys_lock:
            if idempotency_key in self._keys_in_flight:
                reply = Reply(
                    409,
                    {"error": "idempotency_conflict", "detail": "a request with this key is in progress"},
                )
            elif (stored := self.store.stored_response(idempotency_key)) is not None:
                if stored.request_digest != digest:
                    reply = Reply(
                        422,
                        {"error": "idempotency_error", "detail": "key was used with a different request body"},
                    )
                else:
                    reply = Reply(stored.status, stored.body, {"Idempotent-Replayed": "true"})
            else:
                message = self.store.accept(payload, digest=digest, idempotency_key=idempotency_key, remember_key=True)
                self._keys_in_flight.add(idempotency_key)
                accepted_here = True
                reply = Reply(201, message, stall_seconds=self._stall_seconds())
        try:
            yield reply
        finally:
            if accepted_here:
                with self._keys_lock:
                    self._keys_in_flight.discard(idempotency_key)

    def get_message(self, message_id: str, *, authorization: str | None) -> Reply:
        reply = self.reject_unauthorized(authorization)
        if reply is not None:
            return reply
        message = self.store.get(message_id)
        if message is None:
            return Reply(404, {"error": "not_found"})
        return Reply(200, message)

    def lookup(self, client_reference: str, *, authorization: str | None) -> Reply:
        if self.config.mode == "bare":
            # The route does not exist for a bare provider.
            return Reply(404, {"error": "not_found"})
        reply = self.reject_unauthorized(authorization)
        if reply is not None:
            return reply
        fault = self.config.lookup_fault
        if fault == "401":
            return Reply(401, {"error": "unauthorized"}, {"WWW-Authenticate": "Bearer"})
        if fault == "429":
            return Reply(429, {"error": "rate_limited", "detail": "too many lookups"},
                         {"Retry-After": str(self.config.retry_after)})
        if fault == "500":
            return Reply(500, {"error": "internal_error"})
        if self.config.lookup_ignores_reference:
            found = self.store.all_messages()
        else:
            found = self.store.find_by_client_reference(client_reference)
        return Reply(200, {"data": found}, stall_seconds=self.config.lookup_stall)

    def listing(self) -> Reply:
        return Reply(200, self.store.all_messages())

    def health(self) -> Reply:
        return Reply(200, {"status": "ok", "mode": self.config.mode})

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> str:
        """Bind and serve in a background thread; returns the base URL.

        Raises ``OSError`` when the address cannot be bound.
        """
        self._httpd = _Server((self.config.host, self.config.port), _Handler)
        self._httpd.simulator = self
        # A short poll interval: shutdown() waits for the next poll, and a
        # test or chaos run restarts the simulator many times.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="provider-simulator", daemon=True
        )
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("simulator is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop accepting connections. Stalled answers are abandoned (daemon threads)."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd = None
        self._thread = None


class _Server(ThreadingHTTPServer):
    # Chaos runs open many connections at once; the default backlog of 5 would
    # turn a burst into refused connections that look like an outage.
    request_queue_size = 128
    daemon_threads = True
    simulator: ProviderSimulator


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "provider-simulator/1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        simulator = self.server.simulator
        url = urlsplit(self.path)
        authorization = self.headers.get("Authorization")
        if url.path == "/health":
            reply = simulator.health()
        elif url.path == "/v1/messages":
            query = parse_qs(url.query, keep_blank_values=True)
            if "client_reference" in query:
                reply = simulator.lookup(query["client_reference"][0], authorization=authorization)
            else:
                reply = simulator.listing()
        elif url.path.startswith("/v1/messages/") and url.path.count("/") == 3:
            reply = simulator.get_message(url.path.rsplit("/", 1)[1], authorization=authorization)
        else:
            reply = Reply(404, {"error": "not_found"})
        if reply.stall_seconds:
            threading.Event().wait(reply.stall_seconds)
        self._respond(reply)

    def do_POST(self) -> None:  # noqa: N802
        # Read the whole body before answering anything: closing a socket with
        # unread input makes the kernel send RST, and the client would see a
        # reset instead of our 401/404.
        raw_body = self._read_body()
        if raw_body is None:
            return
        if urlsplit(self.path).path != "/v1/messages":
            self._respond(Reply(404, {"error": "not_found"}))
            return
        idempotency_key = (self.headers.get("Idempotency-Key") or "").strip() or None
        with self.server.simulator.submit(
            raw_body,
            authorization=self.headers.get("Authorization"),
            idempotency_key=idempotency_key,
        ) as reply:
            if reply.stall_seconds:
                # The message is committed; holding the answer past the
                # client's read timeout is the "accepted, answer lost" fault.
                threading.Event().wait(reply.stall_seconds)
        # Answer only after the key left the in-flight set: a client that
        # resends the moment it reads this answer gets the replay, not a 409.
        self._respond(reply)

    def _read_body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self._respond(Reply(400, {"error": "invalid_request", "detail": "bad Content-Length"}))
            return None
        return self.rfile.read(length) if length else b""

    def _respond(self, reply: Reply) -> None:
        data = json.dumps(reply.body).encode("utf-8")
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", f"req_{uuid.uuid4().hex[:16]}")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (typically its read timeout during a stall).
            # The message stays accepted; that is the point of the fault.
            self.log_message("client went away before the %s answer was written", reply.status)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        if not self.server.simulator.config.quiet:
            super().log_message(format, *args)


# -- command line ----------------------------------------------------------


# Flags are read by the project's one parser of outside numbers
# (dependency-free, so `python -m connectors.simulator` runs without Django).
_probability = number_flag(minimum=0, maximum=1)
_seconds = number_flag(minimum=0, maximum=86400)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's options, shared by ``python -m`` and the management command."""
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"Address to bind (default {DEFAULT_HOST}).")
    parser.add_argument(
        "--port",
        type=whole_flag(0, 65535),
        default=DEFAULT_PORT,
        help=f"Port to listen on (default {DEFAULT_PORT}); 0 picks a free port, printed on the first line.",
    )
    parser.add_argument(
        "--db",
        type=Path,
        default=DEFAULT_DB_PATH,
        metavar="PATH",
        help="SQLite file holding what the provider accepted; survives restarts; "
        f"parent directories are created (default {DEFAULT_DB_PATH}).",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="idempotent",
        help="idempotent: honours Idempotency-Key and supports lookup; lookup: only lookup by "
        "client_reference (a resend is a second message); bare: neither (lookup answers 404). "
        "Default idempotent.",
    )
    parser.add_argument(
        "--stall-after-accept",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="Commit the message, then hold the answer this long - past a client's read timeout, "
        "the message is accepted but the client does not know it. Default 0 (no stall).",
    )
    parser.add_argument(
        "--stall-probability",
        type=_probability,
        default=1.0,
        metavar="P",
        help="Chance that an accepted message stalls, when --stall-after-accept is given (default 1.0).",
    )
    parser.add_argument(
        "--error-rate",
        type=_probability,
        default=0.0,
        metavar="P",
        help="Chance that a POST answers 500 without storing anything (default 0).",
    )
    parser.add_argument(
        "--throttle-rate",
        type=_probability,
        default=0.0,
        metavar="P",
        help="Chance that a POST answers 429 with Retry-After, without storing anything (default 0).",
    )
    parser.add_argument(
        "--retry-after",
        type=whole_flag(0, 86400),
        default=DEFAULT_RETRY_AFTER_SECONDS,
        metavar="SECONDS",
        help=f"Retry-After value sent with a 429 (default {DEFAULT_RETRY_AFTER_SECONDS}).",
    )
    parser.add_argument(
        "--reject-auth",
        action="store_true",
        help="Answer 401 to every provider API request (the listing and /health stay open).",
    )
    parser.add_argument(
        "--seed", type=whole_flag(0), default=None, metavar="N", help="Seed for the fault dice, for reproducible runs."
    )
    parser.add_argument(
        "--lookup-fault",
        choices=LOOKUP_FAULTS[1:],
        default="",
        help="Answer every lookup with this status: 500 (server error), 429 (throttled, with Retry-After) "
        "or 401 (credentials refused). Default: lookups answer normally.",
    )
    parser.add_argument(
        "--lookup-stall",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="Hold every lookup answer this long (past a client's read timeout: a lookup timeout). Default 0.",
    )
    parser.add_argument(
        "--lookup-ignores-reference",
        action="store_true",
        help="Answer a lookup with every message, whatever client_reference it asks for "
        "(a provider whose lookup filter is broken).",
    )
    parser.add_argument("--quiet", action="store_true", help="Do not log each request to stderr.")


def config_from_options(options: Mapping[str, Any]) -> SimulatorConfig:
    """Build a config from parsed options (argparse namespace vars or Django's options)."""
    return SimulatorConfig(
        host=options["host"],
        port=options["port"],
        db_path=Path(options["db"]).resolve(),
        mode=options["mode"],
        stall_after_accept=options["stall_after_accept"],
        stall_probability=options["stall_probability"],
        error_rate=options["error_rate"],
        throttle_rate=options["throttle_rate"],
        retry_after=options["retry_after"],
        reject_auth=options["reject_auth"],
        seed=options["seed"],
        quiet=options["quiet"],
        lookup_fault=options.get("lookup_fault") or "",
        lookup_stall=options.get("lookup_stall") or 0.0,
        lookup_ignores_reference=bool(options.get("lookup_ignores_reference")),
    )


def serve(config: SimulatorConfig, *, out: TextIO | None = None) -> int:
    """Run the simulator until SIGTERM or SIGINT; returns the exit status (0).

    The first line written to ``out`` (stdout by default), flushed, is
    ``provider-simulator listening on http://HOST:PORT mode=MODE db=PATH``,
    so a parent process can read the port chosen for ``--port 0``. Must be
    called from the main thread (it installs signal handlers).
    """
    out = out or sys.stdout
    simulator = ProviderSimulator(config)
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: Any) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        url = simulator.start()
        out.write(f"provider-simulator listening on {url} mode={config.mode} db={config.db_path}\n")
        out.flush()
        # A timed wait so the main thread wakes up to run the signal handler.
        while not stop_requested.wait(0.1):
            pass
    finally:
        simulator.stop()
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
    print("provider-simulator stopped", file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m connectors.simulator",
        description="An HTTP email provider simulator with its own SQLite storage (DESIGN §10).",
    )
    add_arguments(parser)
    options = parser.parse_args(argv)
    try:
        config = config_from_options(vars(options))
    except ValueError as exc:
        parser.error(str(exc))
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
