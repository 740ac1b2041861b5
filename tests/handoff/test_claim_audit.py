"""The audit of a settlement rendered from its claim (ADR-0022 change 3), against Azurite through the app.

The claim transaction writes no audit row: the claim holds who, when, the audit's type and data, and every
event view (the hand-off API's and the operators') renders the entry from it, as the row said it. A claim
written before keeps its own audit row (``AuditKey``), shown once; a claim released after a send that
certainly reached nothing takes its audit with it, and a legacy claim's release deletes its audit row.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from common import transactions as tx
from handoff import service
from handoff.storage import keys
from handoff.storage.records import ClaimRow
from tests.support.handoff_flows import Flow, complete, coordinates, event_of, fail, parked

AGENT = {"x-agent-id": "agent-7"}


def operator_view(call: Any, flow: Flow) -> dict[str, Any]:
    answer = call(
        "endpoint_event", method="GET", route_params={"endpointId": flow.endpoint, "eventId": flow.event_id}
    )
    assert answer.status == 200, answer.body
    return dict(answer.json)


def rows_of(flow: Flow, kind: str) -> list[Any]:
    """The event's stored rows of one kind (``a`` audit, ``c`` claim), as written."""
    rows = service.store().event_rows(flow.endpoint, flow.event_id)
    return [e for e in rows if str(e["RowKey"]).split("|")[2] == kind]


def as_legacy(flow: Flow) -> str:
    """Rewrite the event's claim as the claim transaction wrote it before ADR-0022 change 3: the audit in a
    row of its own beside it (``AuditKey`` names it), no audit columns on the claim. Returns the row key."""
    store = service.store()
    [entity] = rows_of(flow, "c")
    claim = ClaimRow.from_entity(entity)
    audit = claim.audit()
    assert audit is not None
    audit_key = keys.audit_row(flow.event_id, claim.claimed_at, uuid.uuid4().hex)
    legacy = claim.model_copy(
        update={
            "audit_key": audit_key,
            "audit_type": None,
            "audit_comment": None,
            "audit_data": None,
            "endpoint_id": None,
            "event_type_id": None,
        }
    )
    pk = store.event_partition(flow.endpoint, flow.event_id)
    store.submit(
        [
            tx.replace(legacy.to_entity(pk, str(entity["RowKey"])), claim.etag or "*"),
            tx.insert(audit.to_entity(pk, audit_key)),
        ]
    )
    return audit_key


def test_a_settled_hand_off_shows_the_audit_rendered_from_its_claim_and_writes_no_audit_row(
    call, resolve, flow, transport
):
    # Given a parked hand-off, completed by an agent
    parked(resolve, flow)
    body = {"endpointId": flow.endpoint, "coordinates": coordinates(flow), "result": {"rows": 3}}
    settled = call("handoff_complete", body | {"settledBy": "erp-checker"}, headers=AGENT)
    assert settled.status == 202, settled.body

    # Then no audit row was written: the claim is the audit
    assert rows_of(flow, "a") == [] and len(rows_of(flow, "c")) == 1
    # And both event views show the one entry the audit row used to hold, at the claim's time
    [audit] = event_of(call, flow)["audits"]
    assert audit == {
        "auditorName": "erp-checker",
        "auditTimestamp": settled.json["claimedAt"],
        "auditType": "CompleteHandoff",
        "comment": None,
        "data": audit["data"],
        "principalName": None,
        "principalId": None,
        "accessDenied": False,
    }
    assert json.loads(audit["data"]) == {
        "controlMessageId": settled.json["controlMessageId"],
        "parkedMessageId": "park-1",
        "result": '{"rows":3}',
        "errorText": None,
        "errorType": None,
        "agentId": "agent-7",
        "principalName": None,
        "principalId": None,
    }
    assert operator_view(call, flow)["audits"] == [audit]


def test_the_rendered_audit_is_the_json_the_written_audit_row_answered(call, resolve, flow, transport):
    # Given a hand-off failed by an agent, its audit rendered from the claim
    parked(resolve, flow)
    assert fail(call, flow, errorType="DmfValidation", settledBy="erp-checker").status == 202
    rendered = event_of(call, flow)["audits"]
    assert [a["auditType"] for a in rendered] == ["FailHandoff"]

    # When its claim is rewritten as the claim transaction wrote it before (an audit row beside it)
    as_legacy(flow)

    # Then both event views answer exactly the same JSON from the written row, once (not twice)
    assert len(rows_of(flow, "a")) == 1
    assert event_of(call, flow)["audits"] == rendered
    assert operator_view(call, flow)["audits"] == rendered


def test_a_claim_released_after_a_refused_send_leaves_no_audit(call, resolve, flow, transport):
    # Given a settlement whose send certainly reached nothing (503, the claim released)
    parked(resolve, flow)
    transport.fail = True
    assert complete(call, flow).status == 503

    # Then no claim, no audit row, and no audit in either view
    assert rows_of(flow, "c") == [] and rows_of(flow, "a") == []
    assert event_of(call, flow)["audits"] == [] and operator_view(call, flow)["audits"] == []
    # And the retry that is sent shows exactly one
    transport.fail = False
    assert complete(call, flow).status == 202
    assert [a["auditType"] for a in event_of(call, flow)["audits"]] == ["CompleteHandoff"]


def test_the_release_of_a_legacy_claim_deletes_its_audit_row(call, resolve, flow, transport):
    # Given a claim written before ADR-0022 change 3 (its audit row beside it), its send not confirmed
    parked(resolve, flow)
    assert complete(call, flow).status == 202
    audit_key = as_legacy(flow)
    store = service.store()
    claim = store.get_claim(flow.endpoint, flow.event_id, "park-1")
    row = store.get_event(flow.endpoint, flow.event_id)
    assert claim is not None and claim.audit_key == audit_key and row is not None
    assert claim.audit() is None  # its row is its audit

    # When it is released (as after a send that certainly reached nothing)
    assert service.settlement_service().follow_up.release(flow.endpoint, row, claim)

    # Then the claim and its audit row are gone, and the views show no audit
    assert rows_of(flow, "c") == [] and rows_of(flow, "a") == []
    assert event_of(call, flow)["audits"] == []


def test_an_event_settled_twice_shows_each_claims_audit_in_time_order(call, resolve, flow, transport):
    # Given a hand-off settled (its claim written before ADR-0022 change 3), then parked again by another
    # message and settled again (a new claim, its audit rendered)
    parked(resolve, flow)
    first = complete(call, flow, settledBy="first")
    assert first.status == 202
    as_legacy(flow)
    resolve(flow.park(message_id="park-2", correlation_id="corr-1", originating="req-1"))
    second = fail(
        call, flow, coordinates={"eventId": flow.event_id, "messageId": "park-2"}, settledBy="second"
    )
    assert second.status == 202, second.body

    # Then the event view shows both, oldest first: the written row and the rendered entry
    audits = event_of(call, flow)["audits"]
    assert [(a["auditType"], a["auditorName"]) for a in audits] == [
        ("CompleteHandoff", "first"),
        ("FailHandoff", "second"),
    ]
    assert [a["auditTimestamp"] for a in audits] == [first.json["claimedAt"], second.json["claimedAt"]]
    assert len(rows_of(flow, "a")) == 1 and len(rows_of(flow, "c")) == 2
