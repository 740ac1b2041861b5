"""The reconciler finishes what a settlement started: confirm, re-send safely, or say it cannot.

It runs on every tick of the ``handoff_sweeper`` timer, whether or not timeouts are swept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.functions.timer import TimerRequest

from common import runtime
from common import transactions as tx
from common.clock import utcnow
from handoff import service
from handoff.messages.contract import MessageType
from handoff.settlement import claims
from handoff.storage import keys
from handoff.storage.records import QueueRow, ReconcileRow
from handoff.timers.reconciler import ReconcileReport
from tests.support.handoff_flows import Flow, complete, event_of, parked

from .broker import Broker, BrokerTransport


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield Broker()


@pytest.fixture
def bus(fresh_tables: str, broker: Broker) -> Iterator[BrokerTransport]:
    transport = BrokerTransport(broker)
    service.use_transport(transport)
    yield transport
    service.reset()


def at(minutes: float) -> None:
    service.settlement_service().clock = lambda: utcnow() + timedelta(minutes=minutes)


def claim_of(flow: Flow) -> Any:
    claim = service.store().get_claim(flow.endpoint, flow.event_id, "park-1")
    assert claim is not None
    return claim


def unconfirmed(call, endpoint: str) -> dict[str, Any]:
    result = call("handoff_unconfirmed", method="GET", route_params={"endpointId": endpoint})
    assert result.status == 200, result.body
    data: dict[str, Any] = result.json
    return data


def queue_rows(endpoint: str) -> list[dict[str, Any]]:
    table = runtime.tables().table(keys.EVENTS_TABLE)
    low, high = keys.QUEUE_RANGE
    found: list[dict[str, Any]] = []
    for pk in service.layout().now().endpoint_partitions(endpoint):
        query = f"PartitionKey eq '{pk}' and RowKey ge '{low}' and RowKey lt '{high}'"
        found += list(table.query_entities(query))
    return found


def reconcile_rows(endpoint: str) -> list[str]:
    table = runtime.tables().table(keys.EVENTS_TABLE)
    low, high = keys.RECONCILE_RANGE
    found: list[str] = []
    for pk in service.layout().now().endpoint_partitions(endpoint):  # every shard (SETTLE_HANDOFF_SHARDS)
        query = f"PartitionKey eq '{pk}' and RowKey ge '{low}' and RowKey lt '{high}'"
        found += [str(e["RowKey"]) for e in table.query_entities(query)]
    return sorted(found)


def test_a_confirmed_send_leaves_nothing_to_reconcile(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    assert complete(call, flow).json["confirmed"] is True
    assert claim_of(flow).state.name == "sent"
    assert reconcile_rows(flow.endpoint) == []


def test_an_unconfirmed_send_is_confirmed_by_the_resolver_s_projection(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    accepted = complete(call, flow)
    assert accepted.json["confirmed"] is False and claim_of(flow).state.name == "sending"
    assert reconcile_rows(flow.endpoint) == []  # followed through its queue mark (ADR-0022 change 9)
    broker.pump()  # the resolver projects the copy the broker had accepted, and takes the queue row away
    at(3)
    report = service.reconciler().run()
    # Nothing left to follow: the projection is the confirmation, and nothing is sent again
    assert report == ReconcileReport()
    assert reconcile_rows(flow.endpoint) == [] and queue_rows(flow.endpoint) == []
    assert len(broker.for_event(flow.event_id)) == 1 and broker.dropped == []
    # The claim was never marked: a retry of the settlement reads the history and answers it delivered
    again = complete(call, flow)
    assert (again.json["replayed"], again.json["confirmed"], again.json["state"]) == (True, True, "delivered")
    assert claim_of(flow).state.name == "delivered" and len(broker.for_event(flow.event_id)) == 1


def test_a_claim_still_unprojected_at_its_first_look_is_found_through_its_queue_mark(
    call, resolve, flow, broker, bus
):
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    complete(call, flow)
    # The resolver is slow: the copy the broker took is not projected yet (no ``broker.pump()``)
    at(1.9)
    assert service.reconciler().run() == ReconcileReport()  # not due before its first look
    at(3)
    report = service.reconciler().run()
    assert report.resent == [flow.event_id] and len(broker.dropped) == 1  # the identical copy: dropped
    [queued] = queue_rows(flow.endpoint)
    assert queued["ReconcileAt"] == claims.RECONCILED  # handled: not read again on the next tick
    at(4)
    assert service.reconciler().run() == ReconcileReport()


def test_the_resend_is_the_identical_message_inside_the_detection_window(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    accepted = complete(call, flow, result={"ledgerEntry": 7781})
    at(3)
    report = service.reconciler().run()
    assert flow.event_id in report.resent
    [original] = broker.for_event(flow.event_id)
    [copy] = broker.dropped  # the duplicate detection dropped it: it was the same message
    assert copy.message_id == original.message_id == accepted.json["controlMessageId"]
    assert copy.body == original.body and copy.properties == original.properties
    assert (copy.message.session_id, copy.message.correlation_id) == (
        original.message.session_id,
        original.message.correlation_id,
    )
    claim = claim_of(flow)
    assert (claim.state.name, claim.attempts) == ("sent", 2)
    assert len(event_of(call, flow)["audits"]) == 1  # a re-send of the same message is not a new audit


def test_without_duplicate_detection_nothing_is_resent_and_the_claim_is_shown_unconfirmed(
    call, resolve, flow, broker, bus, caplog
):
    broker.window = None  # e.g. NimBus-provisioned topics: RequiresDuplicateDetection is off
    parked(resolve, flow)
    bus.then(["lost-before"])
    accepted = complete(call, flow)
    assert accepted.json["confirmed"] is False
    at(3)
    with caplog.at_level(logging.ERROR, logger="settle.reconciler"):
        report = service.reconciler().run()
    assert flow.event_id in report.unconfirmed
    assert broker.delivered == []  # never a second copy it could not deduplicate
    assert claim_of(flow).state.name == "unconfirmed"
    assert any(flow.event_id in r.getMessage() for r in caplog.records)
    seen = unconfirmed(call, flow.endpoint)
    assert seen["count"] == 1
    [item] = seen["items"]
    assert (item["eventId"], item["controlMessageId"]) == (flow.event_id, accepted.json["controlMessageId"])
    # The hand-off stays out of the agents' queue and refuses other settlements
    assert call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).status == 204
    # Reconciling again later adds nothing
    at(20)
    service.reconciler().run()
    assert broker.delivered == [] and unconfirmed(call, flow.endpoint)["count"] == 1


def test_an_unconfirmed_claim_is_cleared_when_its_message_shows_up_late(call, resolve, flow, broker, bus):
    broker.window = None
    parked(resolve, flow)
    bus.then(["deliver-then-raise"])
    complete(call, flow)
    at(3)
    assert flow.event_id in service.reconciler().run().unconfirmed
    broker.pump()  # the resolver was only late
    at(30)
    assert flow.event_id in service.reconciler().run().delivered
    assert unconfirmed(call, flow.endpoint)["count"] == 0
    assert claim_of(flow).state.name == "delivered" and reconcile_rows(flow.endpoint) == []


def test_past_the_detection_window_a_claim_is_not_resent(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    bus.then(["lost-before"])
    complete(call, flow)
    at(12)  # the first reconciler run comes too late: a copy could no longer be deduplicated
    report = service.reconciler().run()
    assert flow.event_id in report.unconfirmed and broker.delivered == []


def test_a_row_that_moved_on_without_the_message_supersedes_the_claim(call, resolve, flow, broker, bus):
    parked(resolve, flow)
    bus.then(["lost-before"])
    complete(call, flow)
    # An operator resubmitted the event meanwhile: the hand-off is over, and its queue row with it
    resolve(flow.control(MessageType.ResubmissionRequest, message_id="resubmit-1"))
    at(3)
    report = service.reconciler().run()
    assert report == ReconcileReport() and broker.delivered == []  # nothing to follow, nothing sent
    assert reconcile_rows(flow.endpoint) == [] and queue_rows(flow.endpoint) == []
    # A retry of the settlement finds it superseded (it was never sent, and never will be)
    again = complete(call, flow)
    assert again.status == 409 and "superseded" in again.json["detail"]
    assert broker.delivered == [] and claim_of(flow).state.name == "superseded"


def test_a_claim_on_an_operator_action_keeps_its_reconcile_row(call, resolve, flow, broker, bus):
    """A claim with no queue row (not a hand-off's settlement) is followed through ``rc|``, as before."""
    parked(resolve, flow)
    bus.then(["lost-before"])
    complete(call, flow)
    pk = service.layout().now().event_partition(flow.endpoint, flow.event_id)
    claim = claim_of(flow)
    # A claim as written before ADR-0022 change 9: its own reconcile row, the queue row not due
    due = keys.reconcile_row(claim.claimed_at, flow.event_id, "park-1")
    store = service.store()
    row = ReconcileRow(event_id=flow.event_id, parked_message_id="park-1", due_at=claim.claimed_at)
    claim_key = keys.claim_row(flow.event_id, "park-1")
    store.submit(
        [
            tx.merge({"PartitionKey": pk, "RowKey": claim_key, "ReconcileKey": due}),
            tx.insert(row.to_entity(pk, due)),
        ]
    )
    [queued] = queue_rows(flow.endpoint)
    store.submit([claims.plan_queue_look(pk, QueueRow.from_entity(queued), claims.RECONCILED)])
    at(3)
    report = service.reconciler().run()
    assert report.resent == [flow.event_id] and len(broker.for_event(flow.event_id)) == 1
    assert reconcile_rows(flow.endpoint) == []


def test_the_timer_reconciles_even_when_timeouts_are_not_swept(call, resolve, flow, broker, bus, monkeypatch):
    monkeypatch.delenv("HANDOFF_SWEEPER_ENABLED", raising=False)
    parked(resolve, flow)
    bus.then(["lost-before"])
    complete(call, flow)
    at(3)
    call.functions["handoff_sweeper"].get_user_function()(TimerRequest(past_due=False))
    assert len(broker.for_event(flow.event_id)) == 1


def test_a_retry_meeting_its_own_unconfirmed_claim_resends_at_once_when_that_is_safe(
    call, resolve, flow, broker, bus
):
    parked(resolve, flow)
    bus.then(["lost-before"])
    first = complete(call, flow)
    again = complete(call, flow)
    assert again.json["replayed"] is True and again.json["confirmed"] is True
    assert again.json["controlMessageId"] == first.json["controlMessageId"]
    assert len(broker.for_event(flow.event_id)) == 1
