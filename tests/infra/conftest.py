"""The infra checks of the real infra/, run once a session (``infra_check``), and their one-line summary at
the end of every pytest run that ran them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.armtypes import type_data
from tests.infra.bicep import INFRA
from tests.infra.infracheck import InfraCheck, check_infra

SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SUMMARY:
        terminalreporter.write_sep("-", "infra checks")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def infra_check() -> InfraCheck:
    """Every check over the real infra/ (each run parses and checks all of it: shared, read only)."""
    return check_infra(INFRA, type_data())
