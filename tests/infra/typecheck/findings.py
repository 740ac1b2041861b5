"""Where a value sits in a file (for the messages) and what the type check found there: an error, or a check
it skipped and why."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tests.infra.report import Finding, Report
from tests.infra.typecheck.static_types import SType
from tests.infra.units import Unit


def suggestion(name: str, candidates: list[str]) -> str:
    """`` (did you mean X?)`` for the closest candidate (case differences first), else ``''``."""
    for c in candidates:
        if c.lower() == name.lower():
            return f" (did you mean {c}? property names are case-sensitive here)"
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


@dataclass(frozen=True)
class Ctx:
    """Where a value sits (for messages) and which loop variables are in scope."""

    unit: Unit
    line: int
    subject: str
    path: str = ""
    loop_vars: Mapping[str, SType] = field(default_factory=dict)
    closed: frozenset[str] | None = None  # a closed set a member's description states

    def at(self, key: str | int) -> Ctx:
        step = f"[{key}]" if isinstance(key, int) else (f".{key}" if self.path else key)
        return replace(self, path=self.path + step, closed=None)


class Findings:
    """The report of one type check, which every part of it adds to."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def error(self, ctx: Ctx, message: str) -> None:
        self.report.errors.append(Finding(ctx.unit.rel, ctx.line, ctx.subject, ctx.path, _one_line(message)))

    def skip(self, ctx: Ctx, message: str) -> None:
        self.report.skipped.append(Finding(ctx.unit.rel, ctx.line, ctx.subject, ctx.path, _one_line(message)))


def _one_line(message: str) -> str:
    """A message with the whitespace of multi-line source text collapsed."""
    return " ".join(message.split())
