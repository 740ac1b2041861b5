"""The resolver under duplicates, reorderings and storage faults, against an independent model.

Messages are delivered through the ``resolver`` function exactly as the host would (a raised exception
means the host delivers the message again, with a higher delivery count). After every delivery the
event row, its history and its audit comments are compared with :mod:`tests.reliability.nimbus_model`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import runtime
from handoff import service
from handoff.storage import keys
from tests.conftest import Caller
from tests.reliability.faults import WHENS, FaultPolicy, is_throttle_refusal, throttle_scale
from tests.reliability.nimbus_model import (
    FLOWS,
    SETTLED,
    TERMINAL,
    EventModel,
    Msg,
    chain,
    service_bus_message,
)
from tests.reliability.tally import TALLY, sized

pytestmark = pytest.mark.slow

AREA = "resolver"


@dataclass
class Harness:
    """One endpoint + event, the resolver function, and the model it must agree with."""

    resolver: Callable[[Any], None]
    call: Caller
    endpoint: str
    event_id: str
    model: EventModel

    @classmethod
    def new(cls, functions: dict[str, Any], call: Caller) -> Harness:
        service.resolver_service().sleep = lambda _s: None  # the host's redelivery stands in for the wait
        return cls(
            functions["resolver"].get_user_function(),
            call,
            "Billing-" + uuid.uuid4().hex[:10],
            str(uuid.uuid4()),
            EventModel(),
        )

    def deliver(self, msg: Msg, where: str) -> int:
        """Deliver until the function returns (the host redelivers on an exception); the attempts."""
        for delivery in range(1, 12 if throttle_scale() is not None else 6):
            sb = service_bus_message(
                msg, endpoint=self.endpoint, event_id=self.event_id, delivery_count=delivery
            )
            try:
                self.resolver(sb)
            except Exception as exc:
                planned = "injected fault" in repr(exc.__cause__ or exc) or is_throttle_refusal(exc)
                TALLY.check(AREA, planned, f"{where}: raised {exc!r}")
                continue
            self.model.deliver(msg)
            return delivery
        raise AssertionError(f"{where}: {msg.kind} {msg.message_id} never completed")

    def view(self) -> dict[str, Any] | None:
        result = self.call(
            "event_get", method="GET", route_params={"endpointId": self.endpoint, "eventId": self.event_id}
        )
        if result.status == 404:
            return None
        assert result.status == 200, result.body
        data: dict[str, Any] = result.json
        return data

    def check(self, where: str, previous: str | None = None) -> str:
        """The stored event agrees with the model; a settled row stayed settled. Returns the status."""
        view, row = self.view(), self.model.row
        TALLY.check(
            AREA, (view is None) == (row is None), f"{where}: row exists {view is not None}, model {row}"
        )
        if view is None or row is None:
            return "None"
        got = (view["resolutionStatus"], view["messageType"], view["lastMessageId"], view["pendingSubStatus"])
        want = (row.status, row.message_type, row.last_message_id, row.sub_status)
        TALLY.check(AREA, got == want, f"{where}: row {got}, reference rules give {want}")
        history = [h["messageId"] for h in view["history"]]
        TALLY.check(
            AREA,
            sorted(history) == sorted(self.model.history),
            f"{where}: history {history}, expected one row per message {self.model.history}",
        )
        comments = [a for a in view["audits"] if a["auditType"] == "Comment"]
        TALLY.check(
            AREA,
            len(comments) == self.model.refused,
            f"{where}: {len(comments)} stale comments, {self.model.refused} refusals",
        )
        if previous in SETTLED:
            # Terminal over terminal is last-writer-wins in the reference (a Spec 030 non-goal); back to
            # Pending (or Deferred) never.
            TALLY.check(AREA, got[0] in TERMINAL, f"{where}: settled {previous} moved back to {got[0]}")
        return str(view["resolutionStatus"])

    def check_index(self, where: str) -> None:
        """The agent queue agrees with the row: the event is offered iff it is Pending + Handoff."""
        result = self.call("handoff_next", method="GET", route_params={"endpointId": self.endpoint})
        row = self.model.row
        parked = row is not None and row.status == "Pending" and row.sub_status == "Handoff"
        offered = result.status == 200 and result.json["coordinates"]["eventId"] == self.event_id
        TALLY.check(
            AREA,
            offered == parked and result.status in (200, 204),
            f"{where}: next {result.status}, parked {parked}",
        )


# Hand-computed from nimbus-contract.md §2.2/§2.7 (not from the model): flow, delivery order, final
# status, refusals. Indexes are positions in the flow's causal chain (see nimbus_model.chain).
HAND_COMPUTED = [
    ("complete", [0, 1, 2, 3], "Completed", 0),
    ("complete", [3, 0, 1, 2], "Completed", 3),  # late request/park refused, settlement by ancestor check
    ("complete", [0, 1, 1, 2, 2, 3, 0], "Completed", 0),  # duplicates change nothing
    ("complete", [0, 2, 1, 3], "Completed", 1),  # park behind its own settlement: ancestor check
    ("fail", [0, 1, 2, 3], "Failed", 0),
    ("fail", [0, 3, 1, 2], "Pending", 0),  # Spec 030 known residual: a late park reopens Failed
    ("skip", [0, 1, 2, 3, 1], "Skipped", 0),
    ("defer", [0, 1, 2, 3], "Completed", 0),  # deferred drain republishes a new EventRequest
    ("defer", [0, 2, 1, 3], "Completed", 0),
    ("deadletter", [1, 0], "DeadLettered", 1),  # the late request is the dead-lettered one's parent
]


@pytest.mark.parametrize(("flow", "order", "final", "refused"), HAND_COMPUTED)
def test_hand_computed_sequences_end_where_the_reference_rules_say(
    faulty_tables, functions, call, flow, order, final, refused
):
    # Given one event's messages delivered in this order
    h = Harness.new(functions, call)
    messages = chain(flow)
    status: str | None = None
    for step, index in enumerate(order):
        where = f"{flow} {order} step {step}"
        TALLY.add(AREA, operations=h.deliver(messages[index], where))  # deliveries, redeliveries included
        status = h.check(where, status)
    # Then the row ends in the hand-computed state, and the model agrees with the hand computation
    assert h.model.row is not None
    TALLY.check(
        AREA, (h.model.row.status, h.model.refused) == (final, refused), f"model disagrees: {h.model}"
    )
    TALLY.check(AREA, status == final, f"{flow} {order}: ended {status}, expected {final}")
    h.check_index(f"{flow} {order}")


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[str, list[int]]:
    """A flow and a delivery order: every message at least once, up to three copies, any order."""
    flow = draw(st.sampled_from(FLOWS))
    size = len(chain(flow))
    copies = [index for index in range(size) for _ in range(draw(st.integers(1, 3)))]
    return flow, draw(st.permutations(copies))


@settings(
    max_examples=sized(300, 15),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=deliveries())
def test_duplicated_and_reordered_deliveries_follow_the_reference_rules(faulty_tables, functions, call, case):
    flow, order = case
    TALLY.add(AREA, fuzz_cases=1)
    h = Harness.new(functions, call)
    messages = chain(flow)
    status: str | None = None
    for step, index in enumerate(order):
        where = f"{flow} {order} step {step}"
        TALLY.add(AREA, operations=h.deliver(messages[index], where))  # deliveries, redeliveries included
        status = h.check(where, status)
    h.check_index(f"{flow} {order}")


# (flow, delivered first, target): every message type, applied, refused and duplicate.
FAULT_TARGETS = [
    ("complete", [], 0),  # EventRequest, new event
    ("complete", [0], 1),  # PendingHandoffResponse (parks: index rows, endpoint registration)
    ("complete", [0, 1], 2),  # HandoffCompletedRequest (un-parks)
    ("complete", [0, 1, 2], 3),  # ResolutionResponse
    ("fail", [0, 1], 2),  # HandoffFailedRequest
    ("fail", [0, 1, 2], 3),  # ErrorResponse
    ("skip", [0, 1], 2),  # SkipRequest
    ("skip", [0, 1, 2], 3),  # SkipResponse
    ("defer", [0], 1),  # DeferralResponse
    ("deadletter", [0], 1),  # DeadLetterErrorDescription
    ("complete", [3], 0),  # a stale EventRequest, refused (audit comment + bookkeeping)
    ("complete", [0, 1, 2, 3], 3),  # a duplicate
]


def _fault_case(
    faults: FaultPolicy,
    functions: dict[str, Any],
    call: Caller,
    flow: str,
    prefix: list[int],
    target: int,
    index: int | None,
    when: str,
) -> int:
    h = Harness.new(functions, call)
    messages = chain(flow)
    for i in prefix:
        h.deliver(messages[i], "prefix")
    where = f"{flow} {prefix}+{target} ({messages[target].kind}), request #{index} fails {when}"
    with faults.plan(index, when) as plan:  # type: ignore[arg-type]
        attempts = h.deliver(messages[target], where)
    TALLY.add(AREA, operations=len(prefix) + attempts, faults=len(plan.injected))
    if index is not None:
        TALLY.check(AREA, len(plan.injected) == 1, f"{where}: injected {plan.injected}")
    h.check(where)
    h.check_index(where)
    return len(plan.requests) if index is None else attempts


@pytest.mark.parametrize(("flow", "prefix", "target"), FAULT_TARGETS)
def test_a_fault_on_any_request_of_a_projection_is_redelivered_and_projected_once(
    faulty_tables, functions, call, flow, prefix, target
):
    # Given how many storage requests projecting this message makes (counted once the process has made its
    # first-use reads, such as the recorded layouts, which the cases below do not repeat)
    _fault_case(faulty_tables, functions, call, flow, prefix, target, None, "before")
    requests = _fault_case(faulty_tables, functions, call, flow, prefix, target, None, "before")
    # When each of them fails (before it is sent / after it applied) and the host redelivers
    for index in range(1, requests + 1):
        for when in WHENS:
            _fault_case(faulty_tables, functions, call, flow, prefix, target, index, when)
    # Then (checked in each case) one history row per message, and the row the reference rules give


def test_a_poison_message_is_stored_once_even_when_storage_fails(faulty_tables, functions, call):
    resolver = functions["resolver"].get_user_function()
    service.resolver_service().sleep = lambda _s: None
    enqueued = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def poison(message_id: str, delivery: int) -> Any:
        msg = service_bus_message(
            Msg("EventRequest", message_id),
            endpoint="Billing",
            event_id="e1",
            delivery_count=delivery,
            enqueued=enqueued,
        )
        msg.application_properties["MessageType"] = "NoSuchType"  # never projectable: poison
        return msg

    def stored(message_id: str) -> int:
        pk, rk = keys.poison_keys(enqueued, message_id)
        table = runtime.tables().table(keys.POISON_TABLE)
        return len(
            list(
                table.query_entities("PartitionKey eq @pk and RowKey eq @rk", parameters={"pk": pk, "rk": rk})
            )
        )

    for index in (1,):
        for when in WHENS:
            message_id = f"poison-{uuid.uuid4().hex[:8]}"
            with faulty_tables.plan(index, when) as plan:
                for delivery in range(1, 4):
                    try:
                        resolver(poison(message_id, delivery))
                        break
                    except Exception as exc:
                        TALLY.check(
                            AREA, "injected fault" in repr(exc.__cause__ or exc), f"poison raised {exc!r}"
                        )
            TALLY.add(AREA, operations=delivery, faults=len(plan.injected))
            TALLY.check(AREA, len(plan.injected) == 1, f"poison {when}: {plan.injected}")
            TALLY.check(AREA, stored(message_id) == 1, f"poison {when}: {stored(message_id)} rows")
