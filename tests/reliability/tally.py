"""The figures ``make reliability`` prints: counted by the tests themselves, per area.

Tests add what they did (``TALLY.add("state faults", operations=3, faults=1)``) and route every
invariant through :meth:`Tally.check`, which counts a violation before failing the test. Any test phase
that fails another way (a plain ``assert``, a fixture that cannot reach a dependency, a teardown that
raises) is counted as one violation by ``conftest.py``, and the run's exit status follows the table.

"Operations" are calls made to exercise the product (an operation under test, its retries, a racing
caller, a fuzz case); the suite's own reads that check an invariant afterwards are not counted.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

COLUMNS = ("operations", "faults", "races", "fuzz_cases", "violations")
HEADERS = {
    "operations": "operations tried",
    "faults": "faults injected",
    "races": "races run",
    "fuzz_cases": "fuzz cases",
    "violations": "violations",
}

Scale = Literal["small", "full"]


def scale() -> Scale:
    """``SETTLE_RELIABILITY_SCALE``: ``full`` (default, ``make reliability``) or ``small`` (CI)."""
    value = os.environ.get("SETTLE_RELIABILITY_SCALE", "full").strip().lower()
    if value not in ("small", "full"):
        raise ValueError(f"SETTLE_RELIABILITY_SCALE must be small or full, not {value!r}")
    return "small" if value == "small" else "full"


def sized(full: int, small: int) -> int:
    """``full`` at full scale, ``small`` in CI."""
    return full if scale() == "full" else small


@dataclass
class Tally:
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    # How many fuzz cases of each operation reached storage: (area, operation) -> [reached, total].
    reach: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    # Why each violation counted outside ``check`` was counted (a failed phase, a failed session).
    failures: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self,
        area: str,
        *,
        operations: int = 0,
        faults: int = 0,
        races: int = 0,
        fuzz_cases: int = 0,
        violations: int = 0,
    ) -> None:
        with self._lock:
            row = self.rows.setdefault(area, dict.fromkeys(COLUMNS, 0))
            row["operations"] += operations
            row["faults"] += faults
            row["races"] += races
            row["fuzz_cases"] += fuzz_cases
            row["violations"] += violations

    def check(self, area: str, condition: object, message: str) -> None:
        """Assert an invariant, counting a violation when it does not hold."""
        if not condition:
            self.add(area, violations=1)
            raise AssertionError(f"[{area}] violation: {message}")

    def failed(self, area: str, why: str) -> None:
        """Count a violation that did not go through :meth:`check` (a failed test phase)."""
        self.add(area, violations=1)
        with self._lock:
            self.failures.append(f"[{area}] {why}")

    def reached(self, area: str, operation: str, *, storage: bool) -> None:
        """Record one fuzz case of ``operation`` and whether it got as far as a storage request."""
        with self._lock:
            counts = self.reach.setdefault((area, operation), [0, 0])
            counts[0] += int(storage)
            counts[1] += 1

    def total(self, column: str) -> int:
        with self._lock:
            return sum(row[column] for row in self.rows.values())

    def render(self) -> list[str]:
        with self._lock:
            rows = sorted(self.rows.items())
            reach = sorted(self.reach.items())
        width = max([len("total"), *(len(a) for a, _ in rows)])
        head = f"{'area':<{width}}  " + "  ".join(f"{HEADERS[c]:>16}" for c in COLUMNS)
        lines = [head, "-" * len(head)]
        for area, row in rows:
            lines.append(f"{area:<{width}}  " + "  ".join(f"{row[c]:>16}" for c in COLUMNS))
        lines.append("-" * len(head))
        totals = {c: sum(r[c] for _, r in rows) for c in COLUMNS}
        lines.append(f"{'total':<{width}}  " + "  ".join(f"{totals[c]:>16}" for c in COLUMNS))
        if reach:
            lines.append("")
            lines.append("fuzz cases that reached storage (reached / total):")
            for (area, operation), (hit, total) in reach:
                lines.append(f"  {area}: {operation:<24} {hit:>6} / {total:<6} ({hit / total:.0%})")
        return lines

    def snapshot(self) -> dict[str, Any]:
        """The table as data (written to the reliability results file)."""
        with self._lock:
            rows = {area: dict(row) for area, row in sorted(self.rows.items())}
            reach = [
                {"area": area, "operation": operation, "reached": hit, "total": total}
                for (area, operation), (hit, total) in sorted(self.reach.items())
            ]
            failures = list(self.failures)
        totals = {c: sum(r[c] for r in rows.values()) for c in COLUMNS}
        return {"areas": rows, "totals": totals, "reach": reach, "failures": failures}


TALLY = Tally()
