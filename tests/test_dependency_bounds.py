"""Every dependency's lower bound is a full patch release (x.y.z) that the
installed, tested release satisfies, so no install can pick an older release
with known fixes missing: "Django>=5.2" would let an install pick 5.2.0, with
every later security fix missing."""

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

PYPROJECT = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
REQUIREMENTS = [*PYPROJECT["project"]["dependencies"], *PYPROJECT["project"]["optional-dependencies"]["test"]]


def release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@pytest.mark.parametrize("requirement", REQUIREMENTS)
def test_the_lower_bound_is_a_patch_release_the_tested_one_satisfies(requirement):
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    lower = re.search(r">=\s*([0-9][0-9.]*)", requirement)
    assert lower, f"{requirement}: no lower bound"
    assert lower.group(1).count(".") == 2, f"{requirement}: the lower bound is not a patch release"
    assert release(lower.group(1)) <= release(version(name)), (
        f"{requirement}: the installed {version(name)} does not satisfy it")
