"""The engine's SQL, in named blocks of the `.sql` files beside this module
(procrastinate's `sql/queries.sql`), read once at import:

    -- claim_fair_one --
    -- What the block is, and which index serves it (comment lines).
    SELECT …

A block runs from its name line to the next one. Its text is kept as it is
sent: comments and indentation out (`compact`). In a block, `%(name)s` and
`%s` are bound parameters; `{name}` is where the Python that composes the
statement puts another block, or a fragment it chose (`fill`). A name
defined twice, a block with no SQL, and a block the Python asks for that no
file defines all fail at import.

`schema.sql` is not read here: it is the current text of the schema's
functions and triggers, checked against the database by a test."""

import re
from pathlib import Path

__all__ = ["compact", "fill", "query", "QUERIES", "BlockError"]

FILES = ("claim.sql", "fence.sql", "writes.sql", "enqueue.sql")
_NAME = re.compile(r"^-- ([a-z][a-z0-9_]*) --$")
_SLOT = re.compile(r"\{(\w+)\}")


class BlockError(LookupError):
    """A block defined twice, holding no SQL, or asked for and not defined."""


def compact(sql: str) -> str:
    """`sql` without its comments and indentation. A claim statement shorter
    than 4 KiB has its conversion (named parameters to $n) kept in psycopg's
    cache instead of redone on every claim. (The blocks hold no string
    literal with "--" or significant whitespace.)"""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split()).replace("( ", "(").replace(" )", ")")


def _load(directory: Path, files: tuple[str, ...]) -> dict[str, str]:
    """Every block of `files`: name → compacted text."""
    blocks: dict[str, str] = {}
    where: dict[str, str] = {}
    for file in files:
        name, lines = None, []
        for number, line in enumerate((directory / file).read_text().splitlines(), 1):
            found = _NAME.match(line)
            if found is None:
                lines.append(line)
                continue
            _keep(blocks, where, name, lines, file)
            name, lines = found.group(1), []
            if name in where:
                raise BlockError(f"SQL block {name!r} is defined twice: {where[name]} and {file}:{number}")
            where[name] = f"{file}:{number}"
        _keep(blocks, where, name, lines, file)
    return blocks


def _keep(blocks: dict[str, str], where: dict[str, str], name: str | None, lines: list[str], file: str) -> None:
    if name is None:
        return  # (the file's own comments, before its first block)
    text = compact("\n".join(lines))
    if not text:
        raise BlockError(f"SQL block {name!r} ({where[name]}) holds no SQL")
    blocks[name] = text


QUERIES: dict[str, str] = _load(Path(__file__).resolve().parent, FILES)


def query(name: str) -> str:
    """The block `name`'s text; a name no file defines fails (at import,
    where a module takes its blocks)."""
    try:
        return QUERIES[name]
    except KeyError:
        raise BlockError(f"no SQL block {name!r} in jobs/sql/{{{','.join(FILES)}}}") from None


def fill(template: str, **values) -> str:
    """`template` with each `{name}` replaced by `values[name]` (a value is
    put in as it is, never filled again); a name without a value fails."""
    def value(found: re.Match) -> str:
        try:
            return str(values[found.group(1)])
        except KeyError:
            raise KeyError(f"no value for {{{found.group(1)}}} in: {template[:120]}") from None

    return _SLOT.sub(value, template)
