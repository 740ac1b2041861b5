"""Many hands on two OS processes against Azurite: identical settlements and identical
operator retries racing from two processes, each projecting what it sends (the loopback transport).

Every answer is 202 with one ``controlMessageId`` per hand-off, no claim is ``superseded``, one audit.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from handoff import service
from tests.conftest import Caller
from tests.support.children import run_children
from tests.support.handoff_flows import Flow, coordinates, event_of, parked


def test_identical_settlements_from_two_processes_all_get_202_and_one_message(call: Caller, resolve):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    flows = [Flow(endpoint=endpoint, event_id=str(uuid.uuid4())) for _ in range(8)]
    for flow in flows:
        parked(resolve, flow)
    requests = [
        {
            "function": "handoff_complete",
            "body": {
                "endpointId": endpoint,
                "coordinates": coordinates(flow),
                "result": {"ok": True},
                "settledBy": "erp",
            },
        }
        for flow in flows
    ]
    start_at = time.time() + 5.0
    done = run_children(
        [{"transport": "loopback", "requests": requests, "start_at": start_at} for _ in range(2)]
    )
    for i, flow in enumerate(flows):
        answers = [done[0][i], done[1][i]]
        assert [a["status"] for a in answers] == [202, 202], answers
        assert len({a["json"]["controlMessageId"] for a in answers}) == 1
        claim = service.store().get_claim(endpoint, flow.event_id, "park-1")
        assert claim is not None and claim.state.name in ("sent", "delivered"), claim
        row = event_of(call, flow)
        assert [a["auditType"] for a in row["audits"]] == ["CompleteHandoff"]
        assert [h["messageType"] for h in row["history"]].count("HandoffCompletedRequest") == 1


def test_an_operator_retry_from_another_process_is_answered_from_the_claim(call: Caller, resolve):
    from handoff.messages.contract import MessageType

    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    flows = [Flow(endpoint=endpoint, event_id=str(uuid.uuid4())) for _ in range(6)]
    for flow in flows:
        resolve(flow.request())
        resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="ERP down"))
    requests = [
        {
            "function": "event_resubmit",
            "route_params": {"endpointId": endpoint, "eventId": flow.event_id},
            "body": {"by": "alice", "messageId": "err-1"},
        }
        for flow in flows
    ]
    start_at = time.time() + 5.0
    done = run_children(
        [{"transport": "loopback", "requests": requests, "start_at": start_at} for _ in range(2)]
    )
    for i, flow in enumerate(flows):
        answers = [done[0][i], done[1][i]]
        assert [a["status"] for a in answers] == [202, 202], answers
        assert len({a["json"]["controlMessageId"] for a in answers}) == 1
        row = event_of(call, flow)
        assert [a["auditType"] for a in row["audits"]] == ["Resubmit"]
        assert [h["messageType"] for h in row["history"]].count("ResubmissionRequest") == 1


def test_agents_on_two_processes_lease_each_parked_hand_off_once(call: Caller, resolve):
    from tests.support.handoff_flows import park

    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    base = datetime.now(UTC) - timedelta(hours=1)
    parked_ids = {
        park(resolve, endpoint, f"ev-{i:02d}", at=base + timedelta(seconds=i)).event_id for i in range(12)
    }
    requests = [
        {
            "function": "handoff_receive",
            "route_params": {"endpointId": endpoint},
            "headers": {"x-agent-id": "agent"},
            "body": None,
        }
        for _ in range(8)
    ]
    start_at = time.time() + 5.0
    done = run_children(
        [{"transport": "loopback", "requests": requests, "start_at": start_at} for _ in range(2)]
    )
    received = [
        a["json"]["coordinates"]["eventId"] for answers in done for a in answers if a["status"] == 200
    ]
    assert sorted(received) == sorted(parked_ids)  # 16 receives, 12 hand-offs: each leased exactly once
    assert sum(1 for answers in done for a in answers if a["status"] == 204) == 4
