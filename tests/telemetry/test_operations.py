"""Every state operation of the issue's list is its own ``settle.state.<op>`` span with the ids that find
the item, its outcome and its storage round trips; the outcomes the issue names (takeover, refused-stale)
are on the spans and in the counters."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.support.handoff_flows import Flow
from tests.telemetry.conftest import Recorded, attrs


def key() -> dict[str, Any]:
    return {
        "tenantId": 11,
        "scopeId": 4,
        "entityId": 300,
        "entityExecutionId": 9,
        "itemEntityKey": "invoice",
        "itemKey": "INV-" + uuid.uuid4().hex[:8],
    }


def test_each_state_operation_is_a_span_named_for_it_with_the_item_s_ids(otel: Recorded, call):
    k, other, third = key(), key(), key()
    assert call("state_exists", {"key": k}).status == 200
    token = call("state_lock", {"key": k}).json["lockToken"]
    assert call("state_lock_extend", {"key": k, "lockToken": token}).status == 200
    assert call("state_set", {"key": k, "status": "Processed", "lockToken": token}).status == 200
    assert call("state_upsert", {"key": other, "data": {"n": 1}}).status == 200
    release_token = call("state_lock", {"key": third}).json["lockToken"]
    assert call("state_release", {"key": third, "error": "gave up", "lockToken": release_token}).status == 200
    assert call("state_get", {"key": k}).status == 200
    assert call("state_query", {"tenantId": 11, "scopeId": 4, "entityId": 300}).status == 200
    assert call("state_history", {"key": k}).status == 200

    ops = ["exists", "lock", "extend", "set", "upsert", "release", "get", "query", "history"]
    by_op = {op: otel.spans(f"settle.state.{op}") for op in ops}
    assert {op: len(spans) for op, spans in by_op.items()} == {
        **dict.fromkeys(ops, 1),
        "lock": 2,
    }
    for op, spans in by_op.items():
        for span in spans:
            a = attrs(span)
            assert a["settle.tenant_id"] == 11 and a["settle.scope"] == "Element", op
            assert a["settle.entity_id"] == 300, op
            assert a["http.response.status_code"] == 200, op
            assert a["settle.storage.round_trips"] >= 1, op
            assert "settle.outcome" in a, op
            if op != "query":
                assert a["settle.item_key"] in (k["itemKey"], other["itemKey"], third["itemKey"]), op
                assert a["settle.entity_execution_id"] == 9, op
    extend, release = attrs(otel.span("settle.state.extend")), attrs(otel.span("settle.state.release"))
    upsert = attrs(otel.span("settle.state.upsert"))
    assert extend["settle.status_before"] == "Processing" and extend["settle.status_after"] == "Processing"
    assert release["settle.outcome"] == "applied" and release["settle.status_after"] == "Failed"
    assert upsert["settle.outcome"] == "applied" and upsert["settle.status_before"] == "None"
    assert attrs(otel.span("settle.state.query"))["settle.items"] >= 1
    for op in ops:
        assert otel.value("settle.state.operations", op=op) == len(by_op[op]), op
        assert otel.value("settle.state.duration", op=op) == len(by_op[op]), op


def test_a_lock_taken_over_from_an_expired_holder_is_a_takeover(otel: Recorded, call):
    k = key()
    assert call("state_lock", {"key": k, "lockSeconds": 1}).json["acquired"]
    time.sleep(2.0)  # the first holder's lock expires (storage time; no assertion on timing)
    taken = call("state_lock", {"key": k}).json
    assert taken["acquired"] and taken["takeover"]
    first, second = otel.spans("settle.state.lock")
    assert attrs(first)["settle.outcome"] == "acquired"
    assert attrs(second)["settle.outcome"] == "takeover"
    assert attrs(second)["settle.status_before"] == "Processing"
    assert otel.value("settle.state.locks", outcome="takeover") == 1


def test_a_stale_copy_refused_by_the_resolver_is_refused_stale(otel: Recorded, resolve, flow: Flow):
    resolve(flow.request())
    resolve(flow.park(correlation_id="req-1"))
    resolve(flow.request(message_id="req-1-copy"))  # an EventRequest after the hand-off: stale
    outcomes = [attrs(s)["settle.outcome"] for s in otel.spans("settle.resolver.project")]
    assert outcomes == ["applied", "applied", "refused-stale"]
    stale = otel.spans("settle.resolver.project")[-1]
    assert attrs(stale)["settle.status_before"] == attrs(stale)["settle.status_after"] == "Pending+Handoff"
    assert otel.value("settle.resolver.messages", message_type="EventRequest", outcome="refused-stale") == 1
