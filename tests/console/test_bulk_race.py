"""Bulk actions raced from two processes: two development hosts on one storage account (the same table
prefix), each running bulk resubmits, and single resubmits and skips beside them, all at once. Each event
ends with one claim, one audit and one control message, whoever won it."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx

from tests.support.children import StartHost

from .conftest import nimbus_message, resolver_message

ENDPOINT = "Race"
EVENTS = [f"race-{n}" for n in range(12)]


def _rows(connection: str, prefix: str) -> dict[str, Counter[str]]:
    """Per event: claims (c), audits as the event view shows them (a: the audit rows and the entries
    rendered from claims, ADR-0022 change 3) and control messages projected back (ctl)."""
    from common.settings import TableSettings
    from common.tables import Tables
    from handoff import service
    from handoff.storage import keys
    from handoff.storage.store import classify_event_rows

    tables = Tables(
        TableSettings(connection_string=connection, service_uri=None, client_id=None, prefix=prefix)
    )
    found: dict[str, Counter[str]] = {e: Counter() for e in EVENTS}
    try:
        table = tables.table(keys.EVENTS_TABLE)
        rows = [
            entity
            # every shard (SETTLE_HANDOFF_SHARDS), by the layout this process routes by
            for pk in service.layout().now().endpoint_partitions(ENDPOINT)
            for entity in table.query_entities(
                f"PartitionKey eq '{pk}' and RowKey ge 'ev|' and RowKey lt 'ev}}'"
            )
        ]
        of_event: dict[str, list[object]] = {e: [] for e in EVENTS}
        for entity in rows:
            _, event, kind, *_ = str(entity["RowKey"]).split("|")
            event = keys.decode(event)
            of_event[event].append(entity)
            if kind == "c":
                found[event][kind] += 1
            if kind == "m" and entity.get("MessageType") in ("ResubmissionRequest", "SkipRequest"):
                found[event]["ctl"] += 1
        for event, entities in of_event.items():
            found[event]["a"] += len(classify_event_rows(iter(entities))[2])
    finally:
        tables.close()
    return found


def test_bulk_and_single_actions_raced_from_two_processes_act_once_per_event(
    start_host: StartHost,
    azurite_connection: str,
) -> None:
    from tests.conftest import new_prefix

    prefix = new_prefix()
    env = {"SETTLE_TABLE_PREFIX": prefix}
    one, two = start_host(env=env), start_host(env=env)
    for event in EVENTS:
        resolver_message(
            one.base_url,
            **nimbus_message("EventRequest", endpoint=ENDPOINT, event_id=event, message_id=f"{event}-req"),
        )
        resolver_message(
            one.base_url,
            **nimbus_message(
                "ErrorResponse",
                endpoint=ENDPOINT,
                event_id=event,
                message_id=f"{event}-err",
                parent=f"{event}-req",
                error_text="ERP timeout",
            ),
        )
    answers: list[Any] = []
    start = threading.Barrier(4)

    def bulk(base: str, action: str, by: str, ids: list[str]) -> None:
        start.wait()
        for n in range(0, len(ids), 5):
            response = httpx.post(
                f"{base}/api/v1/endpoints/{ENDPOINT}/bulk",
                json={"action": action, "eventIds": ids[n : n + 5], "by": by},
                timeout=120,
            )
            assert response.status_code == 200, response.text
            answers.extend(response.json()["items"])

    def singles(base: str) -> None:
        start.wait()
        for n, event in enumerate(EVENTS[::3]):
            action = "skip" if n % 2 else "resubmit"
            response = httpx.post(
                f"{base}/api/v1/events/{ENDPOINT}/{event}/{action}", json={"by": "carol"}, timeout=120
            )
            assert response.status_code in (202, 409), response.text
            answers.append({"eventId": event, "status": response.status_code})

    threads = [
        threading.Thread(target=bulk, args=(one.base_url, "resubmit", "alice", EVENTS)),
        threading.Thread(target=bulk, args=(two.base_url, "resubmit", "bob", EVENTS[::-1])),
        threading.Thread(target=bulk, args=(two.base_url, "skip", "dave", EVENTS[1::2])),
        threading.Thread(target=singles, args=(one.base_url,)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    # Every event: exactly one action won (one 202 of a first send) and the rest were refused per event
    assert {a["status"] for a in answers} <= {202, 409}, answers
    rows = _rows(azurite_connection, prefix)
    assert all(rows[e] == Counter(c=1, a=1, ctl=1) for e in EVENTS), rows
    winners = Counter(a["eventId"] for a in answers if a["status"] == 202)
    assert all(winners[e] >= 1 for e in EVENTS), winners
