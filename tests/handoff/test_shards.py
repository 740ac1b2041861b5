"""Hand-off rows sharded by event id (``SETTLE_HANDOFF_SHARDS``): an endpoint over S partitions, each event
whole in one, every reader across them, and a change of S that loses nothing."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.functions.timer import TimerRequest

from common import layouts
from handoff import service
from handoff.messages.contract import MessageType
from handoff.storage import keys
from tests.layouts import fast_changes, reshard
from tests.support.handoff_flows import Flow, event_of


def rows_of(endpoint: str) -> dict[str, list[str]]:
    """Every ``hoevents`` row of the endpoint, any layout, by PartitionKey (reads every partition whose key
    starts with the endpoint's: tests only)."""
    base = keys.partition(endpoint)
    table = service.store().table(keys.EVENTS_TABLE)
    query = f"PartitionKey ge '{base}' and PartitionKey lt '{base}\u007f'"
    found: dict[str, list[str]] = defaultdict(list)
    for entity in table.query_entities(query, select=["PartitionKey", "RowKey"]):
        pk = str(entity["PartitionKey"])
        if pk == base or pk.startswith(base + "~"):
            found[pk].append(str(entity["RowKey"]))
    return found


def belongs(row_key: str, event_id: str) -> bool:
    return f"|{keys.encode(event_id)}|" in row_key + "|"


def park(resolve: Any, endpoint: str, event_id: str, at: datetime) -> Flow:
    flow = Flow(endpoint=endpoint, event_id=event_id)
    resolve(flow.request(enqueued=at - timedelta(seconds=1)))
    resolve(flow.park(enqueued=at, job=f"job-{event_id}", expected_by=None))
    return flow


def next_event(call: Any, endpoint: str) -> str | None:
    answer = call("handoff_next", method="GET", route_params={"endpointId": endpoint})
    return None if answer.status == 204 else str(answer.json["coordinates"]["eventId"])


def test_an_endpoints_rows_land_in_four_partitions_and_each_events_rows_in_one(
    call, resolve, monkeypatch, fresh_tables
):
    # Given a deployment whose first instance records S = 4, and 24 events of one endpoint, parked oldest
    # first in a known order
    monkeypatch.setenv(keys.SHARDS_SETTING, "4")
    endpoint = "Shard-" + uuid.uuid4().hex[:8]
    base = datetime.now(UTC) - timedelta(hours=2)
    events = [f"evt-{i:02d}" for i in range(24)]
    for i, event_id in enumerate(events):
        park(resolve, endpoint, event_id, base + timedelta(minutes=i))
    # Then the rows are in exactly the endpoint's 4 shards, none in the unsharded partition
    found = rows_of(endpoint)
    assert sorted(found) == sorted(service.layout().now().endpoint_partitions(endpoint))
    assert len(found) == 4 and keys.partition(endpoint) not in found
    # And every row of one event (ev|, hq|, ad|, sd|, sa|, ...) is in the event's own partition
    for event_id in events:
        where = {pk for pk, row_keys in found.items() for rk in row_keys if belongs(rk, event_id)}
        assert where == {service.layout().now().event_partition(endpoint, event_id)}, event_id
        kinds = {
            rk.split("|")[0]
            for rk in found[service.layout().now().event_partition(endpoint, event_id)]
            if belongs(rk, event_id)
        }
        assert {"ev", "hq", "sd"} <= kinds and not kinds & {"jb", "ss", "ad", "sa"}  # ADR-0022
    # And next gives the oldest parked event of all the shards; the job lookup finds one in any shard
    assert next_event(call, endpoint) == "evt-00"
    for event_id in (events[5], events[17]):
        job = call(
            "handoff_job",
            method="GET",
            route_params={"endpointId": endpoint, "externalJobId": f"job-{event_id}"},
        )
        assert job.status == 200 and job.json["coordinates"]["eventId"] == event_id
    # And the counts are the sum of the shards' (every event Pending, parked)
    totals = service.overview().counts(endpoint)
    assert (totals["Pending"], totals["PendingHandoff"]) == (24, 24)


def test_the_layout_setting_is_checked(monkeypatch):
    for bad in ("0", "1000", "four"):
        monkeypatch.setenv(keys.SHARDS_SETTING, bad)
        with pytest.raises(ValueError, match=keys.SHARDS_SETTING):
            keys.configured_shard_count()
    monkeypatch.setenv(keys.SHARDS_SETTING, "4")
    monkeypatch.setenv(keys.PREVIOUS_SHARDS_SETTING, "1, 4,x")
    with pytest.raises(ValueError, match=keys.PREVIOUS_SHARDS_SETTING):
        keys.configured_previous_shard_counts()
    monkeypatch.setenv(keys.PREVIOUS_SHARDS_SETTING, "1, 4;2")
    assert keys.configured_previous_shard_counts() == (1, 2)  # the current value is not an earlier one


def test_changing_the_shard_count_loses_nothing(call, resolve, monkeypatch, loopback, fresh_tables):
    # Given events parked under the unsharded layout (S = 1)
    fast_changes(monkeypatch)
    monkeypatch.setenv(keys.SHARDS_SETTING, "1")
    monkeypatch.delenv(keys.PREVIOUS_SHARDS_SETTING, raising=False)
    endpoint = "Reshard-" + uuid.uuid4().hex[:8]
    base = datetime.now(UTC) - timedelta(hours=2)
    old = [park(resolve, endpoint, f"old-{i}", base + timedelta(minutes=i)) for i in range(3)]
    # And one of them overdue
    overdue = Flow(endpoint=endpoint, event_id="old-overdue")
    resolve(overdue.request(enqueued=base))
    past = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")
    resolve(overdue.park(enqueued=base + timedelta(minutes=10), expected_by=past))
    # When an operator moves the deployment to S = 4 (the recorded layout keeps S = 1 as an earlier one)
    reshard(layouts.HANDOFF, 4)
    new = [park(resolve, endpoint, f"new-{i}", base + timedelta(minutes=30 + i)) for i in range(8)]
    # Then the old events stay where they were and the new ones spread over the new shards
    found = rows_of(endpoint)
    assert keys.partition(endpoint) in found and len(found) > 2
    # And next still gives the oldest (an old-layout event), the job lookup and the event read find it
    assert next_event(call, endpoint) == "old-0"
    job = call(
        "handoff_job", method="GET", route_params={"endpointId": endpoint, "externalJobId": "job-old-1"}
    )
    assert job.status == 200 and job.json["coordinates"]["eventId"] == "old-1"
    assert event_of(call, old[2])["pendingSubStatus"] is not None
    # And a message for an old event is projected into its old partition (no twin in the new layout)
    received = call("handoff_next", method="GET", route_params={"endpointId": endpoint})
    settled = call(
        "handoff_complete",
        {"endpointId": endpoint, "coordinates": received.json["coordinates"], "result": {"ok": True}},
    )
    assert settled.status == 202
    resolve(
        old[0].response(
            MessageType.ResolutionResponse,
            parent=settled.json["controlMessageId"],
            correlation_id=settled.json["controlMessageId"],
        )
    )
    assert event_of(call, old[0])["resolutionStatus"] == "Completed"
    found = rows_of(endpoint)
    where = {pk for pk, row_keys in found.items() for rk in row_keys if belongs(rk, "old-0")}
    assert where == {keys.partition(endpoint)}
    # And the sweeper fails the overdue old-layout hand-off
    monkeypatch.setenv("HANDOFF_SWEEPER_ENABLED", "true")
    call.functions["handoff_sweeper"].get_user_function()(TimerRequest(past_due=False))
    assert [a["auditorName"] for a in event_of(call, overdue)["audits"]] == ["Sweeper"]
    # And the counts and the listing see every event of both layouts
    totals = service.overview().counts(endpoint)
    assert totals["Completed"] == 1 and totals["PendingHandoff"] == 2 + len(new)
    page = service.overview().events(
        endpoint, bucket=None, event_type_ids=(), oldest=None, newest=None, page_size=5, continuation=None
    )
    seen = [row.event_id for row in page.items]
    while page.continuation:
        page = service.overview().events(
            endpoint,
            bucket=None,
            event_type_ids=(),
            oldest=None,
            newest=None,
            page_size=5,
            continuation=page.continuation,
        )
        seen += [row.event_id for row in page.items]
    assert sorted(seen) == sorted([f.event_id for f in old] + ["old-overdue"] + [f.event_id for f in new])
