"""The shapes of Azure Table REST requests, as the bench's proxies read them (:mod:`bench.proxy` counts
writes, :mod:`bench.throttle` charges partitions): a point path (one entity by its keys), a collection
path (a table, or ``Tables``, the listing), and an entity's keys in a JSON body."""

from __future__ import annotations

import json
import re

# ``/{account}/{table}(PartitionKey='…',RowKey='…')``: account, table, PartitionKey, RowKey (quotes doubled).
POINT = re.compile(r"^/([^/]+)/([^/(]+)\(PartitionKey='((?:[^']|'')*)',RowKey='((?:[^']|'')*)'\)$")
# ``/{account}/{table}`` or ``/{account}/{table}()``: account, table.
COLLECTION = re.compile(r"^/([^/]+)/([^/(]+)(\(\))?$")
PARTITION_KEY_JSON = re.compile(rb'"PartitionKey"\s*:\s*"((?:[^"\\]|\\.)*)"')
ROW_KEY_JSON = re.compile(rb'"RowKey"\s*:\s*"((?:[^"\\]|\\.)*)"')


def key_value(quoted: str) -> str:
    """A key as a path quotes it (``''`` for ``'``), unquoted."""
    return quoted.replace("''", "'")


def json_key(pattern: re.Pattern[bytes], body: bytes, start: int = 0, end: int | None = None) -> str | None:
    """The key ``pattern`` finds in a JSON body (between ``start`` and ``end``), decoded; None: none."""
    found = pattern.search(body, start, len(body) if end is None else end)
    return json.loads(b'"' + found.group(1) + b'"') if found else None
