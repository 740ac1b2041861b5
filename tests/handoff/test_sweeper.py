"""The timeout sweeper: exactly once, through every due row, surviving a failing endpoint."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.data.tables import UpdateMode
from azure.functions.timer import TimerRequest

from common import runtime
from common.clock import utcnow
from common.roundtrips import ROUND_TRIPS
from common.tables import quoted
from handoff import service
from handoff.storage import keys
from handoff.storage.records import ExpiryRow
from handoff.timers.sweeper import Sweeper
from tests.support.handoff_flows import Flow, event_of, receive

from .broker import Broker, BrokerTransport


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")


def overdue(resolve, flow: Flow, minutes: float = 1) -> None:
    resolve(flow.request())
    resolve(flow.park(expected_by=iso(datetime.now(UTC) - timedelta(minutes=minutes))))


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield Broker(forward=True)


@pytest.fixture
def bus(fresh_tables: str, broker: Broker) -> Iterator[BrokerTransport]:
    transport = BrokerTransport(broker)
    service.use_transport(transport)
    yield transport
    service.reset()


def sent_to(broker: Broker, flow: Flow) -> list[Any]:
    return broker.for_event(flow.event_id)


def test_an_overdue_handoff_is_failed_once_with_timeout_expired(
    call, resolve, flow, broker, bus, monkeypatch
):
    # Given one overdue and one not-yet-due hand-off
    overdue(resolve, flow)
    due_later = Flow(endpoint=flow.endpoint, event_id=flow.event_id + "-later")
    resolve(due_later.request())
    resolve(due_later.park(expected_by=iso(datetime.now(UTC) + timedelta(hours=1))))
    monkeypatch.setenv("HANDOFF_SWEEPER_ENABLED", "true")
    timer = call.functions["handoff_sweeper"].get_user_function()
    # When the timer fires twice
    timer(TimerRequest(past_due=False))
    timer(TimerRequest(past_due=False))
    # Then exactly one HandoffFailedRequest reached the endpoint, for the overdue event
    [copy] = sent_to(broker, flow)
    assert sent_to(broker, due_later) == []
    error = json.loads(copy.body)["ErrorContent"]
    assert error["ErrorType"] == "TimeoutExpired" and "ExpectedBy" in error["ErrorText"]
    [audit] = event_of(call, flow)["audits"]
    assert (audit["auditType"], audit["auditorName"]) == ("FailHandoff", "Sweeper")
    assert event_of(call, flow)["pendingSubStatus"] is None


def rows_of(flow: Flow, prefix: str) -> list[dict[str, Any]]:
    """The rows of ``flow``'s event partition whose key starts with ``prefix`` (``hq|``, ``ex|``)."""
    store = service.store()
    pk = store.event_partition(flow.endpoint, flow.event_id)
    low, high = quoted(prefix), quoted(prefix + "~")
    query = f"PartitionKey eq {quoted(pk)} and RowKey ge {low} and RowKey lt {high}"
    return [dict(e) for e in store.table(keys.EVENTS_TABLE).query_entities(query)]


def test_a_due_park_is_found_through_its_queue_row_and_failed_exactly_once(call, resolve, flow, broker, bus):
    # Given an overdue park: its queue row carries its ExpectedBy, and no expiry row was written (ADR-0022)
    overdue(resolve, flow)
    [queued] = rows_of(flow, "hq|")
    assert queued["ExpectedBy"] < datetime.now(UTC) and rows_of(flow, "ex|") == []
    assert service.store().count_due(flow.endpoint, utcnow(), cap=10) == 1
    # When the sweeper runs twice
    first, second = service.sweeper().sweep(), service.sweeper().sweep()
    # Then it failed the park once, through the settlement path, and the park ended
    assert flow.event_id in first.failed and flow.event_id not in second.failed + second.skipped
    [copy] = sent_to(broker, flow)
    assert json.loads(copy.body)["ErrorContent"]["ErrorType"] == "TimeoutExpired"
    assert rows_of(flow, "hq|") == [] and service.store().count_due(flow.endpoint, utcnow(), cap=10) == 0


def as_before_change_5(flow: Flow) -> str:
    """Rewrite ``flow``'s park as the code before ADR-0022 change 5 wrote it: an ``ex|`` row, its key on
    the event row (``ExpiryKey``), no ExpectedBy on the queue row. Returns the ``ex|`` key."""
    store = service.store()
    table = store.table(keys.EVENTS_TABLE)
    pk = store.event_partition(flow.endpoint, flow.event_id)
    row = store.get_event(flow.endpoint, flow.event_id)
    assert row is not None and row.expected_by is not None and row.queue_key is not None
    expiry = keys.expiry_row(row.expected_by, flow.event_id)
    table.create_entity(ExpiryRow(event_id=flow.event_id, expected_by=row.expected_by).to_entity(pk, expiry))
    event_key = {"PartitionKey": pk, "RowKey": keys.event_row(flow.event_id)}
    table.update_entity({**event_key, "ExpiryKey": expiry}, mode=UpdateMode.MERGE)
    queued = dict(table.get_entity(pk, row.queue_key))
    del queued["ExpectedBy"]
    table.update_entity(queued, mode=UpdateMode.REPLACE)
    return expiry


