"""Log lines for workers and tools. No Django imports: settings' LOGGING uses it."""

import json
import logging
import traceback
from datetime import datetime

# Control characters (and Unicode's line and paragraph separators) in a field
# value are written as escapes: a job key or an error message containing a
# newline must not be able to forge a second log line.
_ESCAPES = {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def escape(value) -> str:
    """`value` as one line of text: control characters become escapes."""
    text = str(value)
    # Every character _ESCAPES rewrites is non-printable (categories Cc, Zl,
    # Zp), so printable text — almost every value — skips the per-character
    # translation.
    return text if text.isprintable() else text.translate(_ESCAPES)


class LogFormatter(logging.Formatter):
    """`text`: one concise line per event; `json`: one JSON object per line.

    An exception's traceback (`log.exception`, Django's `django.request`
    errors) follows a text line, each of its lines indented so none can pass
    for a log line of its own; in JSON it is the `traceback` field."""

    def __init__(self, fmt: str = "text"):
        super().__init__()
        self.fmt = fmt
        self._ts: tuple[int, str, str] = (-1, "", "")

    def _timestamp(self, created: float) -> str:
        # The date, time and UTC offset are computed once per second (the
        # local-time conversion is the dear part, and a worker writes two
        # lines per job); each line only adds its milliseconds. One tuple,
        # replaced whole: threads sharing the formatter never see one
        # second's key with another's text.
        second = int(created)
        micros = round((created - second) * 1_000_000)  # as datetime rounds it
        if micros == 1_000_000:
            second, micros = second + 1, 0
        cached = self._ts
        if cached[0] != second:
            text = datetime.fromtimestamp(second).astimezone().isoformat(timespec="seconds")
            cached = (second, text[:19], text[19:])  # "YYYY-MM-DDTHH:MM:SS", "+HH:MM"
            self._ts = cached
        return f"{cached[1]}.{micros // 1000:03d}{cached[2]}"

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None) or {"event": record.getMessage()}
        ts = self._timestamp(record.created)
        trace = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""
        if self.fmt == "json":
            line = {"ts": ts, "level": record.levelname.lower(), **fields}
            if trace:
                line["traceback"] = trace
            return json.dumps(line, default=str)
        rest = " ".join(f"{escape(k)}={escape(v)}" for k, v in fields.items() if k not in ("event", "worker"))
        line = f"{ts} {record.levelname:<7} {escape(fields.get('event'))} {rest}".rstrip()
        if trace:
            line += "\n" + "\n".join(f"    | {escape(part)}" for part in trace.rstrip("\n").split("\n"))
        return line
