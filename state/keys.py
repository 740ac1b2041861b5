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

    Index rows (level 2 of the expiry index, ``state/expiry.py``) share the partition of the records they
    point at, so they are written in the same transaction as the head: ``~{kind}|{minute}|{ms}|{id}``
    (``l`` a lock's expiry, ``r`` a retention deadline) and the minute's markers
    ``~{kind}|{minute}|m{nonce}``.
    ``~`` is escaped inside item paths, so no record row starts with it; record reads that span a
    partition exclude the range [``~``, ``~~``).

Sharded partitions (``SETTLE_STATE_SHARDS``, default 1)
    With ``S`` > 1 shards a node definition's records spread over ``S`` partitions
    ``{tenantId}|{scopeId}|{entityId}.{S:03d}-{shard:03d}``; the shard is derived from the record's item
    path (:func:`shard_of`), so every row of one record (head, history, index rows) stays in one
    partition and one entity group transaction. ``S`` is part of the PartitionKey: a record keeps the
    partition it was created in, and a deployment that changes ``S`` keeps reading its earlier values,
    so that records of the earlier layouts are still found (a head read that misses
    probes them, a lock on a key new to the instance reads before inserting). The layout in force is the
    one recorded in storage (``common/layouts.py``: family ``state``); ``SETTLE_STATE_SHARDS`` and
    ``SETTLE_STATE_SHARDS_PREVIOUS`` only seed a deployment's first record of it. ``S`` = 1
    is the unsharded key. Every layout of one node sorts inside [``{t}|{s}|{e}``, ``{t}|{s}|{e}/``)
    (``.`` and ``/`` sort below the digits), so a query of a node is one PartitionKey range read.

``statelocks`` table (level 1 of the expiry index)
    PartitionKey ``{kind}{minute:010d}``, RowKey = the state PartitionKey: which partitions hold index rows
    of that minute. Catch-up range-reads the minutes that have begun, so its cost follows expired locks
    and the partitions that hold them, not the table.

Text components are escaped by :func:`common.keys.escape` (injective, so distinct keys never collide
and every key round-trips); keys are at most 1 KiB.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

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

# Index rows (see the module docstring).
INDEX_MARK = "~"
INDEX_END = INDEX_MARK * 2  # exclusive upper bound of the index rows: index kinds are lowercase letters
LOCK_KIND = "l"
RETENTION_KIND = "r"
BUCKET_MS = 60_000
# A marker's RowKey ends ``{mark}{nonce}``. ``n``: a lock minute's marker, which carries its lock entries
# (ADR-0021); ``m``: a retention minute's marker, and a lock minute's written before ADR-0021 (no entries,
# still read and closed). The marks differ so that a catch-up of the earlier code, which reads an ``n`` row
# as an index row without ``StateRK`` and stops, can never delete a marker whose entries it cannot read.
MARKER_MARK = "n"
LEGACY_MARKER_MARK = "m"
MARKER_MARKS = (MARKER_MARK, LEGACY_MARKER_MARK)


def partition_key(tenant_id: int, scope: Scope | int, entity_id: int) -> str:
    return f"{tenant_id}{SEPARATOR}{int(scope)}{SEPARATOR}{entity_id}"


SHARD_MARK = "."
SHARD_END = chr(ord(SHARD_MARK) + 1)  # "/": the exclusive upper bound of a node's partitions
MAX_SHARDS = 999
ACCOUNT_MARK = "-a"
SHARDS_SETTING = "SETTLE_STATE_SHARDS"
PREVIOUS_SHARDS_SETTING = "SETTLE_STATE_SHARDS_PREVIOUS"


def shard_of(path: str, shards: int) -> int:
    """The shard of a record (its item path): stable across processes and versions (SHA-256)."""
    if shards <= 1:
        return 0
    digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def sharded_partition_key(
    tenant_id: int, scope: Scope | int, entity_id: int, shards: int, shard: int, accounts: int = 1
) -> str:
    """The partition of shard ``shard`` of ``shards``; with several accounts it names its account
    (``-a{shard mod accounts}``), so the shard -> account map is fixed and read from the key itself."""
    base = partition_key(tenant_id, scope, entity_id)
    if shards <= 1:
        return base
    account = f"{ACCOUNT_MARK}{shard % accounts}" if accounts > 1 else ""
    return f"{base}{SHARD_MARK}{shards:03d}-{shard:03d}{account}"


def account_of(partition: str) -> int:
    """The storage account (0, 1, ...) a state partition lives in: named by its key, else 0."""
    tail = partition.rsplit(SHARD_MARK, 1)[-1] if SHARD_MARK in partition else ""
    if ACCOUNT_MARK in tail:
        return int(tail.rsplit(ACCOUNT_MARK, 1)[1])
    return 0


def node_partition_range(tenant_id: int, scope: Scope | int, entity_id: int) -> tuple[str, str]:
    """PartitionKey bounds [low, high) of every partition of one node definition, in every layout."""
    base = partition_key(tenant_id, scope, entity_id)
    return base, base + SHARD_END


@dataclass(frozen=True)
class Layout:
    """How many partitions a node definition's records spread over (now, and in earlier layouts)."""

    shards: int = 1
    previous: tuple[int | tuple[int, int], ...] = ()  # S, or (S, accounts) of an earlier layout
    accounts: int = 1  # storage accounts the state table is spread over (shard mod accounts)

    def __post_init__(self) -> None:
        for value in (self.shards, *(p if isinstance(p, int) else p[0] for p in self.previous)):
            if not 1 <= value <= MAX_SHARDS:
                raise ValueError(f"{SHARDS_SETTING} must be between 1 and {MAX_SHARDS}; got {value}")
        if self.accounts < 1:
            raise ValueError("a layout needs at least one storage account")

    @property
    def era(self) -> int:
        """The index of this layout among the recorded ones: how many came before it (``common/fence.py``)."""
        return len(self.previous)

    @property
    def single(self) -> bool:
        """One partition per node and no earlier layout: the unsharded key, read with ``eq``."""
        return self.shards == 1 and not self.previous

    def partition(self, key: RecordKey) -> str:
        """The partition a record created now goes to."""
        return self._at(key, self.shards, self.accounts)

    def earlier_partitions(self, key: RecordKey) -> list[str]:
        """Where a record created under an earlier layout may be (probed when the current one misses)."""
        now = self.partition(key)
        seen: list[str] = []
        for earlier in self.previous:
            shards, accounts = (earlier, 1) if isinstance(earlier, int) else earlier
            pk = self._at(key, shards, accounts)
            if pk != now and pk not in seen:
                seen.append(pk)
        return seen

    @staticmethod
    def _at(key: RecordKey, shards: int, accounts: int) -> str:
        shard = shard_of(item_path(key), shards)
        return sharded_partition_key(key.tenant_id, key.scope, key.entity_id, shards, shard, accounts)

    @classmethod
    def of_eras(cls, current: tuple[int, int], earlier: Sequence[tuple[int, int]]) -> Layout:
        """The layout of a recorded era (shards, accounts) and the earlier ones still read."""
        return cls(current[0], tuple((s, a) for s, a in earlier), accounts=current[1])

    def eras(self) -> list[tuple[int, int]]:
        """This layout as (shards, accounts) eras, oldest first: what a first deployment records."""
        earlier = [(p, 1) if isinstance(p, int) else p for p in self.previous]
        return [*earlier, (self.shards, self.accounts)]

    @classmethod
    def from_env(cls, accounts: int = 1) -> Layout:
        """``SETTLE_STATE_SHARDS`` (default 1) and ``SETTLE_STATE_SHARDS_PREVIOUS`` (comma-separated; an
        earlier layout over several accounts is written ``S@N``)."""
        shards = (os.environ.get(SHARDS_SETTING) or "1").strip()
        previous = (os.environ.get(PREVIOUS_SHARDS_SETTING) or "").replace(";", ",")

        def earlier(text: str) -> int | tuple[int, int]:
            count, _, over = text.strip().partition("@")
            return (int(count), int(over)) if over else int(count)

        try:
            return cls(
                int(shards), tuple(earlier(p) for p in previous.split(",") if p.strip()), accounts=accounts
            )
        except ValueError as exc:
            raise ValueError(
                f"{SHARDS_SETTING} must be a whole number of shards (1-{MAX_SHARDS}) and "
                f"{PREVIOUS_SHARDS_SETTING} a comma-separated list of earlier ones: {exc}"
            ) from exc


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


def bucket_of(ms: int) -> int:
    """The expiry minute (epoch minutes) of an instant in epoch milliseconds."""
    return ms // BUCKET_MS


def index_row_key(kind: str, ms: int, ident: str) -> str:
    """RowKey of the index row of lock/deadline ``ident`` that falls due at ``ms``."""
    return f"{INDEX_MARK}{kind}{SEPARATOR}{bucket_of(ms):010d}{SEPARATOR}{ms:013d}{SEPARATOR}{ident}"


def parse_index_row_key(row_key: str) -> tuple[str, int, int]:
    """(kind, minute, ms) of an index RowKey."""
    head, bucket, ms, _ = row_key.split(SEPARATOR, 3)
    return head[len(INDEX_MARK) :], int(bucket), int(ms)


def marker_row_key(kind: str, bucket: int, nonce: str) -> str:
    mark = MARKER_MARK if kind == LOCK_KIND else LEGACY_MARKER_MARK
    return f"{INDEX_MARK}{kind}{SEPARATOR}{bucket:010d}{SEPARATOR}{mark}{nonce}"


def parse_marker_row_key(row_key: str) -> tuple[str, int, str]:
    """(kind, minute, nonce) of a marker RowKey."""
    head, bucket, last = row_key.split(SEPARATOR, 2)
    return head[len(INDEX_MARK) :], int(bucket), last[1:]


def is_marker(row_key: str) -> bool:
    """A marker's RowKey, of either mark (``n`` or ``m``)."""
    return row_key.rsplit(SEPARATOR, 1)[-1].startswith(MARKER_MARKS)


def bucket_range(kind: str, bucket: int) -> tuple[str, str]:
    """RowKey bounds [low, high) of every index row and marker of one minute."""
    prefix = f"{INDEX_MARK}{kind}{SEPARATOR}{bucket:010d}{SEPARATOR}"
    return prefix, prefix + INDEX_MARK


def due_range(kind: str, bucket: int, now_ms: int) -> tuple[str, str]:
    """RowKey bounds of the index rows of one minute due at ``now_ms`` (markers excluded)."""
    prefix = f"{INDEX_MARK}{kind}{SEPARATOR}{bucket:010d}{SEPARATOR}"
    return prefix, f"{prefix}{now_ms:013d}{SEPARATOR}{INDEX_MARK}"


def level1_partition(kind: str, bucket: int) -> str:
    return f"{kind}{bucket:010d}"


def parse_level1_partition(partition: str) -> tuple[str, int]:
    return partition[:1], int(partition[1:])
