"""A log line is one line, whatever its fields contain: control characters
in a field or a message are escaped, so a forged job key cannot print a line
that passes for another record. A server error's traceback reaches the
console, each of its lines indented under the record it belongs to."""

import json
import logging
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.logformat import LogFormatter

FORGED = "send-quote\n2026-11-30T10:00:00.000+00:00 INFO    job.done tenant=studio key=paid-invoice"


def record(fields=None, *, message="msg", exc_info=None) -> logging.LogRecord:
    rec = logging.LogRecord("jobs.worker", logging.INFO, __file__, 1, message, None, exc_info)
    if fields is not None:
        rec.fields = fields
    return rec


@pytest.mark.parametrize("value", [FORGED, "a\rb", "a\x1b[2Jb", "a\u2028b", "a\x00b", "a\x85b"])
def test_a_field_value_with_control_characters_stays_on_one_line(value):
    line = LogFormatter("text").format(record({"event": "job.claim", "tenant": "studio", "key": value}))
    assert len(line.splitlines()) == 1
    assert not any(c in line for c in "\n\r\x1b\u2028\x00\x85")


def test_a_forged_job_key_is_visible_as_an_escape():
    line = LogFormatter("text").format(record({"event": "job.claim", "key": FORGED}))
    assert "key=send-quote\\n2026-11-30T10:00:00.000+00:00 INFO    job.done" in line


def test_a_plain_message_is_escaped_too():
    assert LogFormatter("text").format(record(message="line one\nline two")).count("\n") == 0


def test_json_lines_stay_one_line():
    line = LogFormatter("json").format(record({"event": "job.claim", "key": FORGED}))
    assert len(line.splitlines()) == 1 and json.loads(line)["key"] == FORGED


def test_a_traceback_follows_its_line_indented_so_it_cannot_pass_for_a_log_line():
    try:
        raise ValueError("bad input\n2026-11-30T10:00:00.000+00:00 INFO    forged")
    except ValueError:
        import sys

        exc_info = sys.exc_info()
    text = LogFormatter("text").format(record(message="Internal Server Error: /x", exc_info=exc_info))
    first, *trace = text.split("\n")
    assert first.endswith("Internal Server Error: /x")
    assert trace and all(line.startswith("    | ") for line in trace)
    assert any("ValueError: bad input" in line for line in trace)
    as_json = json.loads(LogFormatter("json").format(record(message="boom", exc_info=exc_info)))
    assert "ValueError: bad input" in as_json["traceback"]


@given(st.lists(st.floats(min_value=0, max_value=4e9, allow_nan=False), min_size=1, max_size=20))
def test_a_line_s_timestamp_is_its_record_s_time_to_the_millisecond(times):
    """The formatter reuses each second's date text: a line still shows its
    own time, rounded as `datetime` rounds it — also on a second's last
    microsecond and for lines out of order (threads share the formatter)."""
    formatter = LogFormatter("text")
    for created in [*times, *(int(t) + 0.9999996 for t in times)]:
        rec = record({"event": "job.done"})
        rec.created = created
        expected = datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")
        assert formatter.format(rec).split(" ")[0] == expected
