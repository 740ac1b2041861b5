"""The suite's own instruments can fail: each checker is shown a planted violation and must count it.

Without these, a checker that never fires would make every figure of the table meaningless. Each plant
goes through the very function the suite uses (with a probe ``Tally``, so the run's own table stays
clean) and must be counted exactly once: the fault policy, the race checker (two holders, none, the
wrong lock), the lost-or-doubled checkers (a history row deleted, a stray history row, a change recorded
twice), the injection checkers, the 5xx/problem checker and the resolver's no-crash checker, and the
tally itself (a dead dependency, a failed teardown, a violation counted off the test's thread: the exit
status must agree with the table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from common import runtime
from devtools.azurite import connection_string_for, free_port
from state.keys import HISTORY_MARK, MAX_VERSION, STATE_TABLE
from tests.conftest import Caller, HttpResult
from tests.reliability.nimbus_model import EventModel, Msg, chain, service_bus_message
from tests.reliability.records import (
    check_head_and_history,
    check_one_holder,
    check_recorded_once,
    new_key,
    read_rows,
)
from tests.reliability.tally import TALLY, Tally
from tests.reliability.test_fuzz_http import check_answer
from tests.reliability.test_fuzz_resolver import deliver_hostile
from tests.reliability.test_injection import MINE, THEIRS, key, only_mine, only_this_key

pytestmark = pytest.mark.slow

AREA = "self-checks"
ROOT = Path(__file__).resolve().parents[2]


def fires(plant: Any, *, message: str) -> None:
    """``plant(probe)`` must raise the checker's violation and count exactly one on the probe."""
    probe = Tally()
    with pytest.raises(AssertionError, match=message):
        plant(probe)
    TALLY.check(AREA, probe.total("violations") == 1, f"{message!r}: counted {probe.total('violations')}")


# ------------------------------------------------------------------------------------- fault policy


def test_the_fault_policy_fails_exactly_the_request_it_is_told_to(faulty_tables, call):
    key_ = new_key()
    lock = call("state_lock", {"key": key_}).json
    body = {"key": key_, "status": "Processed", "lockToken": lock["lockToken"]}
    # Given request 1 of a fenced set failing after it applied
    with faulty_tables.plan(1, "after") as plan:
        first = call("state_set", body)
    TALLY.add(AREA, operations=2, faults=len(plan.injected))
    # Then the fault hit that request, and the caller still learned the outcome storage holds: the lost
    # answer is settled by one read-back of the head, so the ambiguous case is a 200, not a 503
    TALLY.check(
        AREA, first.status == 200 and plan.injected == [f"after #1 {plan.requests[0]}"], f"{first.status}"
    )
    TALLY.check(AREA, read_rows(key_).statuses == ["Processing", "Processed"], "the write did not apply")
    # And a request failing before it is sent reached nothing: the read-back finds no head, so the lock
    # is sent once more and storage holds exactly one version of it
    other = new_key()
    with faulty_tables.plan(1, "before") as plan:
        retried = call("state_lock", {"key": other})
    TALLY.add(AREA, operations=1, faults=len(plan.injected))
    TALLY.check(
        AREA,
        len(plan.injected) == 1 and retried.status == 200 and read_rows(other).statuses == ["Processing"],
        f"a before-fault: {retried.status}, {read_rows(other).statuses}",
    )


# -------------------------------------------------------------------------------------- race checker


def test_the_race_checker_sees_two_holders_none_and_the_wrong_lock(faulty_tables, call):
    # Given a real lock on a key (its answer and head), a refusal of it, and another key's lock
    k = new_key()
    holder = call("state_lock", {"key": k, "lockSeconds": 600}).json
    refused = call("state_lock", {"key": k}).json
    elsewhere = call("state_lock", {"key": new_key()}).json
    head = read_rows(k).head
    TALLY.add(AREA, operations=3)
    assert holder["acquired"] and not refused["acquired"] and elsewhere["acquired"]
    check_one_holder(AREA, [holder, refused], 2, head, "intact")  # the real outcome passes
    # When the checker is shown two holders, no holder, a holder of another lock, a caller without an
    # answer, or a head that is not locked: each is one violation
    fires(lambda t: check_one_holder(AREA, [holder, holder], 2, head, "p", tally=t), message="2 callers hold")
    fires(
        lambda t: check_one_holder(AREA, [refused, refused], 2, head, "p", tally=t), message="0 callers hold"
    )
    fires(
        lambda t: check_one_holder(AREA, [elsewhere, refused], 2, head, "p", tally=t), message="another lock"
    )
    fires(lambda t: check_one_holder(AREA, [holder], 2, head, "p", tally=t), message="1 of 2 callers")
    released = dict(head or {}, Status=3)
    fires(
        lambda t: check_one_holder(AREA, [holder, refused], 2, released, "p", tally=t),
        message="not Processing",
    )


