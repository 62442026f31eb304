"""tools/mutants.py applies its edits by exact source text, in a copy, and
fails loudly when the code it targets changed."""

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mutants():
    from tools import mutants

    return mutants


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "store.py").write_text(
        'def finish():\n    write(\n        "finish",\n        epoch,\n    )\n'
        'def wait():\n    write(\n        "wait",\n        epoch,\n    )\n'
    )
    return tmp_path


def test_an_edit_after_an_anchor_changes_only_that_line_and_restore_undoes_it(mutants, tree):
    mutant = mutants.Mutant("m", "rule", (mutants.Edit("jobs/store.py", "        epoch,", "        0,",
                                                       after='        "wait",'),), ("t",))
    original = (tree / "jobs" / "store.py").read_text()

    originals = mutants.apply(tree, mutant)

    mutated = (tree / "jobs" / "store.py").read_text()
    assert mutated == original.replace('"wait",\n        epoch,', '"wait",\n        0,')
    mutants.restore(originals)
    assert (tree / "jobs" / "store.py").read_text() == original


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("jobs/store.py", "lease_epoch = %s", "1 = 1", ""), "mutation m: pattern not found once in jobs/store.py"),
        (("jobs/store.py", "        epoch,", "        0,", ""), "pattern not found once in jobs/store.py"),
        (("jobs/store.py", "        epoch,", "        0,", '"renew",'), "mutation m: anchor '\"renew\",' not found"),
    ],
    ids=["changed-line", "ambiguous-line", "changed-anchor"],
)
def test_a_pattern_that_no_longer_matches_fails_loudly_and_changes_nothing(mutants, tree, edit, message):
    path, old, new, after = edit
    mutant = mutants.Mutant("m", "rule", (mutants.Edit(path, old, new, after=after),), ("t",))
    original = (tree / "jobs" / "store.py").read_text()

    with pytest.raises(mutants.PatternNotFound, match=message.replace('"', '.').replace("'", ".")):
        mutants.apply(tree, mutant)

    assert (tree / "jobs" / "store.py").read_text() == original


def test_every_curated_mutant_names_tests_that_exist(mutants):
    for mutant in mutants.MUTANTS:
        for test in mutant.tests:
            assert (ROOT / test.split("::")[0]).is_file(), (mutant.name, test)


def test_every_curated_mutant_still_finds_the_code_it_edits(mutants, tmp_path):
    """A mutant whose text the code no longer holds fails here, in the
    suite, not at the end of a quarter-hour mutants pass."""
    for mutant in mutants.MUTANTS:
        for path in {edit.path for edit in mutant.edits}:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / path, tmp_path / path)
        mutants.restore(mutants.apply(tmp_path, mutant))
