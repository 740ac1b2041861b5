"""State records for operators: lookup by key with history; stuck locks from the catch-up index only."""

from __future__ import annotations

import uuid
from datetime import timedelta

from common.roundtrips import ROUND_TRIPS
from management.records import stuck
from state import service as state_service


def key(item: str) -> dict[str, object]:
    return {"tenantId": 7, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice", "itemKey": item}


def test_lookup_answers_the_record_and_its_history(call):
    k = key("INV-" + uuid.uuid4().hex[:8])
    token = call("state_lock", {"key": k}).json["lockToken"]
    assert call("state_set", {"key": k, "status": "Processed", "lockToken": token}).status == 200
    found = call("records_lookup", {"key": k})
    assert found.status == 200
    assert found.json["record"]["status"] == "Processed"
    assert [i["status"] for i in found.json["history"]["items"]] == ["Processed", "Superseded"]
    missing = call("records_lookup", {"key": key("never-" + uuid.uuid4().hex)})
    assert missing.status == 200 and missing.json["record"] is None
    assert call("records_lookup", {"key": {"tenantId": 7}}).json["field"].startswith("key.")


def test_stuck_lists_expired_locks_only_and_reads_no_live_record(call, fresh_tables):
    expired, live, done = (key(f"{name}-{uuid.uuid4().hex[:8]}") for name in ("stuck", "live", "done"))
    assert call("state_lock", {"key": expired, "lockSeconds": 1}).json["acquired"]
    assert call("state_lock", {"key": live, "lockSeconds": 3600}).json["acquired"]
    token = call("state_lock", {"key": done, "lockSeconds": 1}).json["lockToken"]
    assert call("state_set", {"key": done, "status": "Processed", "lockToken": token}).status == 200
    later = state_service.store().now() + timedelta(seconds=5)
    items = {r.item_key for r in stuck(now=later)[0]}
    assert expired["itemKey"] in items
    assert live["itemKey"] not in items and done["itemKey"] not in items
    with ROUND_TRIPS.measure() as tally:
        stuck(now=later)
    # level-1 rows, then per (minute, partition) one range read, then one head read per expired lock
    assert tally.requests <= 1 + 2 * len(items) + 2
