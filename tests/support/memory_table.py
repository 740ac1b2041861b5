"""An in-memory Table Storage for the real stores and services, held to Azurite's behaviour by the
conformance suite (``tests/conformance/test_table_conformance.py``, run against both).

Entities are kept as the wire holds them: serialised by the SDK's own code (``_add_entity_properties``) on
the way in and deserialised by it (``_convert_to_entity``) on the way out, so property types (Int64,
DateTime, Binary, Guid) come back exactly as they do from the service. Filters are substituted by the SDK's
own parameter code and then evaluated here (comparisons, ``and``/``or``/``not``, parentheses). Writes are
refused as the service refuses them (409 the row exists, 412 another ETag, 404 no row, 400 too large or a
bad key), with the exception types and status codes the SDK raises; a transaction is atomic, in one
partition, and names the refused operation.

``hold``: a test may hold any request (``MemoryTables.gate``: called before each call with its name and
arguments), which is how the timing tests pause one writer between its decision and its write and reorder
writes deterministically, without sleeps.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableTransactionError, UpdateMode
from azure.data.tables._deserialize import _convert_to_entity
from azure.data.tables._serialize import _add_entity_properties, _parameter_filter_substitution

MAX_ENTITY_BYTES = 1024 * 1024
MAX_PROPERTY_BYTES = 64 * 1024
MAX_PROPERTIES = 255  # besides PartitionKey, RowKey and Timestamp
MAX_KEY_BYTES = 1024
MAX_TRANSACTION_OPS = 100
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
DEFAULT_PAGE = 1000
_FORBIDDEN_KEY = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")

Gate = Callable[[str, tuple[Any, ...]], None]


def _error(
    kind: type[HttpResponseError], status: int, code: str, message: str, **kw: Any
) -> HttpResponseError:
    exc = kind(message=f"{code}: {message}", **kw)
    exc.status_code = status
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


def _size(wire: Mapping[str, Any]) -> int:
    """The service's entity size estimate: 4 + keys in UTF-16 + per property 8 + name in UTF-16 + value."""
    total = 4 + 2 * (len(str(wire["PartitionKey"])) + len(str(wire["RowKey"])))
    for name, value in wire.items():
        if name in ("PartitionKey", "RowKey") or name.endswith("@odata.type"):
            continue
        total += 8 + 2 * len(name) + _value_size(wire, name, value)
    return total


def _value_size(wire: Mapping[str, Any], name: str, value: Any) -> int:
    kind = wire.get(f"{name}@odata.type")
    if kind == "Edm.Binary":
        return len(base64.b64decode(value))
    if isinstance(value, str) and kind in (None, "Edm.String"):
        return len(value.encode("utf-16-le")) + 4
    return 8


def _check_entity(wire: Mapping[str, Any]) -> None:
    for key in ("PartitionKey", "RowKey"):
        value = str(wire.get(key, ""))
        if len(value.encode("utf-16-le")) > MAX_KEY_BYTES:
            raise _error(HttpResponseError, 400, "KeyValueTooLarge", f"The {key} is too long.")
        if _FORBIDDEN_KEY.search(value):
            raise _error(HttpResponseError, 400, "InvalidInput", f"The {key} holds a forbidden character.")
    names = [n for n in wire if not n.endswith("@odata.type") and n not in ("PartitionKey", "RowKey")]
    if len(names) > MAX_PROPERTIES:
        raise _error(HttpResponseError, 400, "TooManyProperties", "The entity has too many properties.")
    for name in names:
        value, kind = wire[name], wire.get(f"{name}@odata.type")
        if kind == "Edm.Binary" and len(base64.b64decode(value)) > MAX_PROPERTY_BYTES:
            raise _error(HttpResponseError, 400, "PropertyValueTooLarge", f"{name} is larger than 64 KiB.")
        text = isinstance(value, str) and kind in (None, "Edm.String")
        if text and len(value.encode("utf-16-le")) > MAX_PROPERTY_BYTES:
            raise _error(HttpResponseError, 400, "PropertyValueTooLarge", f"{name} is larger than 64 KiB.")
    if _size(wire) > MAX_ENTITY_BYTES:
        raise _error(HttpResponseError, 400, "EntityTooLarge", "The entity is larger than 1 MiB.")


# -- filters -----------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<open>\()|(?P<close>\))|(?P<dt>datetime'[^']*')|(?P<guid>guid'[^']*')|(?P<bin>X'[0-9a-fA-F]*')"
    r"|(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?L?)|(?P<word>[A-Za-z_][A-Za-z0-9_]*))"
)
_OPS = {"eq", "ne", "gt", "ge", "lt", "le"}


