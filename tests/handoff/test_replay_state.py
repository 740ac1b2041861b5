"""One request, one answer state, when the send was delivered and then raised.

The broker kept the control message and the resolver projected it (as the loopback does, at once), but the
sender saw an error: its claim stays ``sending``. Identical requests then race, half on this instance (the
app's HTTP functions), half on a second one (its own settlement service on the same tables). Each replay
follows the claim up and moves it to ``delivered``; all but one of those identical moves lose their
``If-Match``. Every replay must answer the claim as storage holds it (``delivered``), never the
``sending`` it read before its move lost; and exactly one control message reaches the endpoint.

Real threads released together by a barrier, against Azurite. The operator's actions go through the same
claim: ``tests/operator/test_replay_state.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from handoff.messages.contract import Coordinates, MessageType
from handoff.settlement.settler import Settlement, SettlementService
from tests.support.handoff_flows import Flow, complete, fail, parked

from .broker import Broker
from .replays import RESULT, Answer, at_once, check_replays_answer_storage, over_two_instances


def settlement_pair(
    call: Any, flow: Flow, other: SettlementService, kind: str
) -> tuple[Callable[[], Answer], Callable[[], Answer]]:
    """The identical settlement on this instance (HTTP) and on the other (its service, directly)."""
    body: dict[str, Any] = {"settledBy": "erp-agent"}
    if kind == "complete":
        body["result"] = RESULT
    settlement = Settlement(
        kind=MessageType.HandoffCompletedRequest if kind == "complete" else MessageType.HandoffFailedRequest,
        endpoint_id=flow.endpoint,
        coordinates=Coordinates(event_id=flow.event_id, message_id="park-1"),
        settled_by="erp-agent",
        result=RESULT if kind == "complete" else None,
        error_text=None if kind == "complete" else "DMF import rejected 3 rows",
    )
    http = complete if kind == "complete" else fail
    return (lambda: Answer.of_http(http(call, flow, **body))), (lambda: Answer.of(other.settle(settlement)))


@pytest.mark.parametrize("kind", ["complete", "fail"])
def test_retries_of_a_settlement_delivered_then_raised_all_answer_the_stored_state(
    call, resolve, flow, delivered_then_raised: Broker, other_instance, kind
):
    # Given a settlement whose send reached the broker (and was projected), then raised
    parked(resolve, flow)
    here, there = settlement_pair(call, flow, other_instance, kind)
    first = here()
    assert (first.state, first.confirmed, first.replayed) == ("sending", False, False)
    # When ten identical retries arrive at once, over two instances
    answers = at_once(over_two_instances(here, there))
    # Then every one answers the claim as storage holds it: delivered; one message reached the endpoint
    assert all(a.replayed for a in answers)
    check_replays_answer_storage(answers, delivered_then_raised, flow.endpoint, flow.event_id, "park-1")


@pytest.mark.parametrize("kind", ["complete", "fail"])
def test_identical_settlements_at_once_whose_send_delivered_then_raised_answer_the_stored_state(
    call, resolve, flow, delivered_then_raised: Broker, other_instance, kind
):
    # Given a parked hand-off, and a first send that reaches the broker (projected) and then raises
    parked(resolve, flow)
    here, there = settlement_pair(call, flow, other_instance, kind)
    # When ten identical settlements arrive at once, over two instances
    answers = at_once(over_two_instances(here, there))
    # Then every replay answers the stored state; one message reached the endpoint
    check_replays_answer_storage(answers, delivered_then_raised, flow.endpoint, flow.event_id, "park-1")
