"""Log lines for workers and tools. No Django imports: settings' LOGGING uses it."""

import json
import logging
from datetime import datetime


class LogFormatter(logging.Formatter):
    """`text`: one concise line per event; `json`: one JSON object per line."""

    def __init__(self, fmt: str = "text"):
        super().__init__()
        self.fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None) or {"event": record.getMessage()}
        ts = datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")
        if self.fmt == "json":
            return json.dumps({"ts": ts, "level": record.levelname.lower(), **fields}, default=str)
        rest = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("event", "worker"))
        return f"{ts} {record.levelname:<7} {fields.get('event')} {rest}".rstrip()
