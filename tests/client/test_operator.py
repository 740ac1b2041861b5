"""``client.operator`` (and the async one) against the development host: the operator's calls the
``settle`` command is built on, and which of them a lost answer may be retried for."""

from __future__ import annotations

import asyncio

import pytest
from settle_client import AsyncSettleClient, SettleClient, TransportFailure

from tests.client.conftest import FAST_RETRY, LoseAnswers, park, some
from tests.support.children import HostProcess


def test_an_action_addressed_to_the_message_read_is_retried_after_a_lost_answer(host: HostProcess) -> None:
    # Given a parked hand-off, and a connection that loses the answer of the first complete Settle applied
    event_id = park(host, "OpsRetry")
    lose = LoseAnswers("/complete")
    with SettleClient(host.base_url, retry=FAST_RETRY, transport=lose, handle_sigterm=False) as client:
        event = some(client.operator.event("OpsRetry", event_id))
        # When the operator completes it, addressed to the message they read
        done = client.operator.act(
            "complete", "OpsRetry", event_id, message_id=event.last_message_id, by="ops", result={"ok": 1}
        )
    # Then the retry is answered from the first one's claim: one control message, not two
    assert len(lose.sent) == 2 and done.replayed and done.addressed_message_id == event.last_message_id


def test_an_action_to_whatever_is_current_is_not_retried_after_a_lost_answer(host: HostProcess) -> None:
    # Given the same, but the action names no message: a retry would address whatever is current by then
    event_id = park(host, "OpsNoRetry")
    lose = LoseAnswers("/complete")
    with SettleClient(host.base_url, retry=FAST_RETRY, transport=lose, handle_sigterm=False) as client:
        with pytest.raises(TransportFailure) as lost:
            client.operator.act("complete", "OpsNoRetry", event_id, by="ops")
        assert lost.value.maybe_applied
        # Then it was sent once, and the event shows it applied
        assert len(lose.sent) == 1
        assert some(client.operator.event("OpsNoRetry", event_id)).resolution_status == "Pending"


def test_the_async_operator_reads_finds_and_acts(host: HostProcess) -> None:
    event_id = park(host, "OpsAsync")

    async def scenario() -> None:
        async with AsyncSettleClient(host.base_url, retry=FAST_RETRY) as client:
            event = some(await client.operator.event("OpsAsync", event_id))
            assert "complete" in event.actions
            [found] = [f async for f in client.operator.find(event_id)]  # every page
            assert (found.endpoint_id, found.matched_by) == ("OpsAsync", "eventId")
            done = await client.operator.act(
                "fail",
                "OpsAsync",
                event_id,
                message_id=event.last_message_id,
                error_text="rejected",
                by="ops",
            )
            assert done.message_type == "HandoffFailedRequest"
            assert await client.operator.event("OpsAsync", "evt-never") is None

    asyncio.run(scenario())