def test_a_park_from_before_is_found_through_its_expiry_row_and_the_row_goes_when_the_park_ends(
    call, resolve, flow, broker, bus
):
    # Given an overdue park written as before ADR-0022 change 5 (an ex| row, none on the queue row)
    overdue(resolve, flow)
    expiry = as_before_change_5(flow)
    assert [r["RowKey"] for r in rows_of(flow, "ex|")] == [expiry]
    assert "ExpectedBy" not in rows_of(flow, "hq|")[0]
    # Then the overdue listing and its count show it once
    listed = call("endpoint_overdue", method="GET", route_params={"endpointId": flow.endpoint}).json
    assert [i["eventId"] for i in listed["items"]] == [flow.event_id] and listed["count"] == 1
    # And the sweeper fails it once
    first, second = service.sweeper().sweep(), service.sweeper().sweep()
    assert flow.event_id in first.failed and flow.event_id not in second.failed
    assert len(sent_to(broker, flow)) == 1
    # And the failure's projection ended the park: its ex| row deleted with its queue row
    assert rows_of(flow, "ex|") == [] and rows_of(flow, "hq|") == []
    assert event_of(call, flow)["pendingSubStatus"] is None


def test_a_leased_park_keeps_its_expected_by_and_is_still_found(call, resolve, flow, broker, bus):
    # Given an overdue park leased by an agent (the lease merges its columns into the queue row)
    overdue(resolve, flow)
    leased = receive(call, flow.endpoint)
    assert leased.status == 200 and leased.json["lease"]["token"], leased.body
    [queued] = rows_of(flow, "hq|")
    assert queued["LeaseToken"] == leased.json["lease"]["token"] and queued["ExpectedBy"] < datetime.now(UTC)
    # Then the sweeper finds it and fails it (a settlement without the token keeps today's rules)
    assert flow.event_id in service.sweeper().sweep().failed
    assert len(sent_to(broker, flow)) == 1


def test_a_tick_reads_the_parked_hand_offs_of_each_shard_once(call, resolve, flow, broker, bus):
    # Given an endpoint with parks not yet due, parks without ExpectedBy, and two overdue ones
    for i in range(6):
        later = Flow(endpoint=flow.endpoint, event_id=f"{flow.event_id}-later-{i}")
        resolve(later.request())
        expected_by = iso(datetime.now(UTC) + timedelta(hours=1)) if i % 2 else None
        resolve(later.park(expected_by=expected_by))
    due = [Flow(endpoint=flow.endpoint, event_id=f"{flow.event_id}-due-{i}") for i in range(2)]
    for d in due:
        overdue(resolve, d)
    store, shards = service.store(), service.layout().now().shards
    # When the due parks are read and counted
    with ROUND_TRIPS.measure() as read:
        found = store.expired(flow.endpoint, utcnow())
    with ROUND_TRIPS.measure() as counted:
        count = store.count_due(flow.endpoint, utcnow(), cap=1000)
    # Then each is one filtered query per shard, and finds exactly the due ones
    assert sorted(str(e["EventId"]) for e in found) == sorted(d.event_id for d in due) and count == 2
    assert (read.requests, counted.requests) == (shards, shards), (read.methods, counted.methods)


def test_the_sweeper_does_nothing_unless_enabled(call, resolve, flow, broker, bus, monkeypatch):
    overdue(resolve, flow)
    monkeypatch.delenv("HANDOFF_SWEEPER_ENABLED", raising=False)
    call.functions["handoff_sweeper"].get_user_function()(TimerRequest(past_due=False))
    assert sent_to(broker, flow) == []


class LoseAnswer(SansIOHTTPPolicy[Any, Any]):
    """The next ``$batch`` of the arming thread is applied, and then its answer is lost."""

    def __init__(self) -> None:
        self.armed = 0
        self.fail_reads = 0

    def on_request(self, request: Any) -> None:
        if self.fail_reads and request.http_request.method == "GET":
            self.fail_reads -= 1
            raise ServiceRequestError("storage unreachable (test)")

    def on_response(self, request: Any, response: Any) -> None:
        if self.armed and request.http_request.method == "POST":
            self.armed -= 1
            from azure.core.exceptions import ServiceResponseError

            raise ServiceResponseError("the claim transaction applied, its answer was lost (test)")


