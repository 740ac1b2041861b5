"""Shows the infra checks' one-line summary at the end of every pytest run that ran them."""

from __future__ import annotations

from typing import Any

SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SUMMARY:
        terminalreporter.write_sep("-", "infra checks")
        for line in SUMMARY:
            terminalreporter.write_line(line)
