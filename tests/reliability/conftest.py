"""Reliability suite: fault-injecting tables, the figures table, and counting failed tests as violations.

Every test here is ``@pytest.mark.slow`` (``make reliability``); ``SETTLE_RELIABILITY_SCALE=small``
bounds it for CI. The table printed at the end is what the tests counted (``tally.TALLY``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from common import runtime
from tests.conftest import new_prefix
from tests.reliability.faults import FAULTS, FaultPolicy
from tests.reliability.tally import TALLY, scale

_AREA_OF_MODULE = {
    "test_state_faults": "state faults",
    "test_state_model": "state model",
    "test_resolver": "resolver",
    "test_settlement_races": "settlement races",
    "test_fuzz_http": "http fuzz",
    "test_fuzz_resolver": "resolver fuzz",
    "test_injection": "injection",
    "test_keys_scale": "key encoding",
    "test_auth_secrets": "auth & secrets",
    "test_checkers": "self-checks",
}
_ran = {"count": 0, "known": 0}
# Whether the SDK's own retry policy stays on for the current fault-injecting test (restarts keep it).
_sdk = {"retries": False}


def _use(connection: str, prefix: str, *, faults: bool) -> None:
    os.environ["SETTLE_TABLES"] = connection
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    os.environ.pop("SETTLE_TABLES__tableServiceUri", None)
    if faults:
        # SDK retries off by default: an injected fault reaches Settle, which must cope as documented.
        runtime.reset(policies=[FAULTS], client_options=None if _sdk["retries"] else {"retry_total": 0})
    else:
        runtime.reset()
        return
    # Create every table now, so request numbers count only the operation's own requests.
    from handoff import keys as handoff_keys
    from state import keys as state_keys

    for name in (
        state_keys.STATE_TABLE,
        state_keys.EXPIRY_TABLE,
        handoff_keys.EVENTS_TABLE,
        handoff_keys.ENDPOINTS_TABLE,
        handoff_keys.POISON_TABLE,
    ):
        runtime.tables().table(name)


@pytest.fixture
def faulty_tables(azurite_connection: str, settle_tables: str) -> Iterator[FaultPolicy]:
    """Empty tables of this test's own, every client carrying the fault policy, SDK retries off."""
    _sdk["retries"] = False
    _use(azurite_connection, new_prefix(), faults=True)
    yield FAULTS
    _use(azurite_connection, settle_tables, faults=False)


@pytest.fixture
def faulty_tables_sdk_retries(azurite_connection: str, settle_tables: str) -> Iterator[FaultPolicy]:
    """Like ``faulty_tables`` but with the SDK's default retry policy on (the production set-up)."""
    _sdk["retries"] = True
    _use(azurite_connection, new_prefix(), faults=True)
    yield FAULTS
    _sdk["retries"] = False
    _use(azurite_connection, settle_tables, faults=False)


@pytest.fixture
def restart(azurite_connection: str) -> Any:
    """Simulate another instance: same tables, but every cached client, service and hint dropped."""

    def again() -> None:
        _use(azurite_connection, os.environ["SETTLE_TABLE_PREFIX"], faults=True)

    return again


@pytest.fixture
def new_tables(azurite_connection: str) -> Any:
    """Switch to yet another empty prefix mid-test (keeping the fault policy)."""

    def switch() -> str:
        prefix = new_prefix()
        _use(azurite_connection, prefix, faults=True)
        return prefix

    return switch


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    here = os.path.dirname(__file__)
    if str(item.path).startswith(here) and report.when == "call":
        _ran["count"] += 1
        if report.skipped and hasattr(report, "wasxfail"):
            _ran["known"] += 1  # a known bug shown by a strict xfail test (see docs/reliability.md)
        if report.failed:
            module = item.path.stem
            area = _AREA_OF_MODULE.get(module, module)
            text = str(report.longrepr)
            if "violation:" not in text:  # Tally.check already counted it
                TALLY.add(area, violations=1)
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _ran["count"]:
        return
    terminalreporter.section(f"Settle reliability (scale: {scale()})")
    for line in TALLY.render():
        terminalreporter.write_line(line)
    violations = TALLY.total("violations")
    terminalreporter.write_line(
        f"violations found: {violations}" + (" (must be 0)" if violations else " - every promise held")
    )
    if _ran["known"]:
        terminalreporter.write_line(
            f"known bugs shown by strict xfail tests: {_ran['known']} (docs/reliability.md, Findings)"
        )
