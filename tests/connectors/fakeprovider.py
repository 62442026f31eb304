"""A scriptable HTTP provider in a thread, for answers the simulator never
gives: a lookup that ignores its filter, a slow drip, an endless body."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FakeProvider:
    # (method, path, body) -> None; the handler writes the answer itself.
    answer: Callable[[BaseHTTPRequestHandler, str, str, bytes], None]
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeProvider:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, body))
                try:
                    fake.answer(self, self.command, self.path, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what the test is about

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def reply_json(handler: BaseHTTPRequestHandler, status: int, document) -> None:
    data = json.dumps(document).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def drip(handler: BaseHTTPRequestHandler, *, every: float, stop: threading.Event) -> None:
    """Answer 200 with a body that arrives one byte per `every` seconds —
    each read is quick, the whole answer never is."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    while not stop.is_set():
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(every)


def message(reference: str, message_id: str) -> dict:
    return {"id": message_id, "client_reference": reference, "to": "ada@example.com", "subject": "Hello",
            "accepted_at": "2026-11-30T10:00:00+00:00"}
