"""A migration imports no live module of the project, nor another migration:
what it shares with others is frozen in a migrations package's private
modules (`jobs/migrations/_frozen.py`), so the engine's modules can change
without changing what an old migration does."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("durable", "jobs", "review", "operations", "connectors", "company", "gateway", "console", "proving")


def _project_imports(path: Path) -> set[str]:
    """The project modules `path` imports (module level or in a function,
    `import_module` by name included); relative imports by their full name."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
            found.add(base)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
    return {name for name in found if name.split(".")[0] in APPS}


def test_migrations_import_only_frozen_modules():
    live = {}
    for path in sorted(ROOT.glob("*/migrations/[0-9]*.py")):
        imported = {name for name in _project_imports(path)
                    if not (".migrations._" in name and name.split(".")[-1].startswith("_"))}
        if imported:
            live[str(path.relative_to(ROOT))] = sorted(imported)
    assert not live, live


def test_the_frozen_modules_import_no_project_module():
    for path in sorted(ROOT.glob("*/migrations/_*.py")):
        if path.name == "__init__.py":
            continue
        assert not _project_imports(path), path
