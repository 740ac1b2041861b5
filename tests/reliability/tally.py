"""The figures ``make reliability`` prints: counted by the tests themselves, per area.

Tests add what they did (``TALLY.add("state faults", operations=3, faults=1)``) and route every
invariant through :meth:`Tally.check`, which counts a violation before failing the test. A test that
fails through a plain ``assert`` is counted as one violation by ``conftest.py``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Literal

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

    def total(self, column: str) -> int:
        with self._lock:
            return sum(row[column] for row in self.rows.values())

    def render(self) -> list[str]:
        with self._lock:
            rows = sorted(self.rows.items())
        width = max([len("total"), *(len(a) for a, _ in rows)])
        head = f"{'area':<{width}}  " + "  ".join(f"{HEADERS[c]:>16}" for c in COLUMNS)
        lines = [head, "-" * len(head)]
        for area, row in rows:
            lines.append(f"{area:<{width}}  " + "  ".join(f"{row[c]:>16}" for c in COLUMNS))
        lines.append("-" * len(head))
        totals = {c: sum(r[c] for _, r in rows) for c in COLUMNS}
        lines.append(f"{'total':<{width}}  " + "  ".join(f"{totals[c]:>16}" for c in COLUMNS))
        return lines


TALLY = Tally()
