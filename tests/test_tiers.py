"""A tier is chosen without importing the modules it leaves out (tests/support/tiers.py): a module is
skipped only when its recorded marks prove that ``-m`` would deselect every one of its tests, and only
while nothing that decided those marks has changed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import tiers

UNIT = "not storage and not heavy and not slow and not live"


def test_a_module_whose_every_test_is_deselected_is_left_out() -> None:
    assert tiers.rejects_all(UNIT, [["storage"], ["heavy", "parametrize"]])
    assert tiers.rejects_all("slow", [[], ["storage"]])


def test_a_module_with_one_selected_test_is_imported_and_selected_test_by_test() -> None:
    # given a module mixing storage tests and one pure test: the unit tier keeps the pure one
    assert not tiers.rejects_all(UNIT, [["storage"], []])
    assert not tiers.rejects_all("slow", [[], ["slow"]])


def test_a_module_with_no_recorded_test_is_never_left_out_on_its_record() -> None:
    # an empty record proves nothing is there to select; such modules are not written to the index
    assert tiers.rejects_all(UNIT, [])


def test_the_digest_follows_the_module_and_every_conftest_above_it(tmp_path: Path, monkeypatch) -> None:
    # given a tests/ tree of our own, with a module two folders down
    root = tmp_path / "tests"
    (root / "area").mkdir(parents=True)
    (root / "conftest.py").write_text("# root\n")
    (root / "area" / "conftest.py").write_text("# area\n")
    module = root / "area" / "test_rule.py"
    module.write_text("def test_rule(): pass\n")
    monkeypatch.setattr(tiers, "TESTS", root.resolve())
    first = tiers.digest(module.resolve())
    # when any of the three changes, the record is out of date
    for changed in (module, root / "conftest.py", root / "area" / "conftest.py"):
        before = changed.read_text()
        changed.write_text(before + "# changed\n")
        assert tiers.digest(module.resolve()) != first, changed
        changed.write_text(before)
    assert tiers.digest(module.resolve()) == first
    # and a file outside tests/ has no entry at all
    assert tiers._key(tmp_path / "test_elsewhere.py") is None


def test_the_index_names_only_modules_that_exist_with_the_marks_it_read() -> None:
    index = json.loads(tiers.INDEX.read_text())["modules"]
    assert index, "make test-tiers writes tests/support/tiers.json"
    for key, entry in index.items():
        assert (tiers.TESTS / key).is_file(), f"{key} is indexed but gone: make test-tiers"
        assert entry["marks"] and len(entry["digest"]) == 64