@pytest.fixture
def lose_answer(bus) -> Iterator[LoseAnswer]:
    policy = LoseAnswer()
    runtime.reset(policies=[policy], client_options={"retry_total": 0})
    service.use_transport(bus)
    yield policy
    runtime.reset()


def test_a_sweep_whose_claim_answer_was_lost_recognises_its_own_claim_and_sends(
    call, resolve, flow, broker, bus, lose_answer
):
    overdue(resolve, flow)
    lose_answer.armed = 1
    service.sweeper().sweep()
    assert lose_answer.armed == 0
    # Then exactly one message, one audit, and the row left Pending + Handoff
    assert len(sent_to(broker, flow)) == 1
    assert [a["auditType"] for a in event_of(call, flow)["audits"]] == ["FailHandoff"]
    assert event_of(call, flow)["pendingSubStatus"] is None
    service.sweeper().sweep()
    assert len(sent_to(broker, flow)) == 1


def test_when_even_the_claim_read_back_fails_the_next_run_finishes_the_job(
    call, resolve, flow, broker, bus, lose_answer
):
    overdue(resolve, flow)
    lose_answer.armed, lose_answer.fail_reads = 1, 0
    sweeper = service.sweeper()
    original = sweeper.settlement.store.get_claim

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise ServiceRequestError("storage unreachable (test)")

    sweeper.settlement.store.get_claim = unreadable  # type: ignore[method-assign]
    report = sweeper.sweep()
    sweeper.settlement.store.get_claim = original  # type: ignore[method-assign]
    assert report.errors and sent_to(broker, flow) == []
    # The next run meets its own claim (same kind and request): it continues, it does not skip
    report = service.sweeper().sweep()
    assert flow.event_id in report.failed
    assert len(sent_to(broker, flow)) == 1
    assert [a["auditType"] for a in event_of(call, flow)["audits"]] == ["FailHandoff"]


def test_the_sweeper_never_audits_a_failure_it_did_not_send(call, resolve, flow, broker, bus):
    overdue(resolve, flow)
    bus.then(["refuse"])
    report = service.sweeper().sweep()
    assert flow.event_id in report.errors.get(flow.endpoint, {}) or flow.event_id in report.skipped
    assert event_of(call, flow)["audits"] == [] and sent_to(broker, flow) == []
    service.sweeper().sweep()
    assert len(sent_to(broker, flow)) == 1 and len(event_of(call, flow)["audits"]) == 1


class FailPartition(SansIOHTTPPolicy[Any, Any]):
    """Every storage request that touches one endpoint's partition fails (that endpoint is broken)."""

    def __init__(self, partition: str) -> None:
        self.partition = partition

    def on_request(self, request: Any) -> None:
        http = request.http_request
        body = http.body if isinstance(http.body, str | bytes) else b""
        text = unquote(http.url) + (body.decode(errors="ignore") if isinstance(body, bytes) else body)
        if f"'{self.partition}'" in text or f'"{self.partition}"' in text:
            raise ServiceRequestError(f"partition {self.partition} is unreachable (test)")


def test_one_failing_endpoint_never_stops_the_sweep_of_the_others(call, resolve, broker, bus):
    suffix = uuid.uuid4().hex[:8]
    broken = Flow(endpoint=f"A-broken-{suffix}", event_id=str(uuid.uuid4()))
    healthy = Flow(endpoint=f"B-healthy-{suffix}", event_id=str(uuid.uuid4()))
    overdue(resolve, broken)
    overdue(resolve, healthy)
    runtime.reset(
        policies=[FailPartition(service.layout().now().event_partition(broken.endpoint, broken.event_id))],
        client_options={"retry_total": 0},
    )
    service.use_transport(bus)
    try:
        report = service.sweeper().sweep()
        assert broken.endpoint in report.errors
        assert healthy.event_id in report.failed
        assert len(sent_to(broker, healthy)) == 1 and sent_to(broker, broken) == []
        # The reconciler, run by the same timer, also goes on past the broken endpoint
        assert broken.endpoint in service.reconciler().run().errors
    finally:
        runtime.reset()
        service.use_transport(bus)


def park_blocked(resolve, call, endpoint: str, n: int, *, expected_by: datetime) -> list[Flow]:
    """``n`` overdue hand-offs, each already being settled by an agent (so the sweeper must skip them)."""
    flows = []
    for i in range(n):
        flow = Flow(endpoint=endpoint, event_id=f"blocked-{i:04d}")
        resolve(flow.request())
        resolve(flow.park(expected_by=iso(expected_by)))
        flows.append(flow)
    return flows


