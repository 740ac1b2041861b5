"""Exact counts without scans: deltas in the projection's transaction, folded into a snapshot."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.messages.contract import MessageType
from handoff.storage import keys
from handoff.storage import overview as overview_module
from handoff.storage.counts import Capped
from tests.support.handoff_flows import Flow, nimbus

from .conftest import a_second_apart, counted, counts_partitions, event_statuses, listing_rows, recount


def test_counts_follow_every_transition_of_an_event(resolve, flow: Flow):
    resolve(flow.request())
    assert counted(flow.endpoint)["Pending"] == 1
    resolve(flow.park())
    c = counted(flow.endpoint)
    assert (c["Pending"], c["PendingHandoff"]) == (1, 1)
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    c = counted(flow.endpoint)
    assert (c["Pending"], c["PendingHandoff"], c["Failed"]) == (0, 0, 1)
    resolve(flow.control(MessageType.ResubmissionRequest, message_id="rs-1", parent="err-1"))
    resolve(flow.response(MessageType.ResolutionResponse, message_id="ok-1", parent="rs-1"))
    assert counted(flow.endpoint) == recount(flow.endpoint)
    assert counted(flow.endpoint)["Completed"] == 1


def test_a_duplicate_or_a_refused_stale_copy_counts_nothing(resolve, flow: Flow):
    resolve(flow.request())
    resolve(flow.response(MessageType.ResolutionResponse, message_id="ok-1"))
    resolve(flow.request())  # duplicate of req-1: refused by Spec 030 (the row already holds its outcome)
    resolve(flow.response(MessageType.ResolutionResponse, message_id="ok-1"))  # exact duplicate
    assert counted(flow.endpoint) == recount(flow.endpoint)
    assert counted(flow.endpoint)["Completed"] == 1 and counted(flow.endpoint)["Pending"] == 0


def test_counts_stay_exact_when_projections_and_folds_race(resolve):
    # Given one endpoint, 24 events, and every message of each event delivered twice, from 6 threads at
    # once (duplicates, lost ETag races and concurrent folds all happen)
    endpoint = "Race-" + uuid.uuid4().hex[:8]
    flows = [Flow(endpoint=endpoint, event_id=f"ev-{i}") for i in range(24)]
    plans: list[list[Any]] = []
    for i, f in enumerate(flows):
        steps = [f.request()]
        if i % 3 == 0:
            steps.append(f.park(message_id=f"park-{i}"))
        if i % 2 == 0:
            steps.append(f.response(MessageType.ErrorResponse, message_id=f"err-{i}", error_text="x"))
        if i % 4 == 0:
            steps.append(f.response(MessageType.ResolutionResponse, message_id=f"ok-{i}"))
        plans.append(steps)
    overview = service.overview()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for steps in plans[seed::6]:
                for msg in steps:
                    resolve(msg)
                    if rng.random() < 0.3:
                        resolve(msg)  # a redelivery
                if rng.random() < 0.5:
                    overview.fold(endpoint)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    # Then the counts equal a recount of the event rows, before and after folding everything
    assert counted(endpoint) == recount(endpoint)
    while overview.fold(endpoint):
        pass
    assert counted(endpoint) == recount(endpoint)
    assert sum(counted(endpoint)[b] for b in ("Pending", "Failed", "Completed")) == 24
    # And every event is listed exactly once, under the status its row holds (ADR-0022: one listing row)
    assert listing_rows(endpoint) == {event: [status] for event, status in event_statuses(endpoint).items()}


def test_a_fold_that_loses_its_race_changes_nothing(resolve, flow: Flow):
    for i in range(5):
        resolve(
            nimbus(
                MessageType.ResolutionResponse, endpoint=flow.endpoint, event_id=f"e{i}", message_id=f"r{i}"
            )
        )
    overview = service.overview()
    pk = keys.partition(flow.endpoint)
    stale = overview.read_counts(pk)
    assert overview.fold(flow.endpoint) == 5  # another instance folds first
    assert overview._fold(pk, stale) == 0  # our fold, from the read before, loses and writes nothing
    assert counted(flow.endpoint)["Completed"] == 5


def test_reading_the_counts_costs_two_round_trips_per_tally_and_three_per_shard(
    resolve, flow: Flow, handoff_shards: int
):
    resolve(flow.request())
    with ROUND_TRIPS.measure() as tally:
        service.overview().counts(flow.endpoint)
    # per partition tallied: one range read (snapshot + deltas) and the snapshot's ETag check; per shard
    # the open events' listing rows, keys only, in three ranges (DeadLettered..Failed, Pending, Unsupported)
    assert tally.requests == 2 * counts_partitions(handoff_shards) + 3 * handoff_shards


def test_open_counts_and_ages_are_read_from_the_open_events_rows(resolve, flow: Flow, handoff_shards: int):
    # Given events in every open status but Unsupported, one parked, one completed, in that order
    endpoint = flow.endpoint
    with a_second_apart(datetime.now(UTC) - timedelta(hours=2)):
        resolve(nimbus(MessageType.EventRequest, endpoint=endpoint, event_id="p", message_id="p1"))
        resolve(nimbus(MessageType.EventRequest, endpoint=endpoint, event_id="h", message_id="h1"))
        park = MessageType.PendingHandoffResponse
        resolve(nimbus(park, endpoint=endpoint, event_id="h", message_id="h2", parent="h1"))
        resolve(nimbus(MessageType.ErrorResponse, endpoint=endpoint, event_id="f", message_id="f1"))
        resolve(nimbus(MessageType.DeferralResponse, endpoint=endpoint, event_id="d", message_id="d1"))
        resolve(nimbus(MessageType.ResolutionResponse, endpoint=endpoint, event_id="c", message_id="c1"))
    overview = service.overview()

    # When the open events are read
    found = overview.open_events(endpoint)

    # Then each open status counts its rows, the parked one also in PendingHandoff, and the ages are the
    # earliest times an event entered Pending / failed
    assert found.totals == {
        "Pending": 2,
        "PendingHandoff": 1,
        "Deferred": 1,
        "Failed": 1,
        "DeadLettered": 0,
        "Unsupported": 0,
    }
    assert found.oldest_pending_at is not None and found.oldest_failed_at is not None
    assert found.oldest_pending_at < found.oldest_failed_at
    assert counted(endpoint) == recount(endpoint)
    # And one status's count reads only its own range
    with ROUND_TRIPS.measure() as tally:
        assert overview.count(endpoint, "PendingHandoff") == Capped(1, at_least=False)
    assert tally.requests == handoff_shards


def test_a_projection_that_fails_writes_no_delta(resolve, flow: Flow, monkeypatch):

    resolve(flow.request())
    resolver = service.resolver_service()
    original = resolver.store.submit
    calls = {"n": 0}

    def conflict_once(ops):
        calls["n"] += 1
        if calls["n"] == 1:
            # another writer changed the event row between our read and our write: the transaction fails
            # whole (412 on the event row), so its delta must not exist either
            event = ops[1][1]
            changed = {"PartitionKey": event["PartitionKey"], "RowKey": event["RowKey"], "Reason": "another"}
            original([("update", changed, {})])
        return original(ops)

    monkeypatch.setattr(resolver.store, "submit", conflict_once)
    resolve(flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="boom"))
    assert calls["n"] == 2  # the first transaction failed whole and the projection was decided again
    assert counted(flow.endpoint) == recount(flow.endpoint)
    assert counted(flow.endpoint)["Failed"] == 1 and counted(flow.endpoint)["Pending"] == 0


def test_a_fold_during_a_paged_read_of_a_count_makes_it_read_again(resolve, flow: Flow, monkeypatch):
    # Given a snapshot of 3 and 2 newer deltas (Completed: a tallied bucket)
    for i in range(3):
        resolve(
            nimbus(
                MessageType.ResolutionResponse, endpoint=flow.endpoint, event_id=f"e{i}", message_id=f"r{i}"
            )
        )
    overview = service.overview()
    assert overview.fold(flow.endpoint) == 3
    for i in range(3, 5):
        resolve(
            nimbus(
                MessageType.ResolutionResponse, endpoint=flow.endpoint, event_id=f"e{i}", message_id=f"r{i}"
            )
        )
    original = overview._range
    folded = {"done": False}

    def paged_with_a_fold_between(pk, low, high, **kw):
        # The range read returns the snapshot (first page), then another instance folds, then the read
        # continues (next page): the deltas it would have counted are gone, folded into a newer snapshot.
        rows = iter(original(pk, low, high, results_per_page=1))
        first = next(rows, None)
        if first is not None and not folded["done"] and low == keys.COUNTS_RANGE[0]:
            folded["done"] = True
            assert service.overview().fold(flow.endpoint) == 2
        return iter(([first] if first is not None else []) + list(rows))

    monkeypatch.setattr(overview, "_range", paged_with_a_fold_between)
    # When the counts are read across that fold, Then they are still exact (the snapshot's ETag changed)
    assert overview.counts(flow.endpoint)["Completed"] == 5
    assert folded["done"]


def test_counts_stay_exact_when_operator_actions_race_projections_replays_and_folds(
    call, resolve, transport, monkeypatch
):
    # Given one endpoint with 18 failed events and 4 poison messages (2 replayable, 2 that stay poison)
    from handoff.storage import overview as overview_module
    from tests.support.operator_calls import _day, _poison_after_budget

    endpoint = "Ops-" + uuid.uuid4().hex[:8]
    resolver = service.resolver_service()
    resolver.redelivery = lambda: None
    poison = []
    for i in range(2):
        msg = _poison_after_budget(resolver, Flow(endpoint=endpoint, event_id=f"pz-{i}"), monkeypatch)
        poison.append(msg)
    for i in range(2):
        msg = nimbus("Bogus", endpoint=endpoint, event_id=f"bogus-{i}", message_id=f"bogus-{i}")
        resolve(msg)
        poison.append(msg)
    day = _day(poison[0])
    listed = call("poison_list", method="GET", params={"day": day, "pageSize": "200"}).json["items"]
    poison_ids = [p["id"] for p in listed if p["endpointId"] == endpoint]
    assert len(poison_ids) == 4
    flows = [Flow(endpoint=endpoint, event_id=f"ev-{i}") for i in range(18)]
    for f in flows:
        resolve(f.request())
        resolve(f.response(MessageType.ErrorResponse, message_id="err-1", error_text="ERP down"))
    # ... the operator's control messages reach the resolver as they are sent (the fan-out), and a reader
    # folds as soon as it meets 5 deltas
    transport.forward = True
    monkeypatch.setattr(overview_module, "FOLD_WHEN", 5)
    overview = service.overview()
    route = {"endpointId": endpoint}
    errors: list[BaseException] = []

    def act(name: str, body: dict[str, Any], f: Flow, dup: bool) -> Any:
        ev = {**route, "eventId": f.event_id}
        answer = call(name, body, route_params=ev)
        assert answer.status == 202, answer.body
        if dup:  # the operator's retry: answered from the claim, nothing sent again
            again = call(name, body, route_params=ev)
            assert again.status in (202, 409), again.body
            if again.status == 202:
                assert again.json["controlMessageId"] == answer.json["controlMessageId"]
        return answer.json["controlMessageId"]

    def operate(f: Flow, i: int) -> None:
        dup = i % 2 == 0
        if i % 3 == 0:  # resubmitted, then handled
            sent = act("event_resubmit", {"by": f"op-{i}"}, f, dup)
            resolve(f.response(MessageType.ResolutionResponse, message_id=f"ok-{i}", parent=sent))
        elif i % 3 == 1:  # skipped, then the subscriber's SkipResponse
            sent = act("event_skip", {"reason": "dup"}, f, dup)
            resolve(f.response(MessageType.SkipResponse, message_id=f"skip-{i}", parent=sent))
        else:  # resubmitted, parked again, completed from the console
            sent = act("event_resubmit", {}, f, dup)
            resolve(f.park(message_id=f"park-{i}", parent=sent))
            act("event_complete", {"result": "ok"}, f, dup)

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            for i in range(n, len(flows), 6):
                operate(flows[i], i)
                if rng.random() < 0.5:
                    overview.counts(endpoint)  # a reader (folds past FOLD_WHEN deltas)
                if rng.random() < 0.3:
                    overview.fold(endpoint)
            for pid in poison_ids[n % 4 :: 4] if n < 4 else poison_ids[(n - 4) :: 2]:
                replay = call("poison_replay", {"by": f"op-{n}"}, route_params={"day": day, "id": pid})
                assert replay.status in (200, 409), replay.body
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors

    # Then every count equals a recount of the rows, and poison equals the poison still unresolved
    def poison_rows() -> int:
        table = service.store().table(keys.EVENTS_TABLE)
        query = f"PartitionKey eq '{keys.partition(endpoint)}' and RowKey ge 'pz|' and RowKey lt 'pz}}'"
        return len(list(table.query_entities(query)))

    assert counted(endpoint) == recount(endpoint)
    assert overview.counts(endpoint)["Poison"] == poison_rows() == 2  # the Bogus ones stay poison
    while overview.fold(endpoint):
        pass
    assert counted(endpoint) == recount(endpoint)
    final = counted(endpoint)
    assert (final["Completed"], final["Skipped"], final["Failed"]) == (6, 6, 0)
    assert (final["Pending"], final["PendingHandoff"]) == (2 + 6, 0)  # replayed requests; completed hand-offs
    assert len(transport.sent) == 6 + 6 + 6 + 6  # one message per action, however many asked


# -- the open counts' cap (issue 46: every operator read keeps a bound) -----------------------------------

CAP = 3  # the test's cap per open status (production: overview.OPEN_COUNT_CAP, 10,000)
OPEN_LISTED = 5  # open statuses with listing rows: Pending, Deferred, Failed, DeadLettered, Unsupported


def seed_past_the_cap(resolve, endpoint: str, failed: int) -> None:
    """``failed`` Failed events, then p0 Pending, p1 parked and d Deferred, a second apart: the listing rows
    (newest change first) hold the newest failures first."""
    with a_second_apart(datetime.now(UTC) - timedelta(hours=2)):
        for i in range(failed):
            failure = nimbus(
                MessageType.ErrorResponse, endpoint=endpoint, event_id=f"f{i:03d}", message_id=f"f{i}"
            )
            resolve(failure)
        resolve(nimbus(MessageType.EventRequest, endpoint=endpoint, event_id="p0", message_id="p0"))
        resolve(nimbus(MessageType.EventRequest, endpoint=endpoint, event_id="p1", message_id="p1"))
        park = MessageType.PendingHandoffResponse
        resolve(nimbus(park, endpoint=endpoint, event_id="p1", message_id="p1-park", parent="p1"))
        resolve(nimbus(MessageType.DeferralResponse, endpoint=endpoint, event_id="d", message_id="d"))


def test_open_counts_stop_at_the_cap_say_at_least_and_read_a_bounded_number_of_pages(
    resolve, handoff_shards: int, monkeypatch: pytest.MonkeyPatch
):
    # Given an endpoint with 80 Failed events, 2 Pending (one parked) and 1 Deferred, and exact figures read
    # with the production cap
    endpoint = "Capped-" + uuid.uuid4().hex[:8]
    seed_past_the_cap(resolve, endpoint, failed=80)
    exact = service.overview().open_events(endpoint)
    assert exact.totals["Failed"] == 80 and exact.at_least == frozenset()
    # And a cap of 3 rows per open status, read one row a page (so the pages read are the rows read)
    monkeypatch.setattr(overview_module, "OPEN_COUNT_CAP", CAP)
    monkeypatch.setattr(overview_module, "OPEN_PAGE", 1)

    # When the open events are read
    with ROUND_TRIPS.measure() as tally:
        found = service.overview().open_events(endpoint)

    # Then Failed counts the cap and says "at least"; the statuses below it are exact and say so
    assert found.totals == {
        "Pending": 2,
        "PendingHandoff": 1,
        "Deferred": 1,
        "Failed": CAP,
        "DeadLettered": 0,
        "Unsupported": 0,
    }
    assert found.at_least == {"Failed"}
    # And the oldest failure is the oldest of those read (the newest ones), flagged: the oldest is older
    assert found.oldest_failed_at_least and not found.oldest_pending_at_least
    assert exact.oldest_failed_at is not None and found.oldest_failed_at is not None
    assert found.oldest_failed_at > exact.oldest_failed_at
    assert found.oldest_pending_at == exact.oldest_pending_at
    # And the read is bounded by the cap, not by the 80 rows: a query per range and shard, one more per
    # status that fills, each at most a page beyond its rows (the module docstring's bound)
    bound = OPEN_LISTED * CAP + 10 * handoff_shards + 10
    assert tally.requests <= bound < 80, tally.methods

    # When one status's count is read (a listing's first page), Then it stops at the cap the same way
    with ROUND_TRIPS.measure() as tally:
        assert service.overview().count(endpoint, "Failed") == Capped(CAP, at_least=True)
        assert service.overview().count(endpoint, "Pending") == Capped(2, at_least=False)
    assert tally.requests <= 2 * CAP + 4 * (handoff_shards + 1), tally.methods


def test_a_pending_count_at_the_cap_says_at_least_for_its_hand_offs_too(
    resolve, monkeypatch: pytest.MonkeyPatch
):
    # Given 2 Pending events (one parked) and a cap of 2
    endpoint = "CappedPending-" + uuid.uuid4().hex[:8]
    seed_past_the_cap(resolve, endpoint, failed=0)
    monkeypatch.setattr(overview_module, "OPEN_COUNT_CAP", 2)
    # When the open events are read, Then Pending reached the cap: it and its hand-off subset say "at least",
    # and so does the oldest pending age
    found = service.overview().open_events(endpoint)
    assert (found.totals["Pending"], found.totals["PendingHandoff"]) == (2, 1)
    assert found.at_least == {"Pending", "PendingHandoff"} and found.oldest_pending_at_least
    assert not found.oldest_failed_at_least


def test_the_api_says_which_open_counts_stopped_at_the_cap(call, resolve, monkeypatch: pytest.MonkeyPatch):
    # Given an endpoint with 5 Failed events, 2 Pending (one parked), 1 Deferred, and a cap of 3
    endpoint = "CappedApi-" + uuid.uuid4().hex[:8]
    seed_past_the_cap(resolve, endpoint, failed=5)
    monkeypatch.setattr(overview_module, "OPEN_COUNT_CAP", CAP)

    # When the overview is asked for, Then failed is 3 "at least", and so is the oldest failure; the rest
    # are exact (false)
    items = call("endpoints_overview", method="GET").json["items"]
    [item] = [i for i in items if i["endpointId"] == endpoint]
    assert item["counts"] == {
        "pending": 2,
        "pendingHandoff": 1,
        "deferred": 1,
        "failed": CAP,
        "deadLettered": 0,
        "unsupported": 0,
        "completed": 0,
        "skipped": 0,
        "pendingAtLeast": False,
        "pendingHandoffAtLeast": False,
        "deferredAtLeast": False,
        "failedAtLeast": True,
        "deadLetteredAtLeast": False,
        "unsupportedAtLeast": False,
    }
    assert (item["oldestFailedAtLeast"], item["oldestPendingAtLeast"]) == (True, False)

    # And a listing's first page by status carries the same count and says whether it stopped there
    def first_page(status: str) -> Any:
        answer = call(
            "endpoint_events",
            method="GET",
            route_params={"endpointId": endpoint},
            params={"status": status, "pageSize": "1"},
        )
        assert answer.status == 200, answer.body
        return answer.json

    assert (first_page("Failed")["count"], first_page("Failed")["atLeast"]) == (CAP, True)
    for status, count in (("Pending", 2), ("PendingHandoff", 1), ("Deferred", 1), ("Completed", 0)):
        assert (first_page(status)["count"], first_page(status)["atLeast"]) == (count, False), status
