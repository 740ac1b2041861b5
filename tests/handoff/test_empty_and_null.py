"""An optional property sent as ``""`` stays ``""``, and one not sent stays null: through the resolver into
the event row, the history and every API answer (NimBus's conformance:
``Optional_*_round_trip_null_and_empty``)."""

from __future__ import annotations

from typing import Any

from handoff import service
from handoff.messages.contract import MessageType
from handoff.storage.records import HistoryRow
from tests.support.handoff_flows import Flow, event_of

# Optional text properties of a parked response, sent empty.
EMPTY = {
    "HandoffReason": "",
    "ExternalJobId": "",
    "DeadLetterReason": "",
    "OriginatingMessageId": "",
}


def _park(resolve: Any, flow: Flow, *, correlation_id: str | None = "", **props: Any) -> None:
    resolve(flow.request())
    resolve(
        flow.response(
            MessageType.PendingHandoffResponse, message_id="park-1", correlation_id=correlation_id, **props
        )
    )


def test_empty_stays_empty_and_absent_stays_null_in_rows_history_and_answers(call, resolve, flow) -> None:
    absent = Flow(endpoint=flow.endpoint, event_id=flow.event_id + "-absent")
    _park(resolve, flow, **EMPTY)
    _park(resolve, absent, drop=("OriginatingMessageId",), correlation_id=None)

    # the event row
    empty_row = service.store().get_event(flow.endpoint, flow.event_id)
    null_row = service.store().get_event(absent.endpoint, absent.event_id)
    assert empty_row is not None and null_row is not None
    columns = ("handoff_reason", "external_job_id", "dead_letter_reason")
    assert [getattr(empty_row, c) for c in columns] == ["", "", ""]
    assert [getattr(null_row, c) for c in columns] == [None, None, None]
    assert empty_row.correlation_id == "" and empty_row.originating_message_id == ""
    assert null_row.originating_message_id is None
    # the history row of the park
    history = [
        HistoryRow.from_entity(e)
        for e in service.store().event_rows(flow.endpoint, flow.event_id)
        if e.get("MessageId") == "park-1"
    ]
    assert [(h.handoff_reason, h.external_job_id, h.correlation_id) for h in history] == [("", "", "")]

    # the event API (row and history)
    empty_view, null_view = event_of(call, flow), event_of(call, absent)
    assert (empty_view["handoffReason"], empty_view["externalJobId"]) == ("", "")
    assert (null_view["handoffReason"], null_view["externalJobId"]) == (None, None)
    fields = ("handoffReason", "externalJobId", "deadLetterReason")
    [parked] = [m for m in empty_view["history"] if m["messageId"] == "park-1"]
    assert [parked[f] for f in fields] == ["", "", ""]
    [parked] = [m for m in null_view["history"] if m["messageId"] == "park-1"]
    assert [parked[f] for f in fields] == [None, None, None]

    # the operator's event, listing and find; the agent's next
    for f, expected in ((flow, ""), (absent, None)):
        route = {"endpointId": f.endpoint, "eventId": f.event_id}
        operator = call("endpoint_event", method="GET", route_params=route).json
        assert (operator["handoffReason"], operator["externalJobId"]) == (expected, expected)
        page = call("endpoint_events", method="GET", route_params={"endpointId": f.endpoint}).json["items"]
        assert [e["externalJobId"] for e in page if e["eventId"] == f.event_id] == [expected]
        items = call("find_events", method="GET", params={"eventId": f.event_id}).json["items"]
        [found] = [e for e in items if e["eventId"] == f.event_id]
        assert found["externalJobId"] == expected
    taken = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).json
    assert taken is not None and taken["handoffReason"] == "" and taken["externalJobId"] == ""


def test_an_empty_job_id_is_not_a_job_anyone_can_find(call, resolve, flow: Flow) -> None:
    _park(resolve, flow, HandoffReason="", ExternalJobId="")
    assert call("find_events", method="GET", params={"q": '""'}).json["items"] == []
    assert call("find_events", method="GET", params={"externalJobId": "  "}).status == 400
