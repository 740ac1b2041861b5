"""Operator fixtures: the hand-off fixtures, a recount that scans (tests only), principals."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest

from handoff import service
from handoff.messages.contract import ResolutionStatus
from handoff.storage import counts, keys
from handoff.storage.records import EventRow
from tests.handoff.broker import Broker, BrokerTransport
from tests.handoff.conftest import (  # noqa: F401  (fixtures shared with the hand-off suite)
    CaptureTransport,
    delivered_then_raised,
    flow,
    no_sleep,
    other_instance,
    resolve,
    transport,
)
from tests.support.handoff_flows import Flow


@pytest.fixture(params=[1, 4], ids=lambda s: f"S={s}")
def handoff_shards(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, fresh_tables: str) -> int:
    """Run the test at S = 1 (unsharded) and S = 4 hand-off shards (``SETTLE_HANDOFF_SHARDS``), whatever the
    suite's own setting, on tables of its own (their first instance records that layout: common/layouts.py);
    the test asserts the round trips docs/tables.md gives for that layout."""
    shards = int(request.param)
    monkeypatch.setenv(keys.SHARDS_SETTING, str(shards))
    monkeypatch.delenv(keys.PREVIOUS_SHARDS_SETTING, raising=False)
    return shards


@pytest.fixture
def broker() -> Iterator[Broker]:
    """A broker behind the transport whose topics have no duplicate detection: a send whose outcome is
    unknown is never re-sent, so the reconciler leaves its settlement unconfirmed."""
    broker = Broker(window=None)
    service.use_transport(BrokerTransport(broker))
    yield broker
    service.reset()


def counts_partitions(shards: int) -> int:
    """Partitions the counts of one endpoint are read from: its S shards, and with S > 1 the unsharded
    partition too, which keeps poison's counts (docs/tables.md "Sharded endpoints")."""
    return shards + (1 if shards > 1 else 0)


def recount(endpoint: str) -> dict[str, int]:
    """What the counts must be: every event row of the partition, counted by scanning (tests only)."""
    table = service.store().table(keys.EVENTS_TABLE)
    totals = dict.fromkeys(counts.BUCKETS, 0)
    for pk in service.layout().now().endpoint_partitions(endpoint):  # every shard (SETTLE_HANDOFF_SHARDS)
        query = f"PartitionKey eq '{pk}' and RowKey ge 'ev|' and RowKey lt 'ev}}'"
        for entity in table.query_entities(query):
            if str(entity["RowKey"]).endswith("|e"):
                row = EventRow.from_entity(entity)
                for bucket in counts.buckets_of(row.resolution_status, row.pending_sub_status):
                    totals[bucket] += 1
    return totals


def listing_rows(endpoint: str) -> dict[str, list[str]]:
    """Every listing row of the endpoint by event id: the status each one is filed under (tests only)."""
    table = service.store().table(keys.EVENTS_TABLE)
    found: dict[str, list[str]] = {}
    for pk in service.layout().now().endpoint_partitions(endpoint):
        query = f"PartitionKey eq '{pk}' and RowKey ge 'sd|' and RowKey lt 'sd}}'"
        for entity in table.query_entities(query, select=["RowKey", "EventId"]):
            found.setdefault(str(entity["EventId"]), []).append(keys.listing_status(str(entity["RowKey"])))
    return found


def event_statuses(endpoint: str) -> dict[str, str]:
    """Every event row's status by event id (tests only)."""
    table = service.store().table(keys.EVENTS_TABLE)
    found: dict[str, str] = {}
    for pk in service.layout().now().endpoint_partitions(endpoint):
        query = f"PartitionKey eq '{pk}' and RowKey ge 'ev|' and RowKey lt 'ev}}'"
        for entity in table.query_entities(query):
            if str(entity["RowKey"]).endswith("|e"):
                row = EventRow.from_entity(entity)
                found[row.event_id] = row.resolution_status.name
    return found


def counted(endpoint: str) -> dict[str, int]:
    totals = service.overview().counts(endpoint)
    return {bucket: totals[bucket] for bucket in counts.BUCKETS}


def principal_headers(
    name: str, *roles: str, principal_id: str = "00000000-0000-0000-0000-000000000001"
) -> dict[str, str]:
    """The headers App Service authentication passes for a signed-in Entra ID user."""
    document = {
        "auth_typ": "aad",
        "name_typ": "name",
        "role_typ": "roles",
        "claims": [{"typ": "name", "val": name}] + [{"typ": "roles", "val": r} for r in roles],
    }
    return {
        "x-ms-client-principal": base64.b64encode(json.dumps(document).encode()).decode(),
        "x-ms-client-principal-name": name,
        "x-ms-client-principal-id": principal_id,
    }


def failed_event(project: Any, event: Flow, *, error_message_id: str = "err-1") -> None:
    """An event whose subscriber answered ErrorResponse."""
    project(event.request())
    project(event.response(_error(), message_id=error_message_id, error_text="ERP timeout"))


def _error() -> Any:
    from handoff.messages.contract import MessageType

    return MessageType.ErrorResponse


STATUS = ResolutionStatus


@contextmanager
def a_second_apart(start: datetime) -> Iterator[None]:
    """The resolver's clock a second further at each reading, from ``start``: the storage clock's own
    readings may repeat (they never step back), and tests that order events by when they changed need each
    projection at its own time."""
    resolver = service.resolver_service()
    ticks = iter(range(100_000))
    original = resolver.clock
    resolver.clock = lambda: start + timedelta(seconds=next(ticks))
    try:
        yield
    finally:
        resolver.clock = original
