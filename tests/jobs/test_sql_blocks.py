"""The named SQL blocks of jobs/sql/*.sql: read once at import, each name
once, each block used by the engine, and a block the engine asks for that no
file holds fails loudly."""

import re
from pathlib import Path

import pytest

from jobs import sql
from jobs.sql import BlockError, compact, fill, query

ROOT = Path(__file__).resolve().parents[2]


def _write(directory: Path, name: str, text: str) -> str:
    (directory / name).write_text(text)
    return name


def test_a_block_runs_to_the_next_name_without_its_comments_and_indentation(tmp_path):
    name = _write(tmp_path, "q.sql", "-- the file's own words\n\n-- first --\n-- What it is.\nSELECT 1\n"
                                     "    FROM ( t ) -- why\n\n-- second --\n-- Another.\nSELECT '{}', {slot}\n")

    blocks = sql._load(tmp_path, (name,))

    assert blocks == {"first": "SELECT 1 FROM (t)", "second": "SELECT '{}', {slot}"}


@pytest.mark.parametrize(("files", "message"), [
    ({"a.sql": "-- one --\nSELECT 1\n", "b.sql": "-- one --\nSELECT 2\n"}, "'one' is defined twice: a.sql:1 and b.sql:1"),
    ({"a.sql": "-- one --\n-- Only words.\n\n-- two --\nSELECT 2\n"}, "'one' (a.sql:1) holds no SQL"),
], ids=["twice", "empty"])
def test_a_name_given_twice_or_a_block_without_sql_fails_the_load(tmp_path, files, message):
    names = tuple(_write(tmp_path, name, text) for name, text in files.items())

    with pytest.raises(BlockError, match=re.escape(message)):
        sql._load(tmp_path, names)


def test_a_block_no_file_holds_fails_when_asked_for():
    with pytest.raises(BlockError, match="no SQL block 'claim_nowhere'"):
        query("claim_nowhere")


def test_fill_puts_each_value_in_once_and_refuses_a_slot_without_one():
    assert fill("SELECT {a}, '{}' FROM {b}", a="{b}", b="t") == "SELECT {b}, '{}' FROM t"
    with pytest.raises(KeyError, match="no value for {b}"):
        fill("SELECT {a} FROM {b}", a="1")


def test_compact_keeps_what_is_sent_and_drops_comments_and_layout():
    assert compact("SELECT ( a ) -- note\n  FROM t\n") == "SELECT (a) FROM t"


def test_every_block_is_used_by_the_engine():
    """A block left behind when the Python stops asking for it would read as
    SQL that runs."""
    python = "\n".join(path.read_text() for path in (ROOT / "jobs").glob("*.py"))
    unused = [name for name in sql.QUERIES if f'"{name}"' not in python]
    assert not unused, unused
