"""The suite's own instruments can fail: the fault policy fires where told, the checkers see damage.

Without these, a checker that never fires would make every figure of the table meaningless.
"""

from __future__ import annotations

import pytest

from common import runtime
from state.keys import STATE_TABLE
from tests.reliability.nimbus_model import EventModel, chain
from tests.reliability.records import check_head_and_history, new_key, read_rows
from tests.reliability.tally import TALLY, Tally

pytestmark = pytest.mark.slow

AREA = "self-checks"


def test_the_fault_policy_fails_exactly_the_request_it_is_told_to(faulty_tables, call):
    key = new_key()
    lock = call("state_lock", {"key": key}).json
    body = {"key": key, "status": "Processed", "lockToken": lock["lockToken"]}
    # Given request 1 of a fenced set failing after it applied
    with faulty_tables.plan(1, "after") as plan:
        first = call("state_set", body)
    TALLY.add(AREA, operations=2, faults=len(plan.injected))
    # Then the caller saw a 503 although storage holds the outcome (the ambiguous case)
    TALLY.check(
        AREA, first.status == 503 and plan.injected == [f"after #1 {plan.requests[0]}"], f"{first.status}"
    )
    TALLY.check(AREA, read_rows(key).statuses == ["Processing", "Processed"], "the write did not apply")
    # And a request failing before it is sent leaves storage untouched
    other = new_key()
    with faulty_tables.plan(1, "before") as plan:
        refused = call("state_lock", {"key": other})
    TALLY.add(AREA, operations=1, faults=len(plan.injected))
    TALLY.check(
        AREA, refused.status == 503 and read_rows(other).head is None, "a before-fault reached storage"
    )


def test_the_history_checker_sees_a_lost_or_doubled_history_row(faulty_tables, call):
    key = new_key()
    lock = call("state_lock", {"key": key}).json
    call("state_set", {"key": key, "status": "Processed", "lockToken": lock["lockToken"]})
    call("state_upsert", {"key": key, "data": {"n": 1}})
    check_head_and_history(AREA, call, key, "intact")  # given an intact record: v3 with v1, v2 in history
    rows = read_rows(key)
    table = runtime.tables().table(STATE_TABLE)
    lost = rows.history[1]
    table.delete_entity(lost["PartitionKey"], lost["RowKey"])  # when a history row is lost
    probe = Tally()
    with pytest.raises(AssertionError, match="history versions"):
        _check_with(probe, call, key)
    TALLY.check(AREA, probe.total("violations") == 1, "the lost row was not counted")


def _check_with(probe: Tally, call, key) -> None:
    check_head_and_history(AREA, call, key, "damaged", tally=probe)


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
