"""Event listings from index rows (newest first, filters, paging) and poison list / replay."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.messages.contract import MessageType
from tests.support.handoff_flows import Flow, nimbus
from tests.support.operator_calls import _day, _poison_after_budget

from .conftest import a_second_apart, counts_partitions, principal_headers


def listing(call, endpoint: str, **params: str):
    return call("endpoint_events", method="GET", route_params={"endpointId": endpoint}, params=params)


def seed(resolve, endpoint: str) -> None:
    """e0 Pending, e1 parked, e2 Failed, e3 Completed (of another type): projected in that order, one
    second apart by the resolver's clock (the storage clock's estimate may step back by milliseconds)."""
    with a_second_apart(datetime.now(UTC) - timedelta(minutes=10)):
        _seed(resolve, endpoint)


def _seed(resolve, endpoint: str) -> None:
    for i in range(4):
        f = Flow(endpoint=endpoint, event_id=f"e{i}")
        kind = "Sales.OrderPlaced" if i == 3 else "Billing.InvoiceCreated"
        resolve(f.request(event_type=kind))
        if i == 1:
            resolve(f.park(event_type=kind))
        if i == 2:
            resolve(
                f.response(MessageType.ErrorResponse, message_id="err", error_text="boom", event_type=kind)
            )
        if i == 3:
            resolve(f.response(MessageType.ResolutionResponse, message_id="ok", event_type=kind))


def ids(result) -> list[str]:
    assert result.status == 200, result.body
    return [item["eventId"] for item in result.json["items"]]


def test_listing_is_newest_change_first_and_filters_by_status_and_type(call, resolve):
    endpoint = "List-" + uuid.uuid4().hex[:8]
    seed(resolve, endpoint)
    assert ids(listing(call, endpoint)) == ["e3", "e2", "e1", "e0"]
    assert ids(listing(call, endpoint, status="Pending")) == ["e1", "e0"]  # Pending includes hand-offs
    assert ids(listing(call, endpoint, status="PendingHandoff")) == ["e1"]
    assert ids(listing(call, endpoint, status="Failed")) == ["e2"]
    assert ids(listing(call, endpoint, eventTypeId="Sales.OrderPlaced")) == ["e3"]
    failed = listing(call, endpoint, status="Failed").json["items"][0]
    assert failed["reason"] == "boom" and failed["resolutionStatus"] == "Failed"


def test_a_listing_by_status_alone_carries_the_overview_count_of_that_status(call, resolve):
    endpoint = "Count-" + uuid.uuid4().hex[:8]
    seed(resolve, endpoint)
    overview = call("endpoints_overview", method="GET").json
    counts = next(i for i in overview["items"] if i["endpointId"] == endpoint)["counts"]
    for status, key in (("Pending", "pending"), ("PendingHandoff", "pendingHandoff"), ("Failed", "failed")):
        page = listing(call, endpoint, status=status, pageSize="1")
        assert page.json["count"] == counts[key] == len(ids(listing(call, endpoint, status=status)))
    assert listing(call, endpoint, status="Skipped").json["count"] == 0
    token = listing(call, endpoint, status="Pending", pageSize="1").json["continuationToken"]
    later = listing(call, endpoint, status="Pending", pageSize="1", continuationToken=token)
    assert ids(later) == ["e0"] and later.json["count"] is None  # counted once, with the first page
    # Nothing counted where the count would not be the listing's: no status, or another filter too
    assert listing(call, endpoint).json["count"] is None
    assert listing(call, endpoint, status="Failed", eventTypeId="Sales.OrderPlaced").json["count"] is None


def test_listing_pages_with_a_continuation_token_it_checks(call, resolve):
    endpoint = "Page-" + uuid.uuid4().hex[:8]
    seed(resolve, endpoint)
    first = listing(call, endpoint, pageSize="3")
    assert ids(first) == ["e3", "e2", "e1"]
    token = first.json["continuationToken"]
    second = listing(call, endpoint, pageSize="3", continuationToken=token)
    assert ids(second) == ["e0"] and second.json["continuationToken"] is None
    # A token of the all-events listing cannot position a Failed listing (it lies outside its range)
    bad = listing(call, endpoint, status="Failed", continuationToken=token)
    assert bad.status == 400 and bad.json["field"] == "continuationToken"
    assert listing(call, endpoint, continuationToken="garbage!").status == 400


def test_listing_filters_by_time_and_reads_one_page(call, resolve, handoff_shards: int):
    endpoint = "Time-" + uuid.uuid4().hex[:8]
    seed(resolve, endpoint)
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    assert ids(listing(call, endpoint, **{"from": future})) == []
    with ROUND_TRIPS.measure() as tally:
        assert ids(listing(call, endpoint, status="Failed", eventTypeId="Billing.InvoiceCreated")) == ["e2"]
    assert tally.requests == handoff_shards  # one page per shard, merged newest first
    # By status alone the first page also counts them: an open status's rows, keys only, once per shard
    with ROUND_TRIPS.measure() as tally:
        assert listing(call, endpoint, status="Failed").json["count"] == 1
    assert tally.requests == handoff_shards + handoff_shards
    # a tallied status's count: the counts' snapshot and deltas, then its ETag
    with ROUND_TRIPS.measure() as tally:
        assert listing(call, endpoint, status="Completed").json["count"] == 1
    assert tally.requests == handoff_shards + 2 * counts_partitions(handoff_shards)
    # all events: every status's range, merged newest change first
    with ROUND_TRIPS.measure() as tally:
        assert ids(listing(call, endpoint)) == ["e3", "e2", "e1", "e0"]
    assert tally.requests == 7 * handoff_shards
    assert listing(call, endpoint, status="Bogus").status == 400
    assert listing(call, endpoint, to="yesterday").json["field"] == "to"


def test_the_overview_lists_counts_ages_and_poison_per_endpoint(call, resolve):
    endpoint = "Over-" + uuid.uuid4().hex[:8]
    seed(resolve, endpoint)
    result = call("endpoints_overview", method="GET")
    assert result.status == 200, result.body
    [item] = [i for i in result.json["items"] if i["endpointId"] == endpoint]
    assert item["counts"] == {
        "pending": 2,
        "pendingHandoff": 1,
        "deferred": 0,
        "failed": 1,
        "deadLettered": 0,
        "unsupported": 0,
        "completed": 1,
        "skipped": 0,
        # every open status's rows were read: no count stopped at the cap
        "pendingAtLeast": False,
        "pendingHandoffAtLeast": False,
        "deferredAtLeast": False,
        "failedAtLeast": False,
        "deadLetteredAtLeast": False,
        "unsupportedAtLeast": False,
    }
    assert item["oldestPendingAt"] is not None and item["oldestFailedAt"] is not None
    assert not item["oldestPendingAtLeast"] and not item["oldestFailedAtLeast"]
    assert item["poison"] == 0


def test_poison_is_listed_by_day_replayed_once_and_uncounted(call, flow, monkeypatch):
    resolver = service.resolver_service()
    resolver.redelivery = lambda: None
    msg = _poison_after_budget(resolver, flow, monkeypatch)
    day = _day(msg)
    page = call("poison_list", method="GET", params={"day": day, "pageSize": "200"})
    assert page.status == 200
    [entry] = [p for p in page.json["items"] if p["messageId"] == msg.message_id]
    assert entry["reason"].startswith("retry budget exhausted") and entry["endpointId"] == flow.endpoint
    assert service.overview().counts(flow.endpoint)["Poison"] == 1

    replay = call("poison_replay", {"by": "olivia"}, route_params={"day": day, "id": entry["id"]})
    assert replay.status == 200, replay.body
    assert replay.json["outcome"] == "applied"
    assert replay.json["poison"]["replayedBy"] == "olivia" and replay.json["poison"]["replayCount"] == 1
    assert service.store().get_event(flow.endpoint, flow.event_id) is not None
    assert service.overview().counts(flow.endpoint)["Poison"] == 0
    again = call("poison_replay", {"by": "olivia"}, route_params={"day": day, "id": entry["id"]})
    assert again.status == 409 and again.json["type"] == "urn:settle:problem:already-replayed"


def test_a_replay_that_is_still_poison_says_why_and_may_be_replayed_later(call, resolve, flow):
    msg = nimbus("Bogus", endpoint=flow.endpoint, event_id=flow.event_id)
    resolve(msg)
    day = _day(msg)
    [entry] = [
        p
        for p in call("poison_list", method="GET", params={"day": day, "pageSize": "200"}).json["items"]
        if p["messageId"] == msg.message_id
    ]
    first = call("poison_replay", route_params={"day": day, "id": entry["id"]})
    assert first.status == 200 and first.json["outcome"] == "poisoned"
    assert "Unknown MessageType" in first.json["detail"]
    assert call("poison_replay", route_params={"day": day, "id": entry["id"]}).status == 200
    assert service.overview().counts(flow.endpoint)["Poison"] == 1  # still poison, still counted


def test_a_replay_by_a_principal_without_the_role_is_403(call, resolve, flow):
    msg = nimbus("Bogus", endpoint=flow.endpoint, event_id=flow.event_id)
    resolve(msg)
    day = _day(msg)
    items = call("poison_list", method="GET", params={"day": day, "pageSize": "200"}).json["items"]
    [entry] = [p for p in items if p["messageId"] == msg.message_id]
    denied = call(
        "poison_replay", route_params={"day": day, "id": entry["id"]}, headers=principal_headers("mallory")
    )
    assert denied.status == 403
    assert call("poison_list", method="GET", params={"day": "2026-12-01"}).json["field"] == "day"
    assert call("poison_replay", route_params={"day": day, "id": "nope"}).status == 404


def test_one_event_for_operators_is_one_read_with_its_actions_and_payload(call, resolve):
    endpoint = "One-" + uuid.uuid4().hex[:8]
    seed(resolve, endpoint)
    with ROUND_TRIPS.measure() as tally:
        failed = call("endpoint_event", method="GET", route_params={"endpointId": endpoint, "eventId": "e2"})
    assert failed.status == 200 and tally.requests == 1
    assert failed.json["actions"] == ["resubmit", "skip"]
    assert failed.json["eventJson"] == '{"invoice": 42}'
    assert [h["messageType"] for h in failed.json["history"]] == ["EventRequest", "ErrorResponse"]
    unknown = call("endpoint_event", method="GET", route_params={"endpointId": endpoint, "eventId": "nope"})
    assert unknown.status == 404


def test_the_overview_costs_one_read_plus_seven_per_endpoint_plus_two(
    call, resolve, fresh_tables, handoff_shards: int
):
    seed(resolve, "Alpha")
    seed(resolve, "Beta")
    with ROUND_TRIPS.measure() as tally:
        result = call("endpoints_overview", method="GET")
    assert [i["endpointId"] for i in result.json["items"]] == ["Alpha", "Beta"]
    # the endpoint list; per endpoint: the tallies (range read + ETag check per counted partition), and per
    # shard the open events' rows (three ranges, keys only: counts and oldest ages) and the unconfirmed /
    # overdue index ranges; the unattributed poison counts. Unsharded (S = 1): 1 + 7 per endpoint + 2.
    per_endpoint = 2 * counts_partitions(handoff_shards) + 5 * handoff_shards
    assert tally.requests == 1 + per_endpoint * 2 + 2


def test_poison_for_an_endpoint_that_never_projected_is_on_the_overview(call, resolve):
    # Given the first message the resolver ever sees for an endpoint is poison (a MessageType typo)
    endpoint = "New-" + uuid.uuid4().hex[:8]
    resolve(nimbus("EventRequested", endpoint=endpoint, event_id="e-first"))
    # Then the overview lists that endpoint with its poison (not only endpoints that projected a row)
    result = call("endpoints_overview", method="GET")
    assert result.status == 200, result.body
    [item] = [i for i in result.json["items"] if i["endpointId"] == endpoint]
    assert item["poison"] == 1 and item["counts"]["pending"] == 0


def test_the_overview_says_which_day_the_oldest_unresolved_poison_is_on(call, resolve):
    # Given poison from three days ago (the poison page lists one UTC day at a time)
    endpoint = "Old-" + uuid.uuid4().hex[:8]
    then = datetime.now(UTC) - timedelta(days=3)
    resolve(nimbus("EventRequested", endpoint=endpoint, event_id="e-old", enqueued=then))
    resolve(nimbus("EventRequested", endpoint=endpoint, event_id="e-new"))
    # Then the overview names that day, so the console's poison badge opens the right page
    [item] = [
        i for i in call("endpoints_overview", method="GET").json["items"] if i["endpointId"] == endpoint
    ]
    assert item["poison"] == 2 and item["oldestPoisonDay"] == then.strftime("%Y%m%d")
    quiet = "Quiet-" + uuid.uuid4().hex[:8]
    resolve(Flow(endpoint=quiet, event_id="e1").request())
    [item] = [i for i in call("endpoints_overview", method="GET").json["items"] if i["endpointId"] == quiet]
    assert item["poison"] == 0 and item["oldestPoisonDay"] is None


def test_a_day_of_poison_pages_with_a_continuation_token(call, resolve):
    endpoint = "Pages-" + uuid.uuid4().hex[:8]
    mine = set()
    for i in range(5):
        msg = nimbus("EventRequested", endpoint=endpoint, event_id=f"e{i}")
        resolve(msg)
        mine.add(msg.message_id)
        day = _day(msg)
    seen: list[str] = []
    params = {"day": day, "pageSize": "2"}
    for _ in range(200):
        page = call("poison_list", method="GET", params=params)
        assert page.status == 200, page.body
        assert len(page.json["items"]) <= 2
        seen += [p["messageId"] for p in page.json["items"] if p["endpointId"] == endpoint]
        if page.json["continuationToken"] is None:
            break
        params = {**params, "continuationToken": page.json["continuationToken"]}
    assert sorted(seen) == sorted(mine)  # every one, once


def test_a_page_size_or_day_of_unicode_digits_is_a_400_naming_the_field(call):
    # "²", "١٢" and "①" are digits to str.isdigit, but int() refuses them: never a 500 (the fuzzer found it)
    for raw in ("²", "١٢", "1²"):
        page = call("poison_list", method="GET", params={"day": "20261202", "pageSize": raw})
        assert page.status == 400 and page.json["field"] == "pageSize", (raw, page.status, page.body)
        events = listing(call, "Billing", pageSize=raw)
        assert events.status == 400 and events.json["field"] == "pageSize", (raw, events.status)
    fullwidth = "".join(chr(0xFF10 + int(c)) for c in "20261202")  # the same date in fullwidth digits
    day = call("poison_list", method="GET", params={"day": fullwidth})
    assert day.status == 400 and day.json["field"] == "day", (day.status, day.body)
