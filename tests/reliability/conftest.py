"""Reliability suite: fault-injecting tables, the figures table, and counting failed tests as violations.

Every test here is ``@pytest.mark.slow`` (``make reliability``); ``SETTLE_RELIABILITY_SCALE=small``
bounds it for CI. The table printed at the end is what the tests counted (``tally.TALLY``).

``SETTLE_RELIABILITY_THROTTLE=1`` (``make reliability-throttled``) runs the whole suite under a storage
budget: every Table request of the session (the app's clients, the suite's own reads, the child
processes it starts) reaches Azurite through ``bench/throttle.py``'s budget, Azure's targets divided by
:data:`THROTTLE_SCALE` (another number: that factor), and beyond it is answered as Azure throttles (503
``ServerBusy`` / 500 ``OperationTimedOut``). Each test keeps its own retry set-up, so refusals reach Settle
where the SDK's retries are off. The run reports what the budget refused, per test.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench import machine
from bench.proxy import CountingProxy
from bench.throttle import Budget
from common import runtime
from tests.conftest import Caller, HttpResult, new_prefix
from tests.reliability.faults import FAULTS, FaultPolicy, throttle_scale
from tests.reliability.tally import TALLY, scale

ROOT = Path(__file__).resolve().parents[2]
_AREA_OF_MODULE = {
    "test_state_faults": "state faults",
    "test_state_throttled": "state throttled",
    "test_state_model": "state model",
    "test_resolver": "resolver",
    "test_settlement_races": "settlement races",
    "test_fuzz_http": "http fuzz",
    "test_fuzz_resolver": "resolver fuzz",
    "test_injection": "injection",
    "test_keys_scale": "key encoding",
    "test_auth_secrets": "auth & secrets",
    "test_checkers": "self-checks",
    "test_crash_host": "crash",
    "test_catchup_processes": "catch-up processes",
}
_run: dict[str, Any] = {"selected": 0, "known": 0, "started": time.time()}
_outcomes: dict[str, str] = {}  # test id -> passed | failed | error | skipped
# Whether the SDK's own retry policy stays on for the current fault-injecting test (restarts keep it).
_sdk = {"retries": False}


_throttle: dict[str, Any] = {"budget": None, "per_test": {}, "answered_503": 0}


def _table_endpoint(connection: str) -> str:
    value = next(p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint"))
    return value.rsplit("/", 1)[0]


@pytest.fixture(scope="session")
def azurite_connection(azurite_connection: str) -> Iterator[str]:
    """The session's Azurite, behind the storage budget when ``SETTLE_RELIABILITY_THROTTLE`` asks for it."""
    factor = throttle_scale()
    if factor is None:
        yield azurite_connection
        return
    budget = Budget.scaled(factor)
    _throttle["budget"] = budget
    with CountingProxy(_table_endpoint(azurite_connection), budget=budget) as proxy:
        yield proxy.connection_string(azurite_connection)


class _DocumentedClient(Caller):
    """The documented client under backpressure: a 503 problem (storage busy) is sent again after its
    ``Retry-After`` (capped at 2 s), up to 10 times; what it finally answers is what the test sees."""

    def __call__(self, name: str, body: Any = None, **kwargs: Any) -> HttpResult:
        for _ in range(10):
            result = super().__call__(name, body, **kwargs)
            if result.status != 503 or "unavailable" not in result.body.decode("utf-8", "replace"):
                return result
            _throttle["answered_503"] += 1
            time.sleep(min(2.0, float(result.headers.get("retry-after") or 1)))
        return result


@pytest.fixture
def call(functions: dict[str, Any]) -> Caller:
    """Under the storage budget, the HTTP caller retries Settle's 503 as the documented client does."""
    return _DocumentedClient(functions) if throttle_scale() is not None else Caller(functions)


@pytest.fixture(autouse=True)
def _throttled_per_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """What the budget refused during each test (a test it never refused did not prove much)."""
    budget: Budget | None = _throttle["budget"]
    before = budget.refusals() if budget is not None else 0
    yield
    if budget is not None:
        _throttle["per_test"][request.node.nodeid] = budget.refusals() - before


def _throttle_report() -> dict[str, Any] | None:
    budget: Budget | None = _throttle["budget"]
    if budget is None:
        return None
    refused = budget.refusals()
    # Every ``timeout_every``-th refusal is answered 500 OperationTimedOut, the others 503 ServerBusy.
    timed_out = refused // budget.timeout_every if budget.timeout_every else 0
    per_test: dict[str, int] = _throttle["per_test"]
    return {
        "scale": throttle_scale(),
        "partition_entities_per_s": budget.partition_per_s,
        "account_entities_per_s": budget.account_per_s,
        "requests": budget.requests,
        "refused": refused,
        "answered_503_server_busy": refused - timed_out,
        "answered_500_operation_timed_out": timed_out,
        "refused_by_scope": dict(budget.refused),
        "settle_answered_503_and_the_client_retried": _throttle["answered_503"],
        "tests_refused": sum(1 for n in per_test.values() if n),
        "tests_never_refused": sorted(t for t, n in per_test.items() if not n),
        "refused_per_test": dict(sorted(per_test.items())),
    }


