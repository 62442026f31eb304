"""An agent's callback receiver for the tests: a real HTTP server that
records every request it gets (one JSON line each: headers and body) before
it answers — with `--status` (default 200), after `--stall` seconds (only the
first time with `--stall-once`).
Deduplicating by `Idempotency-Key` is the receiver's job (DESIGN §15); the
tests read the log and count what it received.

    python -m tests.gateway.receiver --log FILE [--status 200] [--stall 0]

prints `listening on http://127.0.0.1:<port>` once it accepts connections.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def handler_for(log: Path, *, status: int = 200, stall: float = 0.0, stall_once: bool = False):
    lock = threading.Lock()
    stalled = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            record = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                      "body": body.decode("utf-8", "replace"), "at": time.time()}
            with lock, log.open("a") as out:
                out.write(json.dumps(record) + "\n")
            if stall and not (stall_once and stalled):
                stalled.append(True)
                time.sleep(stall)
            answer = json.dumps({"id": f"rcv-{record['headers'].get('idempotency-key', '')[:8]}"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    return Receiver


def received(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


class ThreadedReceiver:
    """The receiver in a thread of the test process."""

    def __init__(self, log: Path, **options):
        self.log = log
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(log, **options))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/durable"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def received(self) -> list[dict]:
        return received(self.log)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--status", type=int, default=200)
    parser.add_argument("--stall", type=float, default=0.0)
    parser.add_argument("--stall-once", action="store_true", help="Stall only the first request.")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(args.log, status=args.status, stall=args.stall,
                                                               stall_once=args.stall_once))
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
