"""A small in-memory model of one Table Storage table for the decision cores' tests: it applies the
operations the cores build (``common.transactions``) as an entity-group transaction would, atomically and
with ETag conditions, and refuses them as the service does (409 the row exists, 412 another ETag, 404 no
row), naming the refused operation. No storage, no network."""

from __future__ import annotations

import itertools
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from common.transactions import Operation, Refusal
from handoff.records import TableRecord

R = TypeVar("R", bound=TableRecord)

_CODES = {404: "ResourceNotFound", 409: "EntityAlreadyExists", 412: "UpdateConditionNotSatisfied"}


class Refused(Exception):
    """A transaction the model refused; ``refusal`` is what ``common.transactions.refusal`` would say."""

    def __init__(self, index: int, status: int) -> None:
        super().__init__(f"operation {index} refused with {status}")
        self.refusal = Refusal(index=index, status=status, code=_CODES[status])


class MemoryTable:
    """Rows by (PartitionKey, RowKey), each with its ETag (a new one on every write)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}
        self.etags: dict[tuple[str, str], str] = {}
        self._etags = itertools.count(1)

    def get(self, pk: str, rk: str) -> dict[str, Any] | None:
        row = self.rows.get((pk, rk))
        return None if row is None else dict(row)

    def read(self, record: type[R], pk: str, rk: str) -> R | None:
        """The row as the store reads it: the record with its ETag and RowKey."""
        entity = self.rows.get((pk, rk))
        if entity is None:
            return None
        found: R = record.from_entity(entity)
        found.etag = self.etags[(pk, rk)]
        return found

    def submit(self, ops: list[Operation]) -> list[dict[str, Any]]:
        """Apply ``ops`` all or none; the answers carry each written row's new ETag, in order."""
        staged = {key: dict(row) for key, row in self.rows.items()}
        etags = dict(self.etags)
        answers: list[dict[str, Any]] = []
        for index, op in enumerate(ops):
            kind, entity = op[0], dict(op[1])
            options: dict[str, Any] = op[2] if len(op) > 2 else {}
            key = (str(entity["PartitionKey"]), str(entity["RowKey"]))
            found = staged.get(key)
            if kind == "create":
                if found is not None:
                    raise Refused(index, 409)
            else:
                if found is None:
                    raise Refused(index, 404)
                etag = options.get("etag")
                conditional = options.get("match_condition") is MatchConditions.IfNotModified
                if conditional and etag != "*" and etag != etags[key]:
                    raise Refused(index, 412)
            if kind == "delete":
                del staged[key], etags[key]
                answers.append({})
                continue
            if kind == "update" and options.get("mode") is UpdateMode.MERGE:
                assert found is not None
                entity = {**found, **entity}
            staged[key], etags[key] = entity, f'W/"{next(self._etags)}"'
            answers.append({"etag": etags[key]})
        self.rows, self.etags = staged, etags
        return answers
