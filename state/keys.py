"""Table key layout of the state tables: the one place that decides it (see docs/tables.md).

``state`` table
    PartitionKey ``{tenantId}|{scopeId}|{entityId}``: every record of one node definition (scope anchor)
    shares a partition, so all rows of one record key sit together (entity group transactions) and a
    query by tenant/scope/entity is a partition or partition-range read. Execution ids (scopes 5-7) go in
    the RowKey, so a new workflow run does not make a new partition.
    RowKey ``{item}|c`` is the record's head (its current version, point-read by exists/get);
    ``{item}|h{inverted version}`` are superseded versions, newest first right after the head, so one
    range read returns a record's whole history in order.
    ``{item}`` = ``[{entityExecutionId}|]{itemEntityKey}|{itemKey}|{subItemEntityKey}|{subItemKey}``,
    each text component escaped by :func:`escape`.

``statelocks`` table (lock-expiry and retention index, see ``state/expiry.py``)
    PartitionKey ``{kind}{epoch minute of expiry}``; RowKey ``{expiry epoch ms}|{token}``. Catch-up
    range-reads only rows whose expiry has passed, so its cost grows with expired locks, not the table.

Text components are escaped by :func:`common.keys.escape` (injective, so distinct keys never collide
and every key round-trips); keys are at most 1 KiB.
"""

from __future__ import annotations

from common.errors import KeyTooLong
from common.keys import MAX_KEY_BYTES as MAX_KEY_BYTES
from common.keys import escape as escape
from common.keys import key_bytes
from common.keys import unescape as unescape
from state.model import RecordKey, Scope

STATE_TABLE = "state"
EXPIRY_TABLE = "statelocks"

SEPARATOR = "|"
HEAD_SUFFIX = "|c"
HISTORY_MARK = "|h"
# One above the separator: the exclusive upper bound of a prefix range.
PREFIX_END = chr(ord(SEPARATOR) + 1)
VERSION_DIGITS = 19
MAX_VERSION = 10**VERSION_DIGITS - 1


def partition_key(tenant_id: int, scope: Scope | int, entity_id: int) -> str:
    return f"{tenant_id}{SEPARATOR}{int(scope)}{SEPARATOR}{entity_id}"


def tenant_prefix(tenant_id: int, scope: Scope | int | None = None) -> str:
    """The PartitionKey prefix of a tenant (and scope), ending with the separator."""
    if scope is None:
        return f"{tenant_id}{SEPARATOR}"
    return f"{tenant_id}{SEPARATOR}{int(scope)}{SEPARATOR}"


def item_path(key: RecordKey) -> str:
    parts = [
        escape(key.item_entity_key),
        escape(key.item_key),
        escape(key.sub_item_entity_key),
        escape(key.sub_item_key),
    ]
    if key.scope.is_execution:
        parts.insert(0, str(key.entity_execution_id))
    return SEPARATOR.join(parts)


def head_row_key(key: RecordKey) -> str:
    return item_path(key) + HEAD_SUFFIX


def history_row_key(key: RecordKey, version: int) -> str:
    return history_row_key_of(head_row_key(key), version)


def history_row_key_of(head_key: str, version: int) -> str:
    """The RowKey of version ``version`` of the record whose head RowKey is ``head_key``."""
    path = head_key[: -len(HEAD_SUFFIX)]
    return f"{path}{HISTORY_MARK}{MAX_VERSION - version:0{VERSION_DIGITS}d}"


def record_range(key: RecordKey) -> tuple[str, str]:
    """RowKey bounds [low, high) of every row of one record: head first, then history newest first."""
    path = item_path(key)
    return path + SEPARATOR, path + PREFIX_END


def item_entity_range(item_entity_key: str, execution_id: int | None = None) -> tuple[str, str]:
    """RowKey bounds of every row whose itemEntityKey (and execution, for scopes 5-7) is given."""
    prefix = escape(item_entity_key)
    if execution_id is not None:
        prefix = f"{execution_id}{SEPARATOR}{prefix}"
    return prefix + SEPARATOR, prefix + PREFIX_END


def check_key_size(key: RecordKey) -> None:
    """Raise a 400 naming the field when the longest RowKey of ``key`` exceeds the Table limit."""
    longest = history_row_key(key, MAX_VERSION)
    if key_bytes(longest) <= MAX_KEY_BYTES:
        return
    fields = {
        "key.itemKey": key.item_key,
        "key.itemEntityKey": key.item_entity_key,
        "key.subItemKey": key.sub_item_key,
        "key.subItemEntityKey": key.sub_item_entity_key,
    }
    field = max(fields, key=lambda name: key_bytes(escape(fields[name])))
    raise KeyTooLong(
        f"The item fields together are too long for a Table Storage key: {key_bytes(longest)} bytes "
        f"encoded (UTF-16) against a limit of {MAX_KEY_BYTES}; shorten {field}.",
        field=field,
        limitBytes=MAX_KEY_BYTES,
    )


def parse_row_key(row_key: str, scope: Scope) -> dict[str, object]:
    """Decode a head or history RowKey back into its key fields (inverse of :func:`item_path`)."""
    path = row_key.rsplit(SEPARATOR, 1)[0]
    parts = path.split(SEPARATOR)
    fields: dict[str, object] = {}
    if scope.is_execution:
        fields["entity_execution_id"] = int(parts.pop(0))
    item_entity, item, sub_entity, sub = (unescape(p) for p in parts)
    fields.update(
        item_entity_key=item_entity, item_key=item, sub_item_entity_key=sub_entity, sub_item_key=sub
    )
    return fields