# ---------------------------------------------------------------------------- lost or doubled checkers


def _record_with_history(call: Caller) -> dict[str, Any]:
    k = new_key()
    lock = call("state_lock", {"key": k}).json
    call("state_set", {"key": k, "status": "Processed", "lockToken": lock["lockToken"]})
    call("state_upsert", {"key": k, "data": {"n": 1}})
    TALLY.add(AREA, operations=3)
    return k


def test_the_history_checker_sees_a_lost_history_row(faulty_tables, call):
    k = _record_with_history(call)
    check_head_and_history(AREA, call, k, "intact")  # given an intact record: v3 with v1, v2 in history
    lost = read_rows(k).history[1]
    runtime.tables().table(STATE_TABLE).delete_entity(lost["PartitionKey"], lost["RowKey"])
    fires(lambda t: check_head_and_history(AREA, call, k, "lost", tally=t), message="history versions")


def test_the_history_checker_sees_a_doubled_history_row(faulty_tables, call):
    k = _record_with_history(call)
    # When a stray copy of history row v1 appears under another version's row key (a row written twice)
    row = dict(read_rows(k).history[1])
    mark = row["RowKey"].rindex(HISTORY_MARK) + len(HISTORY_MARK)
    row["RowKey"] = row["RowKey"][:mark] + str(MAX_VERSION - 7).zfill(len(row["RowKey"]) - mark)
    runtime.tables().table(STATE_TABLE).create_entity(row)
    fires(lambda t: check_head_and_history(AREA, call, k, "doubled", tally=t), message="history versions")


def test_the_sequence_checker_sees_a_change_recorded_twice_or_lost(faulty_tables, call):
    # Given a record whose lock, set and upsert each made one version
    k = _record_with_history(call)
    rows = read_rows(k)
    once = ["Processing", "Processed", "Processed"]
    check_recorded_once(AREA, rows, [once], "intact")
    # When the upsert is recorded a second time (a retry taken for a new change) it is a doubled version
    call("state_upsert", {"key": k, "data": {"n": 1}})
    TALLY.add(AREA, operations=1)
    doubled = read_rows(k)
    fires(lambda t: check_recorded_once(AREA, doubled, [once], "doubled", tally=t), message="statuses")
    # and a change that is missing is a lost one
    fires(lambda t: check_recorded_once(AREA, rows, [[*once, "Failed"]], "lost", tally=t), message="statuses")


# ---------------------------------------------------------------------------------- injection checkers


def test_the_injection_checkers_see_another_tenants_record(faulty_tables, call):
    # Given a record of my tenant and one of theirs
    for tenant in (MINE, THEIRS):
        assert call("state_upsert", {"key": key(tenant), "data": {"tenant": tenant}}).status == 200
    TALLY.add(AREA, operations=2)
    only_mine(call, {"tenantId": MINE}, "intact", tally=Tally())

    # When a query "leaks" (a caller whose filter reaches the other tenant), the checker counts it
    def leaky(name: str, body: Any = None, **kwargs: Any) -> HttpResult:
        result: HttpResult = call(name, {**body, "tenantId": THEIRS}, **kwargs)
        return result

    fires(lambda t: only_mine(leaky, {"tenantId": MINE}, "leak", tally=t), message="read tenants")  # type: ignore[arg-type]
    theirs = call("state_query", {"tenantId": THEIRS}).json["items"]
    fires(lambda t: only_this_key(theirs, "itemEntityKey", "order", "leak", tally=t), message="read")
    # And a query answered with a 5xx is not taken for a refusal
    broken = lambda name, body=None, **kw: HttpResult(500, {}, b"{}")  # noqa: E731
    fires(lambda t: only_mine(broken, {"tenantId": MINE}, "5xx", tally=t), message="5xx: 500")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- 5xx and problem+json


def test_the_answer_checker_sees_a_5xx_from_a_planted_bug_and_a_malformed_problem(
    faulty_tables, call, monkeypatch
):
    # Given a bug planted in the state service (any exception that is not a storage fault)
    from state import service

    def planted(*_: Any, **__: Any) -> Any:
        raise RuntimeError("planted bug")

    monkeypatch.setattr(service, "handler", planted)
    sent = {"key": new_key()}
    result = call("state_get", sent)
    TALLY.add(AREA, operations=1)
    # Then the function answers a 5xx and the checker counts it
    fires(
        lambda t: check_answer("state_get", result.status, result.content_type, result.body, sent, tally=t),
        message="answered 500",
    )
    # And an error that is not problem+json, or a problem without its type, is counted too
    fires(
        lambda t: check_answer("x", 400, "application/json", b'{"status": 400}', {}, tally=t),
        message="400 as application/json",
    )
    untyped = json.dumps({"status": 409, "title": "Conflict"}).encode()
    fires(
        lambda t: check_answer("x", 409, "application/problem+json", untyped, {}, tally=t), message="problem"
    )


