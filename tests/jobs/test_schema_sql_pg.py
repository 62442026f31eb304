"""jobs/sql/schema.sql is the current text of every function and trigger
the migrations leave in the database: none missing from it, none extra,
each body as the database holds it (whitespace aside)."""

import re
from pathlib import Path

import pytest
from django.db import connection

SCHEMA = Path(__file__).resolve().parents[2] / "jobs" / "sql" / "schema.sql"
_START = re.compile(r"^CREATE (?:OR REPLACE FUNCTION|TRIGGER) ", re.M)
# The claim statements' functions jobs/pooling.py makes at run time: not schema.
_RUN_TIME = re.compile(r"jobs_stmt_[0-9a-f]{24}")


def _key(definition: str) -> str:
    """What names a definition: a function's signature, a trigger's name and table."""
    trigger = re.match(r"CREATE TRIGGER (\S+) .*? ON (\S+) ", definition, re.S)
    if trigger:
        return f"trigger {trigger.group(1)} on {trigger.group(2)}"
    return "function " + definition.split("\n", 1)[0].removeprefix("CREATE OR REPLACE FUNCTION ").strip()


def _normalised(definition: str) -> str:
    return " ".join(definition.split()).removesuffix(";").rstrip()


def definitions_in_file(text: str) -> dict[str, str]:
    """schema.sql's definitions by `_key` (its own comments are the lines
    that start with "--"; a body's comments are indented)."""
    text = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    starts = [found.start() for found in _START.finditer(text)]
    assert not text[: starts[0] if starts else len(text)].strip(), "schema.sql holds text outside a definition"
    found: dict[str, str] = {}
    for start, end in zip(starts, [*starts[1:], len(text)]):
        definition = text[start:end]
        assert _key(definition) not in found, f"{_key(definition)} is in schema.sql twice"
        found[_key(definition)] = _normalised(definition)
    return found


def definitions_in_database() -> dict[str, str]:
    """The public schema's functions (but an extension's and the run-time
    statements') and triggers, as PostgreSQL prints them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc AS p "
            "JOIN pg_namespace AS n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p') AND NOT EXISTS ("
            "    SELECT FROM pg_depend AS d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid "
            "    AND d.deptype = 'e')")
        functions = [definition for name, definition in cursor.fetchall() if not _RUN_TIME.fullmatch(name)]
        cursor.execute(
            "SELECT pg_get_triggerdef(t.oid, true) FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND NOT t.tgisinternal")
        triggers = [definition for (definition,) in cursor.fetchall()]
    return {_key(definition): _normalised(definition) for definition in functions + triggers}


def differences(in_file: dict[str, str], in_database: dict[str, str]) -> list[str]:
    return ([f"{key}: in the database, missing from schema.sql" for key in sorted(in_database.keys() - in_file.keys())]
            + [f"{key}: in schema.sql, not in the database" for key in sorted(in_file.keys() - in_database.keys())]
            + [f"{key}: differs:\n  schema.sql: {in_file[key]}\n  database:   {in_database[key]}"
               for key in sorted(in_file.keys() & in_database.keys()) if in_file[key] != in_database[key]])


@pytest.mark.postgres
@pytest.mark.django_db
def test_schema_sql_holds_every_function_and_trigger_of_the_migrated_database_as_it_is():
    problems = differences(definitions_in_file(SCHEMA.read_text()), definitions_in_database())

    assert not problems, "\n".join(problems)


_FUNCTION = """CREATE OR REPLACE FUNCTION public.f(names character varying[])
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- a body's own comment
    RETURN 1;
END $function$
"""
_TRIGGER = "CREATE TRIGGER t AFTER INSERT ON jobs_job FOR EACH STATEMENT EXECUTE FUNCTION f()"


@pytest.mark.parametrize(("text", "expected"), [
    (f"-- What f is for.\n{_FUNCTION.strip()};\n\n-- And t.\n{_TRIGGER};\n", []),
    (f"{_TRIGGER};\n", ["function public.f(names character varying[]): in the database, missing from schema.sql"]),
    (f"{_FUNCTION};\n{_TRIGGER};\nCREATE TRIGGER u AFTER DELETE ON jobs_job FOR EACH ROW EXECUTE FUNCTION f();\n",
     ["trigger u on jobs_job: in schema.sql, not in the database"]),
    (_FUNCTION.replace("RETURN 1", "RETURN 2") + ";\n" + _TRIGGER, ["function public.f(names character varying[]): differs:"]),
    (_FUNCTION.replace("    -- a body's own comment\n", "") + ";\n" + _TRIGGER,
     ["function public.f(names character varying[]): differs:"]),
], ids=["same", "missing", "extra", "body", "body-comment"])
def test_the_comparison_names_a_definition_missing_extra_or_changed(text, expected):
    database = {_key(definition): _normalised(definition) for definition in (_FUNCTION, _TRIGGER)}

    found = differences(definitions_in_file(text), database)

    assert [problem.split("\n")[0] for problem in found] == expected
