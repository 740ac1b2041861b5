"""Agent receive (oldest parked first, non-claiming, skips settlements in flight) and the lookups."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.functions import MAX_WAIT_SECONDS
from handoff.messages.contract import MessageType
from handoff.storage import keys
from tests.support.handoff_flows import event_of, park


def next_of(call, endpoint: str, **params: str):
    return call("handoff_next", method="GET", route_params={"endpointId": endpoint}, params=params)


def test_next_returns_the_oldest_parked_event_with_payload_and_coordinates(call, resolve, flow):
    base = datetime.now(UTC) - timedelta(hours=1)
    park(resolve, flow.endpoint, "newer", at=base + timedelta(minutes=5))
    park(resolve, flow.endpoint, "older", at=base)
    result = next_of(call, flow.endpoint)
    assert result.status == 200
    assert result.json["coordinates"] == {
        "eventId": "older",
        "sessionId": "session-1",
        "messageId": "park-1",
        "eventTypeId": "Billing.InvoiceCreated",
        "correlationId": "req-1",
        "originatingMessageId": "self",
    }
    assert result.json["payload"] == '{"invoice": 42}'
    assert result.json["eventTypeId"] == "Billing.InvoiceCreated"
    # Non-claiming: asking again gives the same event
    assert next_of(call, flow.endpoint).json["coordinates"]["eventId"] == "older"


def test_next_filters_by_event_type(call, resolve, flow):
    base = datetime.now(UTC) - timedelta(hours=1)
    park(resolve, flow.endpoint, "invoice", at=base, event_type="Billing.InvoiceCreated")
    park(resolve, flow.endpoint, "order", at=base + timedelta(minutes=1), event_type="Sales.OrderPlaced")
    assert (
        next_of(call, flow.endpoint, eventTypeId="Sales.OrderPlaced").json["coordinates"]["eventId"]
        == "order"
    )
    both = next_of(call, flow.endpoint, eventTypeId="Sales.OrderPlaced,Billing.InvoiceCreated")
    assert both.json["coordinates"]["eventId"] == "invoice"
    assert next_of(call, flow.endpoint, eventTypeId="Other.Type").status == 204


def test_next_skips_an_event_whose_settlement_is_in_flight(call, resolve, flow, transport):
    base = datetime.now(UTC) - timedelta(hours=1)
    first = park(resolve, flow.endpoint, "first", at=base)
    park(resolve, flow.endpoint, "second", at=base + timedelta(minutes=1))
    settled = call(
        "handoff_complete",
        {
            "endpointId": flow.endpoint,
            "coordinates": {"eventId": first.event_id, "sessionId": "session-1", "messageId": "park-1"},
        },
    )
    assert settled.status == 202
    assert next_of(call, flow.endpoint).json["coordinates"]["eventId"] == "second"


def test_next_answers_204_when_nothing_is_parked(call, flow):
    assert next_of(call, flow.endpoint).status == 204


def test_next_waits_for_a_park_up_to_wait_seconds(call, resolve, flow):
    receive = service.receive_service()
    slept: list[float] = []

    def park_while_waiting(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            park(resolve, flow.endpoint, "late", at=datetime.now(UTC))

    receive.sleep = park_while_waiting
    try:
        result = next_of(call, flow.endpoint, waitSeconds="5")
    finally:
        receive.sleep = time.sleep
    assert result.status == 200 and result.json["coordinates"]["eventId"] == "late"
    assert slept == [0.5, 0.5]


def test_wait_seconds_is_clamped_and_validated(call, flow):
    receive = service.receive_service()
    now = [0.0]

    def fake_sleep(seconds: float) -> None:  # virtual time: the test does not wait
        now[0] += seconds

    receive.sleep, receive.monotonic = fake_sleep, lambda: now[0]
    try:
        assert next_of(call, flow.endpoint, waitSeconds="0").status == 204
        assert now[0] == 0
        assert next_of(call, flow.endpoint, waitSeconds="999").status == 204
        assert now[0] == MAX_WAIT_SECONDS  # clamped
        assert next_of(call, flow.endpoint, waitSeconds="abc").status == 400
        assert next_of(call, flow.endpoint, waitSeconds="-1").json["field"] == "waitSeconds"
    finally:
        receive.sleep, receive.monotonic = time.sleep, time.monotonic


def test_reads_use_the_index_and_the_event_range_never_a_scan(call, resolve, flow):
    park(resolve, flow.endpoint, "one", at=datetime.now(UTC), job="job-one")
    with ROUND_TRIPS.measure() as receive:
        assert next_of(call, flow.endpoint).status == 200
    with ROUND_TRIPS.measure() as job:
        found = call(
            "handoff_job",
            method="GET",
            route_params={"endpointId": flow.endpoint, "externalJobId": "job-one"},
        )
        assert found.status == 200
    with ROUND_TRIPS.measure() as read:
        assert (
            call(
                "event_get", method="GET", route_params={"endpointId": flow.endpoint, "eventId": "one"}
            ).status
            == 200
        )
    shards = len(
        service.layout().now().endpoint_partitions(flow.endpoint)
    )  # SETTLE_HANDOFF_SHARDS: one page per shard
    assert receive.requests == shards + 1  # one index range page (per shard) + one event row read
    assert job.requests == 2  # the job's rows of the lookup index (one partition, any shards) + the event row
    assert read.requests == 1  # one range query: the event row, its history and its audits


def test_job_lookup_finds_the_parked_row_and_404s_otherwise(call, resolve, flow):
    park(resolve, flow.endpoint, "ev-1", at=datetime.now(UTC), job="DMF/2026#17?")
    found = call(
        "handoff_job",
        method="GET",
        route_params={"endpointId": flow.endpoint, "externalJobId": "DMF/2026#17?"},
    )
    assert found.status == 200 and found.json["externalJobId"] == "DMF/2026#17?"
    missing = call(
        "handoff_job", method="GET", route_params={"endpointId": flow.endpoint, "externalJobId": "DMF"}
    )
    assert missing.status == 404 and missing.content_type.startswith("application/problem+json")


def test_job_lookup_answers_the_event_parked_with_the_job_now_among_every_event_that_carried_it(
    call, resolve, flow
):
    ended = park(resolve, flow.endpoint, "ev-a", at=datetime.now(UTC) - timedelta(seconds=5), job="JOB-7")
    resolve(ended.response(MessageType.ResolutionResponse, message_id="done-a", parent="park-1"))
    park(resolve, flow.endpoint, "ev-b", at=datetime.now(UTC), job="JOB-7")
    park(resolve, flow.endpoint, "ev-c", at=datetime.now(UTC), job="job-7")  # another id: case counts

    found = call(
        "handoff_job", method="GET", route_params={"endpointId": flow.endpoint, "externalJobId": "JOB-7"}
    )

    assert found.status == 200 and found.json["coordinates"]["eventId"] == "ev-b"
    elsewhere = call(
        "handoff_job", method="GET", route_params={"endpointId": "Other-endpoint", "externalJobId": "JOB-7"}
    )
    assert elsewhere.status == 404


def test_a_park_from_before_the_lookup_index_served_jobs_is_found_by_its_job_row(call, resolve, flow):
    park(resolve, flow.endpoint, "ev-old", at=datetime.now(UTC), job="job-old")
    store = service.store()
    ids = store.table(keys.IDS_TABLE)
    for row in ids.query_entities(f"PartitionKey eq '{keys.exact_id_partition('job-old')}'"):
        ids.delete_entity(row["PartitionKey"], row["RowKey"])  # as if indexed before ADR-0022: no hoids row
    pk = store.event_partition(flow.endpoint, "ev-old")
    low, _ = keys.job_range("job-old")
    legacy = {"PartitionKey": pk, "RowKey": low + "ev-old", "EventId": "ev-old", "ExternalJobId": "job-old"}
    store.table(keys.EVENTS_TABLE).create_entity(legacy)

    found = call(
        "handoff_job", method="GET", route_params={"endpointId": flow.endpoint, "externalJobId": "job-old"}
    )

    assert found.status == 200 and found.json["coordinates"]["eventId"] == "ev-old"


def test_event_read_returns_nimbus_field_names_history_and_audits(call, resolve, flow):
    park(resolve, flow.endpoint, flow.event_id, at=datetime.now(UTC))
    row = event_of(call, flow)
    for name in (
        "resolutionStatus",
        "pendingSubStatus",
        "messageType",
        "lastMessageId",
        "handoffReason",
        "externalJobId",
        "expectedBy",
        "reason",
        "history",
        "audits",
        "eventTypeId",
        "sessionId",
    ):
        assert name in row
    assert [h["messageType"] for h in row["history"]] == ["EventRequest", "PendingHandoffResponse"]


def test_event_read_of_an_unknown_event_is_404(call, flow):
    result = call("event_get", method="GET", route_params={"endpointId": flow.endpoint, "eventId": "nope"})
    assert result.status == 404