def _use(connection: str, prefix: str, *, faults: bool) -> None:
    os.environ["SETTLE_TABLES"] = connection
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    os.environ.pop("SETTLE_TABLES__tableServiceUri", None)
    if faults:
        # SDK retries off by default: an injected fault reaches Settle, which must cope as documented.
        # Under the storage budget the SDK retries as in production (Settle's own writes still opt out),
        # so a refusal reaches Settle exactly where it does in Azure; planned faults then meet SDK retries.
        retries = _sdk["retries"] or throttle_scale() is not None
        runtime.reset(policies=[FAULTS], client_options=None if retries else {"retry_total": 0})
    else:
        runtime.reset()
        return
    # Create every table now, so request numbers count only the operation's own requests.
    from handoff.storage import keys as handoff_keys
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


def _area(item: pytest.Item) -> str:
    module = item.path.stem
    return _AREA_OF_MODULE.get(module, module)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The table belongs to runs that selected the reliability suite (``-m slow``), not to ``make test``
    # (nor to ``--collect-only``, which runs nothing).
    if session.config.option.collectonly:
        return
    _run["selected"] = sum(1 for item in session.items if item.get_closest_marker("slow"))
    _run["started"] = time.time()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        TALLY.failed("collection", f"{report.nodeid or 'session'} could not be collected")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.skipped and hasattr(report, "wasxfail"):
        _run["known"] += 1  # a known bug shown by a strict xfail test (see docs/reliability.md)
    if report.failed:
        # Every failing phase is a broken promise or a suite that could not check it: a fixture that
        # cannot reach Azurite (setup), a plain assert (call), cleanup that raised (teardown).
        _outcomes[item.nodeid] = "failed" if report.when == "call" else "error"
        if "] violation: " not in str(report.longrepr):  # Tally.check counted it already
            TALLY.failed(_area(item), f"{item.nodeid} failed in {report.when}")
    elif report.when == "call":
        _outcomes.setdefault(item.nodeid, "skipped" if report.skipped else "passed")
    elif report.skipped:
        _outcomes.setdefault(item.nodeid, "skipped")
    return report


def results_path() -> Path:
    """Where the table is written: ``SETTLE_RELIABILITY_OUT``, else ``bench/reliability-<scale>.json``
    (``-throttled`` added under the storage budget)."""
    given = os.environ.get("SETTLE_RELIABILITY_OUT")
    throttled = "-throttled" if throttle_scale() is not None else ""
    return Path(given) if given else ROOT / "bench" / f"reliability-{scale()}{throttled}.json"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _run["selected"]:
        return
    # The exit status and the table must tell the same story, in both directions.
    if TALLY.total("violations") and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif not TALLY.total("violations") and session.exitstatus != pytest.ExitCode.OK:
        TALLY.failed("session", f"pytest ended with exit status {int(session.exitstatus)}")
    outcomes = Counter(_outcomes.values())
    document = {
        "kind": "reliability",
        "scale": scale(),
        "started_at": datetime.fromtimestamp(_run["started"], UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - _run["started"], 1),
        "command": " ".join(["python -m pytest", *(str(a) for a in session.config.invocation_params.args)]),
        "exit_status": int(session.exitstatus),
        "tests": {k: outcomes.get(k, 0) for k in ("passed", "failed", "error", "skipped")},
        "known_bugs": _run["known"],
        "machine": machine.describe(),
        **TALLY.snapshot(),
    }
    throttle = _throttle_report()
    if throttle is not None:
        document["throttle"] = throttle
    path = results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    _run["written"] = str(path)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _run["selected"]:
        return
    terminalreporter.section(f"Settle reliability (scale: {scale()})")
    for line in TALLY.render():
        terminalreporter.write_line(line)
    violations = TALLY.total("violations")
    for failure in TALLY.snapshot()["failures"]:
        terminalreporter.write_line(f"counted: {failure}")
    terminalreporter.write_line(
        f"violations found: {violations}" + (" (must be 0)" if violations else " - every promise held")
    )
    if _run["known"]:
        terminalreporter.write_line(
            f"known bugs shown by strict xfail tests: {_run['known']} (docs/reliability.md, Findings)"
        )
    throttle = _throttle_report()
    if throttle is not None:
        t = throttle
        terminalreporter.write_line(
            f"storage budget (Azure ÷ {t['scale']:g}: {t['partition_entities_per_s']:g} entities/s per"
            f" partition, {t['account_entities_per_s']:g} per account): {t['requests']} requests, refused"
            f" {t['refused']} ({t['answered_503_server_busy']} answered 503 ServerBusy,"
            f" {t['answered_500_operation_timed_out']} answered 500 OperationTimedOut);"
            f" {t['tests_refused']} tests refused at least once, {len(t['tests_never_refused'])} never;"
            f" Settle answered 503 + Retry-After {t['settle_answered_503_and_the_client_retried']} times"
        )
        for test in throttle["tests_never_refused"]:
            terminalreporter.write_line(f"  never refused: {test}")
    if _run.get("written"):
        terminalreporter.write_line(f"table written to {_run['written']}")
