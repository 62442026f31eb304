"""The layout rules of DESIGN §2, checked on the source so they cannot come
back: imports point one way, the engine names no layer above it (not even in
a string), the review layer stays out of the engine, the project package's
ground layer imports no app and is all of it an app may import, only
`run_worker` imports the worker runtime (and only the worker its completer
and heartbeat), and no module imports itself back through another
(module-level or inside a function)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("durable", "jobs", "review", "operations", "connectors", "company", "gateway", "console", "proving")
# What each app may import of the others (DESIGN §2).
ALLOWED = {
    "jobs": set(),
    "review": {"jobs"},
    "connectors": set(),
    "operations": {"jobs", "review", "connectors"},
    "company": {"jobs", "review", "operations", "connectors"},
    "gateway": {"jobs", "review", "operations", "connectors", "company"},
    "console": {"jobs", "review", "operations"},
    "proving": {"jobs", "review", "operations", "connectors", "company", "gateway"},
}
# The ground layer: the modules of the project package every app may use
# (those of them that exist). The rest of `durable` (settings, URLs, the
# WSGI entry, the login backend) sits on top of the apps, not under them.
GROUND = ("durable.numbers", "durable.net", "durable.server")
# What the review layer (human decisions on jobs) was made of when it lived
# in the engine: none of it may come back there.
REVIEW_LAYER_FILES = ("review*.py", "decisions.py", "bulk.py", "assignment.py", "masking.py")


def _modules() -> dict[str, Path]:
    found = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every project module `name` imports, at module level or in a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in MODULES:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_imports_point_one_way():
    wrong = [f"{name} imports {target}" for name, targets in GRAPH.items() for target in targets
             if (app := name.split(".")[0]) in ALLOWED and (other := target.split(".")[0]) != app
             and other in ALLOWED and other not in ALLOWED[app]]
    assert wrong == []


def test_the_engine_names_no_layer_above_it_even_in_a_string():
    # A URL name, a permission or a dotted path of an app above is a
    # dependency too; the app above registers itself into the engine instead.
    # A comment or a docstring naming a module above (`review.due`) is one too.
    named = re.compile(r"""["'`](console:|review\.|operations\.|company\.|gateway\.|proving\.)""")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for name, path in MODULES.items() if name.startswith("jobs.")
             for n, line in enumerate(path.read_text().splitlines(), 1) if named.search(line)]
    assert found == []


def test_the_review_layer_stays_out_of_the_engine():
    # Decisions, their policy, due times, bulk, assignment, masking and the
    # job admin are the review app's; the engine keeps only the hooks the
    # review layer registers into (`transitions.on_review_change`, the action registry).
    back = sorted(str(path.relative_to(ROOT)) for pattern in REVIEW_LAYER_FILES
                  for path in (ROOT / "jobs").rglob(pattern) if "migrations" not in path.parts)
    job_admins = [f"{path.relative_to(ROOT)}:{node.lineno}" for name, path in MODULES.items()
                  if name.split(".")[0] == "jobs"
                  for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.ClassDef) and node.name == "JobAdmin"]
    assert back == [] and job_admins == []


def test_the_ground_layer_imports_no_app():
    ground = [name for name in GROUND if name in MODULES]
    assert "durable.numbers" in ground
    wrong = [f"{name} imports {target}" for name in ground for target in GRAPH[name] if target not in GROUND]
    assert wrong == []


def test_apps_import_only_the_ground_layer_of_the_project_package():
    # Every app may use `durable.numbers` (and `durable.net`, `durable.server`); none reaches
    # into the settings, the URLs or anything else the project package
    # builds on top of the apps.
    wrong = [f"{name} imports {target}" for name, targets in GRAPH.items() for target in targets
             if name.split(".")[0] in ALLOWED and target.split(".")[0] == "durable" and target not in GROUND]
    assert wrong == []


def test_only_run_worker_imports_the_worker_runtime():
    importers = sorted(name for name, targets in GRAPH.items() if "jobs.worker" in targets)
    assert importers == ["jobs.management.commands.run_worker"]


def test_only_the_worker_drives_its_completer_and_its_heartbeat():
    # The outcome recording and the lease renewal are the worker's parts,
    # driven by its loop; nothing else records a worker's outcomes.
    for part in ("jobs.completer", "jobs.leases"):
        importers = sorted(name for name, targets in GRAPH.items() if part in targets)
        assert importers == ["jobs.worker"], part


def test_no_module_imports_itself_back():
    cycles = []
    for start in GRAPH:
        seen, stack = set(), [(start, [start])]
        while stack:
            node, route = stack.pop()
            for target in GRAPH[node]:
                if target == start:
                    cycles.append(" → ".join([*route, start]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*route, target]))
    assert cycles == []