def test_the_resolver_crash_checker_sees_a_resolver_that_raises():
    msg = service_bus_message(Msg("EventRequest", "req-1"), endpoint="Billing", event_id="e-1")

    def crashing(_: Any) -> None:
        raise RuntimeError("planted crash")

    fires(lambda t: deliver_hostile(crashing, msg, tally=t), message="resolver raised")


def test_the_resolver_model_refuses_what_spec_030_refuses():
    # Given a completed hand-off (request, park, settlement, resolution)
    model = EventModel()
    req, park, ctl, res = chain("complete")
    for msg in (req, park, ctl, res):
        TALLY.check(AREA, model.deliver(msg) == "applied", f"{msg.kind} not applied")
    # Then a second copy is a duplicate, and a new late park is refused (Completed is settled)
    TALLY.check(AREA, model.deliver(park) == "duplicate", "duplicate not recognised")
    late_park = type(park)("PendingHandoffResponse", "park-late", req.message_id)
    TALLY.check(AREA, model.deliver(late_park) == "refused", "a late park reopened a Completed row")
    assert model.row is not None and model.row.status == "Completed"


# ------------------------------------------------------------------------------------------- the tally

_SESSION = """
import threading

import pytest

from tests.reliability.tally import TALLY

pytestmark = pytest.mark.slow


def test_needs_storage(faulty_tables):  # setup fails: nothing listens where Azurite should be
    pass


def test_passes():
    pass


@pytest.fixture
def cleanup_fails():
    yield
    raise RuntimeError("teardown failed")


def test_with_a_failing_teardown(cleanup_fails):
    pass


def test_counts_a_violation_on_another_thread():  # the test itself passes
    worker = threading.Thread(target=lambda: TALLY.add("race", violations=1))
    worker.start()
    worker.join()
"""


def run_session(tmp_path: Path, source: str, connection: str) -> tuple[int, dict[str, Any], str]:
    """A tiny pytest session with the suite's plugins; returns (exit status, its results file, output)."""
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(source), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: reliability\n", encoding="utf-8")
    out = tmp_path / "results.json"
    env = {
        **os.environ,
        "SETTLE_TEST_AZURITE": connection,
        "SETTLE_RELIABILITY_OUT": str(out),
        "SETTLE_RELIABILITY_SCALE": "small",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "tests.reliability.conftest",
            "-p",
            "no:cacheprovider",
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_tiny.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, results, done.stdout + done.stderr


def test_the_tally_counts_every_failing_phase_and_the_exit_status_agrees(tmp_path):
    # Given a tiny session against a dead Azurite: a setup that cannot reach it, a test that passes, a
    # failing teardown, and a violation counted on a thread that does not fail its test
    dead = connection_string_for({"table": free_port()})
    status, results, output = run_session(tmp_path, _SESSION, dead)
    TALLY.add(AREA, operations=1)
    # Then the table counts three violations, the run fails, and the file says the same as the exit status
    violations = results.get("totals", {}).get("violations")
    TALLY.check(AREA, violations == 3, f"counted {violations} violations:\n{output[-3000:]}")
    TALLY.check(AREA, status != 0 and results.get("exit_status") == status, f"exit {status}: {results}")
    TALLY.check(AREA, "every promise held" not in output, f"a failing run claimed success:\n{output[-2000:]}")
    TALLY.check(
        AREA,
        results.get("tests") == {"passed": 2, "failed": 0, "error": 2, "skipped": 0},
        f"outcomes {results.get('tests')}",
    )


def test_a_clean_tiny_session_passes_with_zero_violations(tmp_path, azurite_connection):
    # The control: the same machinery on a session where every promise holds says so, with exit status 0
    clean = "import pytest\n\npytestmark = pytest.mark.slow\n\n\ndef test_passes(faulty_tables):\n    pass\n"
    status, results, output = run_session(tmp_path, clean, azurite_connection)
    TALLY.add(AREA, operations=1)
    TALLY.check(
        AREA,
        status == 0 and results.get("exit_status") == 0 and results.get("totals", {}).get("violations") == 0,
        f"exit {status}, {results.get('totals')}:\n{output[-2000:]}",
    )
    TALLY.check(AREA, "every promise held" in output, output[-2000:])
