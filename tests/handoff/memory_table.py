"""The claim model's view of one hand-off partition, over the project's one in-memory table
(``tests/support/memory_table.py``, held to Azurite's behaviour by ``tests/conformance``): it submits the
operations the cores build as one entity-group transaction and reads rows back as records, and raises
:class:`Refused` carrying what ``common.transactions.refusal`` says of the service's refusal."""

from __future__ import annotations

from typing import Any, TypeVar

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from common.transactions import Operation, Refusal, refusal
from handoff.storage import keys
from handoff.storage.records import TableRecord
from tests.support.memory_table import MemoryTables

R = TypeVar("R", bound=TableRecord)


class Refused(Exception):
    """A transaction storage refused; ``refusal`` says which operation and why."""

    def __init__(self, refused: Refusal) -> None:
        super().__init__(f"operation {refused.index} refused with {refused.status}")
        self.refusal = refused


class MemoryTable:
    """The hand-off events table of ``tables`` (a new in-memory storage when none is given)."""

    def __init__(self, tables: MemoryTables | None = None) -> None:
        self.tables = tables or MemoryTables()
        self._table = self.tables.table(keys.EVENTS_TABLE)

    def get(self, pk: str, rk: str) -> dict[str, Any] | None:
        try:
            return dict(self._table.get_entity(pk, rk))
        except ResourceNotFoundError:
            return None

    def read(self, record: type[R], pk: str, rk: str) -> R | None:
        """The row as the store reads it: the record with its ETag."""
        try:
            entity = self._table.get_entity(pk, rk)
        except ResourceNotFoundError:
            return None
        found: R = record.from_entity(entity)
        found.etag = entity.metadata["etag"]
        return found

    def event_rows(self, pk: str, event_id: str) -> list[Any]:
        """Every row of one event (its ``ev|{eventId}|`` range), in key order, as the store reads them."""
        low, high = keys.event_range(event_id)
        return list(
            self._table.query_entities(f"PartitionKey eq '{pk}' and RowKey ge '{low}' and RowKey lt '{high}'")
        )

    def submit(self, ops: list[Operation]) -> list[dict[str, Any]]:
        """Apply ``ops`` all or none; the answers carry each written row's new ETag, in order."""
        try:
            return self._table.submit_transaction(ops)
        except HttpResponseError as exc:
            refused = refusal(exc)
            if refused is None:
                raise
            raise Refused(refused) from exc
