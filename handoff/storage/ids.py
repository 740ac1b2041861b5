"""The lookup index ``hoids``: which hand-offs carry an id, written with the projection, repaired if lost.

The layout is :mod:`handoff.storage.keys`' (``hoids``). The resolver sends a message's index rows as inserts
beside
its event read (:meth:`IdsIndex.send`); an insert that fails does not hold the projection up: its rows go
into the event's transaction as a reconcile row, which the reconciler replays (:meth:`IdsIndex.replay`).
Every write is an insert; a row already there is success (the same row is written for the same id).

The Azure SDK is imported inside the functions that use it, so the worker's indexing does not load it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from common import transactions as tx
from common.beside import Beside
from common.transactions import Operation
from handoff.messages.contract import InboundMessage
from handoff.storage import keys
from handoff.storage.records import ReconcileRow
from handoff.storage.store import HandoffStore

log = logging.getLogger("settle.handoff.ids")

IDS_TASK = "ids"
# Rows this process wrote lately are not sent again (an event's id, session and job come with each of its
# messages); bounded, forgotten all at once when full.
_REMEMBERED = 20_000


@dataclass(frozen=True)
class IdRef:
    """One id of one hand-off: ``kind`` is one of :data:`handoff.storage.keys.ID_KINDS`."""

    kind: str
    value: str
    endpoint_id: str
    event_id: str

    def entity(self) -> dict[str, Any]:
        pk, rk = keys.id_keys(self.kind, self.value, self.endpoint_id, self.event_id)
        return {
            "PartitionKey": pk,
            "RowKey": rk,
            "Kind": self.kind,
            "Value": self.value,
            "EndpointId": self.endpoint_id,
            "EventId": self.event_id,
        }


def refs_of(m: InboundMessage) -> list[IdRef]:
    """The ids an operator may know ``m``'s hand-off by (an empty id ``""`` names nothing to find)."""
    endpoint, event = m.endpoint_id, m.event_id
    found = [
        IdRef("messageId", m.message_id, endpoint, event),
        IdRef("eventId", event, endpoint, event),
    ]
    if m.session_id:
        found.append(IdRef("sessionId", m.session_id, endpoint, event))
    if m.external_job_id:
        found.append(IdRef("externalJobId", m.external_job_id, endpoint, event))
    return found


def repair_entity(pk: str, m: InboundMessage, rows: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """The reconcile row that carries index rows whose insert failed (in the event's transaction)."""
    entity = ReconcileRow(
        event_id=m.event_id, parked_message_id=m.message_id, due_at=now, task=IDS_TASK, ids=json.dumps(rows)
    ).to_entity(pk, keys.ids_repair_row(now, m.event_id, m.message_id))
    return entity


class SentIds:
    """The lookup index inserts of one message, sent beside its read."""

    def __init__(self, sent: list[tuple[dict[str, Any], Beside[None]]]) -> None:
        self._sent = sent
        self._lost: list[dict[str, Any]] | None = None
        self._errors: dict[str, BaseException] = {}

    def __call__(self) -> list[dict[str, Any]]:
        """Wait for the inserts (once); the rows whose insert failed."""
        if self._lost is None:
            self._lost = []
            for entity, beside in self._sent:
                try:
                    beside.result()
                except Exception as exc:
                    log.warning(
                        "index row %s %s not written; the reconciler writes it",
                        entity["PartitionKey"],
                        entity["RowKey"],
                        exc_info=True,
                    )
                    self._lost.append(entity)
                    self._errors.setdefault(str(entity["Kind"]), exc)
        return self._lost

    def error_of(self, kind: str) -> BaseException | None:
        """Why the insert of an id of ``kind`` failed (after the call), or None."""
        self()
        return self._errors.get(kind)


class IdsIndex:
    """Inserts into ``hoids`` (one process-wide instance per store)."""

    def __init__(self, store: HandoffStore) -> None:
        self.store = store
        self._written: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _insert(self, entity: dict[str, Any]) -> None:
        from azure.core.exceptions import ResourceExistsError

        # A row already there is the same row, written before (a redelivery, another message of the event).
        with contextlib.suppress(ResourceExistsError):
            self.store.table(keys.IDS_TABLE).create_entity(entity)
        with self._lock:
            if len(self._written) >= _REMEMBERED:
                self._written.clear()
            self._written.add((entity["PartitionKey"], entity["RowKey"]))

    def send(self, refs: list[IdRef]) -> SentIds:
        """Start the inserts of ``refs`` not written lately, each on a thread of its own; calling the answer
        waits for them and gives the rows whose insert failed (logged, not raised)."""
        entities = [
            e for e in map(IdRef.entity, refs) if (e["PartitionKey"], e["RowKey"]) not in self._written
        ]
        return SentIds([(e, Beside(partial(self._insert, e), name="settle-ids-insert")) for e in entities])

    def replay(self, endpoint_id: str, row: ReconcileRow) -> Operation:
        """Insert the rows a repair row carries (a row already there is success); the delete of the repair
        row (``If-Match`` its ETag) to submit once they are written."""
        for entity in json.loads(row.ids or "[]"):
            self._insert(entity)
        assert row.row_key is not None and row.etag is not None
        return tx.delete(self.store.event_partition(endpoint_id, row.event_id), row.row_key, row.etag)