def _tokens(text: str) -> list[tuple[str, str]]:
    found, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None:
            raise _error(HttpResponseError, 400, "InvalidInput", f"Cannot parse the filter at {text[at:]!r}.")
        kind = match.lastgroup or ""
        found.append((kind, match.group(kind)))
        at = match.end()
    return found


def _literal(kind: str, text: str) -> Any:
    if kind == "str":
        return text[1:-1].replace("''", "'")
    if kind == "dt":
        return _datetime(text[len("datetime'") : -1])
    if kind == "guid":
        return text[len("guid'") : -1].lower()
    if kind == "bin":
        return bytes.fromhex(text[2:-1])
    if kind == "num":
        if text.endswith("L"):
            return int(text[:-1])
        return float(text) if any(c in text for c in ".eE") else int(text)
    if text in ("true", "false"):
        return text == "true"
    raise _error(HttpResponseError, 400, "InvalidInput", f"Unknown value {text!r} in the filter.")


def _datetime(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class _Parser:
    """``or`` of ``and`` of ``not`` of a comparison or a parenthesised filter."""

    def __init__(self, text: str) -> None:
        self._tokens = _tokens(text)
        self._at = 0

    def parse(self) -> Callable[[Mapping[str, Any]], bool]:
        test = self._or()
        if self._at != len(self._tokens):
            raise _error(HttpResponseError, 400, "InvalidInput", "Unexpected text at the end of the filter.")
        return test

    def _peek(self) -> tuple[str, str] | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _take(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise _error(HttpResponseError, 400, "InvalidInput", "The filter ends too early.")
        self._at += 1
        return token

    def _or(self) -> Callable[[Mapping[str, Any]], bool]:
        parts = [self._and()]
        while self._peek() == ("word", "or"):
            self._take()
            parts.append(self._and())
        return parts[0] if len(parts) == 1 else (lambda row: any(p(row) for p in parts))

    def _and(self) -> Callable[[Mapping[str, Any]], bool]:
        parts = [self._not()]
        while self._peek() == ("word", "and"):
            self._take()
            parts.append(self._not())
        return parts[0] if len(parts) == 1 else (lambda row: all(p(row) for p in parts))

    def _not(self) -> Callable[[Mapping[str, Any]], bool]:
        if self._peek() == ("word", "not"):
            self._take()
            inner = self._not()
            return lambda row: not inner(row)
        if self._peek() == ("open", "("):
            self._take()
            inner = self._or()
            if self._take() != ("close", ")"):
                raise _error(HttpResponseError, 400, "InvalidInput", "Unbalanced parentheses in the filter.")
            return inner
        kind, name = self._take()
        op_kind, op = self._take()
        if kind != "word" or op_kind != "word" or op not in _OPS:
            raise _error(HttpResponseError, 400, "InvalidInput", f"Cannot read the comparison at {name!r}.")
        value = _literal(*self._take())
        return lambda row: _compare(_typed(row, name), op, value)


def _typed(row: Mapping[str, Any], name: str) -> Any:
    """A stored property as a Python value (None when the row has none)."""
    if name not in row:
        return None
    value, kind = row[name], row.get(f"{name}@odata.type")
    if kind == "Edm.Int64":
        return int(value)
    if kind == "Edm.DateTime":
        return _datetime(value)
    if kind == "Edm.Binary":
        return base64.b64decode(value)
    if kind == "Edm.Guid":
        return str(value).lower()
    if kind == "Edm.Double":
        return float(value)
    return value


def _compare(left: Any, op: str, right: Any) -> bool:
    if left is None:
        return False  # a property the row lacks satisfies no comparison
    numbers = (int, float)
    same = type(left) is type(right) or (
        isinstance(left, numbers) and isinstance(right, numbers) and not isinstance(left, bool)
    )
    if not same:
        return False
    if op == "eq":
        return bool(left == right)
    if op == "ne":
        return bool(left != right)
    if op == "gt":
        return bool(left > right)
    if op == "ge":
        return bool(left >= right)
    if op == "lt":
        return bool(left < right)
    return bool(left <= right)


# -- the table ---------------------------------------------------------------------------------------------


class _Pages:
    """``by_page``'s iterator: one page a ``next``; ``continuation_token`` names the next page's first key."""

    def __init__(self, rows: list[Any], size: int, start: int) -> None:
        self._rows, self._size, self._at = rows, size, start
        self.continuation_token: dict[str, str] | None = None
        self._done = False

    def __iter__(self) -> Iterator[list[Any]]:
        return self

    def __next__(self) -> list[Any]:
        if self._done:
            raise StopIteration
        page = self._rows[self._at : self._at + self._size]
        self._at += self._size
        if self._at < len(self._rows):
            nxt = self._rows[self._at]
            self.continuation_token = {"PartitionKey": nxt["PartitionKey"], "RowKey": nxt["RowKey"]}
        else:
            self.continuation_token = None
            self._done = True
        return page


class _Query:
    def __init__(self, rows: list[Any], size: int) -> None:
        self._rows, self._size = rows, size

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def by_page(self, continuation_token: Mapping[str, str] | None = None) -> _Pages:
        start = 0
        if continuation_token:
            key = (continuation_token["PartitionKey"], continuation_token["RowKey"])
            start = next(
                (i for i, r in enumerate(self._rows) if (r["PartitionKey"], r["RowKey"]) >= key),
                len(self._rows),
            )
        return _Pages(self._rows, self._size, start)


class MemoryTable:
    """One table: rows as the wire holds them, by (PartitionKey, RowKey), each with its ETag."""

    def __init__(self, name: str, store: MemoryTables) -> None:
        self.table_name = name
        self._store = store
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}

    # -- reads ---------------------------------------------------------------------------------------------
    def get_entity(
        self, partition_key: str, row_key: str, *, select: Sequence[str] | None = None, **_: Any
    ) -> Any:
        self._store.enter("get_entity", (self.table_name, partition_key, row_key))
        with self._store.lock:
            wire = self.rows.get((partition_key, row_key))
            if wire is None:
                raise _error(ResourceNotFoundError, 404, "ResourceNotFound", "No such row.")
            return _entity(wire, select)

    def query_entities(
        self,
        query_filter: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        select: Sequence[str] | str | None = None,
        results_per_page: int | None = None,
        **_: Any,
    ) -> _Query:
        self._store.enter("query_entities", (self.table_name, query_filter, parameters))
        text = _parameter_filter_substitution(dict(parameters) if parameters else None, query_filter)
        test = _Parser(text).parse()
        fields = [s.strip() for s in select.split(",")] if isinstance(select, str) else select
        with self._store.lock:
            rows = [_entity(self.rows[k], fields) for k in sorted(self.rows) if test(self.rows[k])]
        return _Query(rows, min(results_per_page or DEFAULT_PAGE, DEFAULT_PAGE))

    def list_entities(self, **kwargs: Any) -> _Query:
        return self.query_entities("PartitionKey ge ''", **kwargs)

    # -- writes --------------------------------------------------------------------------------------------
    def create_entity(self, entity: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        self._store.enter("create_entity", (self.table_name, dict(entity)))
        return self._apply([("create", entity)], single=True)[0]

    def update_entity(
        self, entity: Mapping[str, Any], mode: UpdateMode = UpdateMode.MERGE, **kwargs: Any
    ) -> dict[str, Any]:
        self._store.enter("update_entity", (self.table_name, dict(entity)))
        return self._apply([("update", entity, {"mode": mode, **kwargs})], single=True)[0]

    def upsert_entity(
        self, entity: Mapping[str, Any], mode: UpdateMode = UpdateMode.MERGE, **kwargs: Any
    ) -> dict[str, Any]:
        self._store.enter("upsert_entity", (self.table_name, dict(entity)))
        return self._apply([("upsert", entity, {"mode": mode, **kwargs})], single=True)[0]

    def delete_entity(self, *args: Any, **kwargs: Any) -> None:
        if args and isinstance(args[0], Mapping):
            pk, rk = str(args[0]["PartitionKey"]), str(args[0]["RowKey"])
        else:
            pk, rk = (*args, kwargs.pop("partition_key", None), kwargs.pop("row_key", None))[:2]
        self._store.enter("delete_entity", (self.table_name, pk, rk))
        try:
            self._apply([("delete", {"PartitionKey": pk, "RowKey": rk}, kwargs)], single=True)
        except ResourceNotFoundError:
            return  # the SDK answers a delete of a missing row as done

    def submit_transaction(self, operations: Sequence[Any], **_: Any) -> list[dict[str, Any]]:
        ops = list(operations)
        self._store.enter("submit_transaction", (self.table_name, ops))
        if not ops:
            return []
        partitions = {str(op[1]["PartitionKey"]) for op in ops}
        if len(partitions) > 1:
            raise _error(
                TableTransactionError,
                400,
                "CommandsInBatchActOnDifferentPartitions",
                "One partition per transaction.",
            )
        if len(ops) > MAX_TRANSACTION_OPS:
            raise _error(TableTransactionError, 400, "InvalidInput", "Over 100 operations.")
        keys = [(str(op[1]["PartitionKey"]), str(op[1]["RowKey"])) for op in ops]
        if len(set(keys)) != len(keys):
            raise _error(TableTransactionError, 400, "InvalidDuplicateRow", "A row twice.")
        size = sum(len(json.dumps(_add_entity_properties(op[1]), default=str)) for op in ops)
        if size > MAX_TRANSACTION_BYTES:
            raise _error(TableTransactionError, 413, "RequestBodyTooLarge", "Over 4 MiB.")
        return self._apply(ops, single=False)

    def _apply(self, ops: list[Any], *, single: bool) -> list[dict[str, Any]]:
        with self._store.lock:
            staged = dict(self.rows)
            answers = []
            for index, op in enumerate(ops):
                try:
                    answers.append(self._one(staged, op))
                except HttpResponseError as exc:
                    if single:
                        raise
                    raise _error(
                        TableTransactionError,
                        exc.status_code or 400,
                        str(getattr(exc, "error_code", "")),
                        f"{index}:{exc.message}",
                        index=index,
                    ) from None
            self.rows = staged
            return answers

    def _one(self, staged: dict[tuple[str, str], dict[str, Any]], op: Any) -> dict[str, Any]:
        kind, entity = str(op[0]), op[1]
        options: Mapping[str, Any] = op[2] if len(op) > 2 else {}
        key = (str(entity["PartitionKey"]), str(entity["RowKey"]))
        found = staged.get(key)
        if kind == "delete":
            self._check_condition(found, options)
            del staged[key]
            return {"etag": None}
        wire = _add_entity_properties(entity)
        _check_entity(wire)
        if kind == "create":
            if found is not None:
                raise _error(ResourceExistsError, 409, "EntityAlreadyExists", "The row exists.")
            row = dict(wire)
        elif kind == "update":
            self._check_condition(found, options)
            row = _merged(found, wire, options.get("mode", UpdateMode.MERGE))
        elif kind == "upsert":
            row = dict(wire) if found is None else _merged(found, wire, options.get("mode", UpdateMode.MERGE))
        else:
            raise ValueError(f"unknown operation {kind!r}")
        _check_entity(row)
        stamp = self._store.stamp()
        row["Timestamp"] = stamp.isoformat().replace("+00:00", "Z")
        row["odata.etag"] = f"W/\"datetime'{row['Timestamp']}'{next(self._store.counter)}\""
        staged[key] = row
        return {"etag": row["odata.etag"], "date": stamp}

    @staticmethod
    def _check_condition(found: dict[str, Any] | None, options: Mapping[str, Any]) -> None:
        if found is None:
            raise _error(ResourceNotFoundError, 404, "ResourceNotFound", "No such row.")
        if (
            options.get("match_condition") == MatchConditions.IfNotModified
            and options.get("etag") not in ("*", found["odata.etag"])  # If-Match: * is any ETag
        ):
            raise _error(
                ResourceModifiedError,
                412,
                "UpdateConditionNotSatisfied",
                "Another ETag.",
            )


def _merged(found: dict[str, Any] | None, wire: Mapping[str, Any], mode: Any) -> dict[str, Any]:
    if found is None or mode == UpdateMode.REPLACE:
        return dict(wire)
    kept = {k: v for k, v in found.items() if k not in ("Timestamp", "odata.etag")}
    for name in [n for n in wire if not n.endswith("@odata.type")]:
        kept.pop(f"{name}@odata.type", None)
    kept.update(wire)
    return kept


def _entity(wire: Mapping[str, Any], select: Sequence[str] | None) -> Any:
    shown = dict(wire)
    if select:
        wanted = set(select)
        shown = {
            k: v for k, v in wire.items() if k in ("odata.etag", "Timestamp") or k.split("@", 1)[0] in wanted
        }
    return _convert_to_entity(shown)


class MemoryTables:
    """Settle's tables in memory, in the shape of ``common.tables.Tables``: ``table(name)`` and
    ``settings`` (prefix and names). ``gate``, when set, is called before every call of every table."""

    def __init__(self, prefix: str = "mem") -> None:
        from common.settings import TableSettings

        self.settings = TableSettings(
            connection_string=None, service_uri="memory://", client_id=None, prefix=prefix
        )
        self.lock = threading.RLock()
        self.counter = itertools.count(1)
        self.gate: Gate | None = None
        self._tables: dict[str, MemoryTable] = {}
        self._last = datetime.now(UTC)

    def table(self, name: str) -> MemoryTable:
        with self.lock:
            if name not in self._tables:
                self._tables[name] = MemoryTable(name, self)
            return self._tables[name]

    def enter(self, call: str, args: tuple[Any, ...]) -> None:
        gate = self.gate
        if gate is not None:
            gate(call, args)

    def stamp(self) -> datetime:
        """A write's Timestamp: the clock, never behind the last one (each ETag is new anyway)."""
        now = datetime.now(UTC)
        self._last = max(now, self._last)
        return self._last

    def new_id(self) -> str:
        return uuid.uuid4().hex