def test_the_sweeper_reaches_due_rows_behind_more_than_a_page_of_unsweepable_ones(
    call, resolve, flow, broker, bus
):
    # Given 101 overdue hand-offs at the head of the index whose settlement an agent has in flight
    # (the broker holds their messages: the resolver has not projected them yet)
    broker.forward = False
    head = datetime.now(UTC) - timedelta(hours=2)
    blocked = park_blocked(resolve, call, flow.endpoint, 101, expected_by=head)
    for b in blocked:
        body = {
            "endpointId": b.endpoint,
            "coordinates": {"eventId": b.event_id, "messageId": "park-1"},
        }
        assert call("handoff_complete", body).status == 202
    # And three hand-offs that fell due after them
    behind = [Flow(endpoint=flow.endpoint, event_id=f"behind-{i}") for i in range(3)]
    for b in behind:
        overdue(resolve, b, minutes=5)
    # When the sweeper runs once
    report = service.sweeper().sweep()
    # Then the three behind were failed in that run
    assert sorted(e for e in report.failed) == sorted(b.event_id for b in behind)
    broker.pump()
    for b in behind:
        assert [c.message_type for c in sent_to(broker, b)] == ["HandoffFailedRequest"]
    for b in blocked[:3]:
        assert [c.message_type for c in sent_to(broker, b)] == ["HandoffCompletedRequest"]


def test_bounded_runs_continue_where_the_last_one_stopped_on_any_instance(call, resolve, flow, broker, bus):
    # Given seven overdue hand-offs whose failures stay in flight (the resolver has not projected them)
    broker.forward = False
    due = [Flow(endpoint=flow.endpoint, event_id=f"due-{i:02d}") for i in range(7)]
    for i, d in enumerate(due):
        overdue(resolve, d, minutes=30 - i)
    # When each run is on a fresh instance (a restarted host) and may look at three rows
    runs = [Sweeper(service.settlement_service(), rows_per_endpoint=3).sweep().failed for _ in range(3)]
    # Then each run continued where the last stopped (the cursor is in storage), oldest due first
    assert runs == [[d.event_id for d in due[0:3]], [d.event_id for d in due[3:6]], [due[6].event_id]]
    broker.pump()
    for d in due:
        assert [c.message_type for c in sent_to(broker, d)] == ["HandoffFailedRequest"]


def test_an_agent_settlement_in_flight_wins_over_the_sweeper(call, resolve, flow, broker, bus):
    broker.forward = False
    overdue(resolve, flow)
    body = {"endpointId": flow.endpoint, "coordinates": {"eventId": flow.event_id, "messageId": "park-1"}}
    assert call("handoff_complete", body).status == 202
    # (the settlement's mark merged into the queue row: its ExpectedBy stays, so the sweeper finds it)
    [queued] = rows_of(flow, "hq|")
    assert queued["ClaimedUntil"].startswith("9999") and queued["ExpectedBy"] < datetime.now(UTC)
    later = service.sweeper()
    later.clock = lambda: utcnow() + timedelta(minutes=10)
    assert flow.event_id in later.sweep().skipped
    broker.pump()
    assert [c.message_type for c in sent_to(broker, flow)] == ["HandoffCompletedRequest"]
    assert [a["auditType"] for a in event_of(call, flow)["audits"]] == ["CompleteHandoff"]


class CountEndpointListReads(SansIOHTTPPolicy[Any, Any]):
    """Counts queries of the endpoint list (GET on the endpoints table)."""

    def __init__(self) -> None:
        self.reads = 0

    def on_request(self, request: Any) -> None:
        path = unquote(request.http_request.url.split("?", 1)[0])
        if request.http_request.method == "GET" and path.rstrip("()").endswith(keys.ENDPOINTS_TABLE):
            self.reads += 1


def test_a_tick_reads_the_endpoint_list_once_and_still_does_every_pass(
    call, resolve, flow, broker, bus, monkeypatch
):
    # Given an overdue hand-off, the sweeper on, telemetry's gauges on, and the endpoint list's reads counted
    overdue(resolve, flow)
    monkeypatch.setenv("HANDOFF_SWEEPER_ENABLED", "true")
    monkeypatch.setattr("common.telemetry.enabled", lambda: True)
    counter = CountEndpointListReads()
    runtime.reset(policies=[counter])
    service.use_transport(bus)

    # When the timer fires
    call.functions["handoff_sweeper"].get_user_function()(TimerRequest(past_due=False))

    # Then the reconciler, the fold, the sweep and the gauges shared one read of the endpoint list
    assert counter.reads == 1
    # And the sweep still failed the overdue hand-off
    [copy] = sent_to(broker, flow)
    assert json.loads(copy.body)["ErrorContent"]["ErrorType"] == "TimeoutExpired"
    runtime.reset()
