"""Choosing a tier without importing every test module.

``pytest -m EXPR`` decides a test's tier from its marks, and a test's marks are only known once its module
is imported: ``storage`` is added at collection to every test that requests Azurite through a fixture.
Selecting the unit tier therefore used to import all of ``tests/`` (the slow suites, the benchmark, the
SDKs they load) to throw most of it away.

``tests/support/tiers.json`` records, for every test module, the distinct sets of mark names its tests
carry after collection (a set is written as its names separated by spaces; ``""``: no mark), and a digest
of what decided them: the module's own text and the ``conftest.py`` files above it. A module whose digest
still matches, and whose every mark set the ``-m`` expression rejects, is not imported at all. Anything
else is imported and selected test by test, as pytest does:

- a module not in the index, or changed since (its text or a ``conftest.py`` above it), is imported;
- a module with any test the expression accepts is imported, and its tests are selected one by one
  (a module mixing storage and pure tests keeps running its pure tests in the unit tier);
- an expression that matches marks by their arguments (``-m "mark(key=value)"``) imports everything.

So an out-of-date index makes a run slower, never smaller. One change escapes the digest: a fixture that
a module imports from a helper module and that stops, or starts, needing Azurite. ``make test-tiers``
rewrites the index (a collection of the whole suite with ``SETTLE_UPDATE_TIERS=1``); a run's summary
names the modules it imported only because their entry is out of date.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

TESTS = Path(__file__).resolve().parent.parent
INDEX = TESTS / "support" / "tiers.json"
UPDATE_VARIABLE = "SETTLE_UPDATE_TIERS"


def digest(module: Path) -> str:
    """What decides a module's marks: its own text and every ``conftest.py`` from ``tests/`` down to it."""
    h = hashlib.sha256()
    folder = module.parent
    conftests = []
    while folder == TESTS or TESTS in folder.parents:
        conftests.append(folder / "conftest.py")
        folder = folder.parent
    for path in [*reversed(conftests), module]:
        if path.exists():
            h.update(path.relative_to(TESTS).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _key(path: Path) -> str | None:
    """A module's entry: its path under ``tests/``; ``None`` for a file elsewhere (a test's own tmp_path)."""
    resolved = path.resolve()
    return resolved.relative_to(TESTS).as_posix() if TESTS in resolved.parents else None


def rejects_all(expression: str, mark_sets: Iterable[Sequence[str]]) -> bool:
    """Whether ``-m expression`` deselects every test whose marks are one of ``mark_sets``."""
    compiled = Expression.compile(expression)

    def accepts(names: Sequence[str]) -> bool:
        return compiled.evaluate(lambda name, /, **kwargs: not kwargs and name in names)

    return not any(accepts(names) for names in mark_sets)


class TierIndex:
    """The pytest plugin: skips the modules the index proves empty for this run, and rewrites the index."""

    def __init__(self, config: pytest.Config) -> None:
        self.updating = os.environ.get(UPDATE_VARIABLE) == "1"
        expression = config.option.markexpr or ""
        # Marks matched by their arguments are not recorded: such a run imports every module.
        self.expression = expression if expression and "(" not in expression else ""
        self.entries: dict[str, dict[str, object]] = {}
        if INDEX.exists() and not self.updating:
            self.entries = json.loads(INDEX.read_text())["modules"]
        self.skipped = 0
        self.out_of_date: list[str] = []
        self.seen: dict[str, set[tuple[str, ...]]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        if self.updating or not self.expression or collection_path.suffix != ".py":
            return None
        key = _key(collection_path)
        if key is None or not collection_path.name.startswith("test_") or key not in self.entries:
            return None
        entry = self.entries[key]
        marks = entry["marks"]
        assert isinstance(marks, list)
        if not rejects_all(self.expression, [names.split() for names in marks]):
            return None
        if entry["digest"] != digest(collection_path.resolve()):
            self.out_of_date.append(key)
            return None
        self.skipped += 1
        return True

    def observe(self, items: Iterable[pytest.Item]) -> None:
        """Record each test's marks as ``-m`` will see them (called once every mark is added)."""
        if not self.updating:
            return
        for item in items:
            if key := _key(item.path):
                self.seen.setdefault(key, set()).add(tuple(sorted({m.name for m in item.iter_markers()})))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.updating:
            return
        modules = {
            key: {"digest": digest(TESTS / key), "marks": sorted(" ".join(names) for names in sets)}
            for key, sets in sorted(self.seen.items())
        }
        # One line a module, so a change to one module is a one-line diff.
        lines = [f"  {json.dumps(key)}: {json.dumps(row, sort_keys=True)}" for key, row in modules.items()]
        INDEX.write_text('{"modules": {\n' + ",\n".join(lines) + "\n}}\n")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.updating:
            written = INDEX.relative_to(TESTS.parent)
            terminalreporter.write_line(f"tiers: wrote {written} ({len(self.seen)} modules)")
        elif self.out_of_date:
            names = ", ".join(self.out_of_date[:5]) + (" ..." if len(self.out_of_date) > 5 else "")
            terminalreporter.write_line(
                f"tiers: {len(self.out_of_date)} module(s) imported only because their entry in "
                f"tests/support/tiers.json is out of date ({names}): make test-tiers"
            )
