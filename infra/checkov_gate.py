"""Judge a ``checkov -o json`` report of ``infra/`` against the accepted findings in ``checkov-skips.txt``.

checkov exits 0 on a Bicep syntax error (it only counts it in ``summary.parsing_errors``) and non-zero on
any failed check, so its exit code says nothing useful here. This gate fails when:

- the report cannot be read, or checkov evaluated no resource at all (nothing was checked);
- any file failed to parse;
- a check failed that is not accepted (``CHECK_ID RESOURCE REASON`` line, RESOURCE may be ``*``);
- an accepted entry matched no failure (the finding was fixed: drop the entry so the list stays exact).

Standard library only: it runs in checkov's own virtualenv. Usage: ``checkov_gate.py REPORT.json SKIPS``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Skip:
    """One accepted finding: a check id, the resource it applies to (or ``*``) and why."""

    check_id: str
    resource: str
    reason: str

    def matches(self, check_id: str, resource: str) -> bool:
        return self.check_id == check_id and self.resource in ("*", resource)


@dataclass
class Verdict:
    """What the gate found; ``ok`` is the single pass/fail answer."""

    passed: int = 0
    failed: int = 0
    accepted: list[str] = field(default_factory=list)
    unaccepted: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    parsing_errors: list[str] = field(default_factory=list)
    resource_count: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.unaccepted or self.stale or self.parsing_errors or self.problems)


def load_skips(text: str) -> list[Skip]:
    """Parse the skip list; every entry must carry a reason."""
    skips: list[Skip] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=2)
        if len(parts) < 3 or not parts[0].startswith("CKV"):
            raise ValueError(f"line {number}: expected 'CHECK_ID RESOURCE REASON', got {raw!r}")
        skips.append(Skip(check_id=parts[0], resource=parts[1], reason=parts[2]))
    return skips


def evaluate(report: Any, skips: list[Skip]) -> Verdict:
    """Classify every failed check of a checkov JSON report (one framework object or a list of them)."""
    verdict = Verdict()
    runs = report if isinstance(report, list) else [report]
    used: set[Skip] = set()
    for run in runs:
        if not isinstance(run, dict) or "summary" not in run:
            verdict.problems.append(f"unexpected report shape: {str(run)[:200]}")
            continue
        summary = run["summary"]
        verdict.resource_count += int(summary.get("resource_count", 0))
        results = run.get("results", {})
        verdict.parsing_errors.extend(str(p) for p in results.get("parsing_errors", []))
        if summary.get("parsing_errors", 0) and not results.get("parsing_errors"):
            verdict.parsing_errors.append(f"{summary['parsing_errors']} file(s) failed to parse")
        verdict.passed += len(results.get("passed_checks", []))
        for check in results.get("failed_checks", []):
            verdict.failed += 1
            where = check.get("file_path", "?")
            label = f"{check['check_id']} {check['resource']} ({where}): {check['check_name']}"
            skip = next((s for s in skips if s.matches(check["check_id"], check["resource"])), None)
            if skip is None:
                verdict.unaccepted.append(label)
            else:
                used.add(skip)
                verdict.accepted.append(f"{label} -- accepted: {skip.reason}")
    if verdict.resource_count == 0 or verdict.passed == 0:
        verdict.problems.append("checkov evaluated no resource: nothing was checked")
    verdict.stale = [f"{s.check_id} {s.resource}" for s in skips if s not in used]
    return verdict


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: checkov_gate.py REPORT.json SKIPS.txt", file=sys.stderr)
        return 2
    try:
        report = json.loads(Path(argv[1]).read_text() or "null")
    except (OSError, json.JSONDecodeError) as exc:
        print(f"checkov gate: cannot read the report: {exc}", file=sys.stderr)
        return 1
    verdict = evaluate(report, load_skips(Path(argv[2]).read_text()))
    print(
        f"checkov: {verdict.resource_count} resources, {verdict.passed} passed, {verdict.failed} failed "
        f"({len(verdict.accepted)} accepted with a reason, {len(verdict.unaccepted)} not accepted), "
        f"{len(verdict.parsing_errors)} parsing errors"
    )
    for line in verdict.accepted:
        print(f"  accepted  {line}")
    for line in verdict.unaccepted:
        print(f"  FAILED    {line}")
    for line in verdict.stale:
        print(f"  STALE     {line} no longer fails: remove it from the skip list")
    for line in verdict.parsing_errors:
        print(f"  PARSE     {line}")
    for line in verdict.problems:
        print(f"  ERROR     {line}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
