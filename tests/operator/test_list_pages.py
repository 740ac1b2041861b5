"""Every operator list is complete or says it is not: failed across endpoints, unconfirmed settlements and
overdue hand-offs page with a continuation token until every one of 10,000 was listed, once; a page says
whether more follow; a token of another query, or an edited one, is a 400 naming it.

The rows are written straight into the index ranges the lists read (as tests/operator/test_find_pages.py
seeds the find index), so each test pays for the paging it checks, not for 10,000 projections.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common import page_tokens
from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.messages.contract import MessageType, ResolutionStatus
from handoff.storage import keys
from handoff.storage.records import ExpiryRow, ListingRow, QueueRow, UnconfirmedRow
from tests.support.seeding import tables_of_this_module, upsert_all  # noqa: F401 (the fixture is autouse)

MANY = 10_000
LEGACY = 5  # overdue hand-offs parked before ADR-0022 change 5
BASE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def write(table_name: str, rows: list[dict[str, Any]]) -> None:
    upsert_all(service.store().table(table_name), rows)


def every_page(call: Any, name: str, page_size: int, **request: Any) -> list[dict[str, Any]]:
    """Every page of a GET listing, following its tokens."""
    pages: list[dict[str, Any]] = []
    params = dict(request.pop("params", {}), pageSize=str(page_size))
    while True:
        answer = call(name, method="GET", params=params, **request)
        assert answer.status == 200, answer.body
        pages.append(answer.json)
        token = answer.json["continuationToken"]
        if token is None:
            return pages
        params = {**params, "continuationToken": token}
        assert len(pages) <= MANY, "the pages never end"


def listed_once(pages: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """Every item of ``pages`` by ``key``, asserting none was listed twice and that every page but the
    last says more follow."""
    listed = [key(item) for page in pages for item in page["items"]]
    assert len(listed) == len(set(listed)), "an item listed twice"
    assert all(p["continuationToken"] for p in pages[:-1]) and pages[-1]["continuationToken"] is None
    return listed


def edited(token: str) -> str:
    raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    return base64.urlsafe_b64encode(json.dumps({**raw, "f": raw["f"][::-1]}).encode()).decode().rstrip("=")


# -- failed across endpoints -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def failed_many(settle_tables: str) -> tuple[str, dict[tuple[str, str], datetime]]:
    """Two endpoints with 10,000 failed and dead-lettered events between them, some changed at the same
    instant on both (the stream orders them by endpoint then)."""
    tag = uuid.uuid4().hex[:6]
    store = service.store()
    expected: dict[tuple[str, str], datetime] = {}
    rows = []
    for n in range(MANY):
        endpoint = f"Failing-{tag}-{'a' if n % 4 else 'b'}"
        bucket = "DeadLettered" if n % 3 == 0 else "Failed"
        event_id = f"{tag}-{n:05d}"
        updated = BASE + timedelta(milliseconds=n // 2)  # two events of each instant
        row = ListingRow(
            event_id=event_id,
            resolution_status=ResolutionStatus[bucket],
            message_type=MessageType.ErrorResponse,
            updated_at=updated,
            enqueued_time_utc=updated,
            reason="ERP timeout",
        )
        pk = service.layout().now().event_partition(endpoint, event_id)
        rows.append(row.to_entity(pk, keys.bucket_row(bucket, updated, event_id)))
        expected[(endpoint, event_id)] = updated
    for endpoint in {e for e, _ in expected}:
        store.register_endpoint(endpoint)
    write(keys.EVENTS_TABLE, rows)
    return tag, expected


def test_ten_thousand_failed_events_are_each_listed_once_newest_first_over_pages(call, failed_many) -> None:
    tag, expected = failed_many
    pages = every_page(call, "failed_events", 200)
    listed = listed_once(pages, lambda e: (e["endpointId"], e["eventId"]))
    mine = [item for item in listed if item[1].startswith(tag)]
    assert set(mine) == set(expected)
    times = [expected[item] for item in mine]
    assert times == sorted(times, reverse=True), "newest change first across endpoints and pages"


def test_a_failed_page_costs_what_the_first_page_did(call, failed_many) -> None:
    from management.failed import page

    store = service.store()
    endpoints = store.endpoints()
    _, token = page(store, page_size=50, token=None)
    with ROUND_TRIPS.measure() as tally:
        items, _ = page(store, page_size=50, token=token)
    assert len(items) == 50
    assert tally.requests == 1 + 2 * len(endpoints) * service.layout().now().shards, tally.methods


def test_a_failed_token_edited_or_of_another_list_is_refused_naming_it(call, failed_many) -> None:
    token = call("failed_events", method="GET", params={"pageSize": "5"}).json["continuationToken"]
    assert token
    for bad in (edited(token), "not-a-token", token[:-4]):
        answer = call("failed_events", method="GET", params={"continuationToken": bad})
        assert answer.status == 400 and answer.json["field"] == "continuationToken", answer.json


# -- unconfirmed settlements and overdue hand-offs ------------------------------------------------------


@pytest.fixture(scope="module")
def stuck_many(settle_tables: str) -> tuple[str, list[str]]:
    """One endpoint with 10,000 unconfirmed settlements and 10,000 hand-offs past their ExpectedBy: the
    first few parked before ADR-0022 change 5 (an ``ex|`` row; their queue row has no ExpectedBy), the rest
    with ExpectedBy on their queue row, due in the reverse order they parked in."""
    tag = uuid.uuid4().hex[:6]
    endpoint = f"Stuck-{tag}"
    event_ids = [f"{tag}-{n:05d}" for n in range(MANY)]
    rows = []
    for n, event_id in enumerate(event_ids):
        pk = service.layout().now().event_partition(endpoint, event_id)
        at = BASE + timedelta(seconds=n)
        unconfirmed = UnconfirmedRow(
            event_id=event_id,
            parked_message_id=f"park-{event_id}",
            control_message_id=f"ctl-{event_id}",
            message_type=MessageType.HandoffCompletedRequest,
            settled_by="agent-7",
            claimed_at=at,
            since=at,
        )
        rows.append(unconfirmed.to_entity(pk, keys.unconfirmed_row(event_id, f"park-{event_id}")))
        if n < LEGACY:
            legacy = ExpiryRow(event_id=event_id, expected_by=at)
            rows.append(legacy.to_entity(pk, keys.expiry_row(at, event_id)))
            parked = QueueRow(event_id=event_id, parked_message_id=f"park-{event_id}")
        else:
            due = BASE + timedelta(seconds=2 * MANY - n)  # past, and the later parks due first
            parked = QueueRow(event_id=event_id, parked_message_id=f"park-{event_id}", expected_by=due)
        rows.append(parked.to_entity(pk, keys.queue_row(at, event_id)))
    write(keys.EVENTS_TABLE, rows)
    service.store().register_endpoint(endpoint)
    return endpoint, event_ids


@pytest.mark.parametrize("what", ["unconfirmed", "overdue"])
def test_ten_thousand_stuck_hand_offs_are_each_listed_once_and_counted_at_least(
    call, stuck_many, what: str
) -> None:
    endpoint, event_ids = stuck_many
    pages = every_page(call, f"endpoint_{what}", 1000, route_params={"endpointId": endpoint})
    listed = listed_once(pages, lambda item: item["eventId"])
    assert sorted(listed) == event_ids
    assert len(pages) == len(event_ids) // 1000 + 1 or len(pages) == len(event_ids) // 1000
    assert all(p["count"] == 1000 and p["atLeast"] for p in pages), "10,000 is at least the 1,000 counted"
    if what == "overdue":
        # The parks from before (ex|) most overdue first, then the queue oldest park first (ADR-0022)
        assert listed == event_ids, "oldest park first"


def test_the_overview_says_its_stuck_counts_stopped_at_a_thousand(call, stuck_many) -> None:
    endpoint, _ = stuck_many
    overview = call("endpoints_overview", method="GET").json
    item = next(i for i in overview["items"] if i["endpointId"] == endpoint)
    assert (item["unconfirmed"], item["unconfirmedAtLeast"]) == (1000, True)
    assert (item["overdueHandoffs"], item["overdueHandoffsAtLeast"]) == (1000, True)
    others = [i for i in overview["items"] if i["endpointId"] != endpoint and i["unconfirmed"] < 1000]
    assert all(not i["unconfirmedAtLeast"] and not i["overdueHandoffsAtLeast"] for i in others)


@pytest.mark.parametrize("what", ["unconfirmed", "overdue"])
def test_a_stuck_page_costs_one_read_and_one_count_per_shard(call, stuck_many, what: str) -> None:
    endpoint, _ = stuck_many
    route = {"endpointId": endpoint}
    first = call(f"endpoint_{what}", method="GET", params={"pageSize": "100"}, route_params=route)
    with ROUND_TRIPS.measure() as tally:
        second = call(
            f"endpoint_{what}",
            method="GET",
            params={"pageSize": "100", "continuationToken": first.json["continuationToken"]},
            route_params=route,
        )
    assert second.status == 200 and len(second.json["items"]) == 100
    assert tally.requests == 2 * service.layout().now().shards, tally.methods


@pytest.mark.parametrize("what", ["unconfirmed", "overdue"])
def test_a_stuck_token_of_another_endpoint_or_list_or_edited_is_refused_naming_it(
    call, stuck_many, failed_many, what: str
) -> None:
    endpoint, _ = stuck_many
    route = {"endpointId": endpoint}
    token = call(f"endpoint_{what}", method="GET", params={"pageSize": "5"}, route_params=route).json[
        "continuationToken"
    ]
    other = "overdue" if what == "unconfirmed" else "unconfirmed"
    refused = [
        (what, {"endpointId": f"{endpoint}-other"}, token),
        (other, route, token),
        (what, route, edited(token)),
        (what, route, "%%%"),
    ]
    for name, where, bad in refused:
        answer = call(f"endpoint_{name}", method="GET", params={"continuationToken": bad}, route_params=where)
        assert answer.status == 400 and answer.json["field"] == "continuationToken", (name, answer.json)
    failed_token = call("failed_events", method="GET", params={"pageSize": "1"}).json["continuationToken"]
    answer = call(
        f"endpoint_{what}", method="GET", params={"continuationToken": failed_token}, route_params=route
    )
    assert answer.status == 400 and answer.json["field"] == "continuationToken"


# -- state records stuck in Processing past their lock ----------------------------------------------------


@pytest.fixture(scope="module")
def stuck_records(settle_tables: str, functions: dict[str, Any]) -> list[str]:
    """10,000 records whose lock expired while Processing: one real expired lock, its head and lock index
    row cloned under 10,000 item keys (the same expiry minute: one level-1 pointer)."""
    import time

    from management.records import _LOCK_COLUMN
    from state import service as state_service
    from state.keys import head_row_key
    from state.model import RecordKey, Scope
    from tests.conftest import Caller

    tag = uuid.uuid4().hex[:6]
    entity_id = int(tag, 16) % 1_000_000
    template = {
        "tenantId": 9,
        "scopeId": 4,
        "entityId": entity_id,
        "itemEntityKey": "invoice",
        "itemKey": "t",
    }
    assert Caller(functions)("state_lock", {"key": template, "lockSeconds": 1}).json["acquired"]
    store = state_service.store()
    head = store.read_head(RecordKey(9, Scope(4), entity_id, "invoice", "t"))
    assert head is not None
    pk, lock_row = str(head.entity["PartitionKey"]), str(head.entity[_LOCK_COLUMN])
    # cloned with a level-2 row each, as the code before ADR-0021 wrote them (still listed; a lock has no row
    # of its own any more, its entry is in its minute's marker)
    index = {"PartitionKey": pk}
    items = [f"stuck-{tag}-{n:05d}" for n in range(MANY)]
    rows = []
    for n, item in enumerate(items):
        row_key = head_row_key(RecordKey(9, Scope(4), entity_id, "invoice", item))
        lock = f"{lock_row.rsplit('|', 1)[0]}|{tag}{n:05d}"
        rows += [
            {**head.entity, "RowKey": row_key, _LOCK_COLUMN: lock},
            {**index, "RowKey": lock, "StateRK": row_key},
        ]
    by_partition = [rows[n : n + 100] for n in range(0, len(rows), 100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: store.table.submit_transaction([("upsert", r) for r in c]), by_partition))
    time.sleep(2)  # the locks expire by the latest the storage clock may read
    return ["t", *items]


@pytest.mark.slow  # 10,000 head reads: about 35 s with the seeding
def test_ten_thousand_stuck_records_are_each_listed_once_over_pages(call, stuck_records) -> None:
    pages = every_page(call, "records_stuck", 1000)
    listed = listed_once(pages, lambda r: (r["tenantId"], r["entityId"], r["itemKey"]))
    entity_id = next(e for t, e, i in listed if i.startswith("stuck-"))
    mine = sorted(i for t, e, i in listed if (t, e) == (9, entity_id))
    assert mine == sorted(stuck_records)
    assert all(p["count"] == len(p["items"]) for p in pages)


@pytest.mark.slow  # the same 10,000 records
def test_a_stuck_records_token_edited_or_of_another_list_is_refused_naming_it(call, stuck_records) -> None:
    token = call("records_stuck", method="GET", params={"pageSize": "3"}).json["continuationToken"]
    assert token
    failed = page_tokens.encode(page_tokens.binding("failed"), ["0", "Billing", "Failed"])  # another list's
    for bad in (edited(token), "%%%", failed):
        answer = call("records_stuck", method="GET", params={"continuationToken": bad})
        assert answer.status == 400 and answer.json["field"] == "continuationToken", answer.json


def test_an_events_token_of_another_filter_or_endpoint_is_refused_naming_it(call, failed_many) -> None:
    _, expected = failed_many
    endpoint, other = sorted({e for e, _ in expected})
    asked = {"status": "Failed", "pageSize": "5"}
    token = call("endpoint_events", method="GET", params=asked, route_params={"endpointId": endpoint}).json[
        "continuationToken"
    ]
    assert token, "a page of 5 of thousands says more follow"
    for where, params in (
        (endpoint, {**asked, "eventTypeId": "InvoiceCreated"}),  # another filter, the same range
        (other, asked),  # another endpoint
        (endpoint, {**asked, "status": "DeadLettered"}),
    ):
        answer = call(
            "endpoint_events",
            method="GET",
            params={**params, "continuationToken": token},
            route_params={"endpointId": where},
        )
        assert answer.status == 400 and answer.json["field"] == "continuationToken", (params, answer.json)
