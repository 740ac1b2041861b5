"""One request, one answer state for the operator's actions resubmit, skip, complete and
fail go through the settlement claim, so identical actions whose first send was delivered and then raised
must all answer the claim as storage holds it, over two instances (``tests/handoff/replays.py`` has the
race; ``tests/handoff/test_replay_state.py`` the settlements' own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from common.principal import Actor
from handoff.messages.contract import MessageType
from handoff.settlement.settler import SettlementService
from management.actions import OperatorActions
from tests.handoff.broker import Broker
from tests.handoff.replays import RESULT, Answer, at_once, check_replays_answer_storage, over_two_instances
from tests.support.handoff_flows import Flow, parked
from tests.support.operator_calls import act

from .conftest import failed_event

# The message each action addresses (sent as ``messageId``, so that a retry after the action was projected
# still names the same action: without it the row's newer last message would make it another one).
ADDRESSED = {"resubmit": "err-1", "skip": "err-1", "complete": "park-1", "fail": "park-1"}


def action_pair(
    call: Any, flow: Flow, other: SettlementService, action: str
) -> tuple[Callable[[], Answer], Callable[[], Answer]]:
    """The identical operator action on this instance (HTTP) and on the other (its actions, directly)."""
    addressed = ADDRESSED[action]
    body: dict[str, Any] = {"by": "alice", "messageId": addressed}
    if action in ("resubmit", "skip"):
        body["reason"] = "ERP is back"
    if action == "complete":
        body["result"] = RESULT
    if action == "fail":
        body["errorText"] = "DMF import rejected 3 rows"
    actions, actor = OperatorActions(other), Actor(by="alice", principal=None)

    def there() -> Answer:
        ids = (flow.endpoint, flow.event_id, actor)
        if action == "resubmit":
            done = actions.resubmit(*ids, event_json=None, reason="ERP is back", message_id=addressed)
        elif action == "skip":
            done = actions.skip(*ids, reason="ERP is back", message_id=addressed)
        elif action == "complete":
            done = actions.settle(
                *ids, kind=MessageType.HandoffCompletedRequest, result=RESULT, message_id=addressed
            )
        else:
            done = actions.settle(
                *ids,
                kind=MessageType.HandoffFailedRequest,
                error_text="DMF import rejected 3 rows",
                message_id=addressed,
            )
        return Answer.of(done.accepted)

    return (lambda: Answer.of_http(act(call, flow, action, body))), there


def given(resolve: Any, flow: Flow, action: str) -> None:
    if action in ("resubmit", "skip"):
        failed_event(resolve, flow)
    else:
        parked(resolve, flow)


ACTIONS = ["resubmit", "skip", "complete", "fail"]


@pytest.mark.parametrize("action", ACTIONS)
def test_retries_of_an_action_delivered_then_raised_all_answer_the_stored_state(
    call, resolve, flow, delivered_then_raised: Broker, other_instance, action
):
    # Given an operator action whose send reached the broker (and was projected), then raised
    given(resolve, flow, action)
    here, there = action_pair(call, flow, other_instance, action)
    first = here()
    assert (first.state, first.confirmed, first.replayed) == ("sending", False, False)
    # When ten identical retries arrive at once, over two instances
    answers = at_once(over_two_instances(here, there))
    # Then every one answers the claim as storage holds it (delivered); one message reached the endpoint
    assert all(a.replayed for a in answers)
    check_replays_answer_storage(
        answers, delivered_then_raised, flow.endpoint, flow.event_id, ADDRESSED[action]
    )


@pytest.mark.parametrize("action", ACTIONS)
def test_identical_actions_at_once_whose_send_delivered_then_raised_answer_the_stored_state(
    call, resolve, flow, delivered_then_raised: Broker, other_instance, action
):
    # Given an event the action applies to, and a first send that reaches the broker and then raises
    given(resolve, flow, action)
    here, there = action_pair(call, flow, other_instance, action)
    # When ten identical actions arrive at once, over two instances
    answers = at_once(over_two_instances(here, there))
    # Then every replay answers the stored state; one message reached the endpoint
    check_replays_answer_storage(
        answers, delivered_then_raised, flow.endpoint, flow.event_id, ADDRESSED[action]
    )
