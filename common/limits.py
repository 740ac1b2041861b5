"""What Table Storage accepts, counted the way it counts (so a value we accept can always be stored).

Limits (docs/tables.md; ``reference/idempotency-anchors.md`` §4.1): a String or Binary property holds at
most 64 KiB as documented, and the service rejects values over 64 KB (64,000 bytes), so Settle stays at
64,000 bytes: a string of at most 32,000 UTF-16 code units (an astral character counts two). An entity
holds at most 1 MiB (a transaction's body at most 4 MiB: Settle's largest, a head and a history row
of the largest record, is about 2 MB, measured by ``tests/state/test_boundaries.py``); Int32
properties hold up to 2^31-1, anything larger must be stored as Int64. Azurite is looser on every one
of these, so they are enforced here.

Entity size follows the service's published estimate: 4 bytes + 2 per key character + for each property
8 bytes + 2 per name character + the value (String 4 + 2 per UTF-16 unit, Binary 4 + its bytes, DateTime,
Double and Int64 8, Int32 4, Bool 1, Guid 16).

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

MAX_PROPERTY_BYTES = 64_000
MAX_TEXT_UNITS = MAX_PROPERTY_BYTES // 2
MAX_ENTITY_BYTES = 1024 * 1024
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def utf16_units(text: str) -> int:
    """How many UTF-16 code units ``text`` takes (how the service counts strings)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def value_size(value: Any) -> int:
    if isinstance(value, str):
        return 4 + 2 * utf16_units(value)
    if isinstance(value, bytes | bytearray):
        return 4 + len(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 4 if -(2**31) <= value <= INT32_MAX else 8
    if isinstance(value, float | datetime):
        return 8
    inner = getattr(value, "value", None)  # azure.data.tables.EntityProperty (e.g. an Int64)
    if inner is not None:
        return max(8, value_size(inner))
    return 16


def entity_size(entity: dict[str, Any]) -> int:
    """The service's size estimate of ``entity`` in bytes (keys included)."""
    size = 4 + 2 * (
        utf16_units(str(entity.get("PartitionKey", ""))) + utf16_units(str(entity.get("RowKey", "")))
    )
    for name, value in entity.items():
        if name in ("PartitionKey", "RowKey") or value is None:
            continue
        size += 8 + 2 * len(name) + value_size(value)
    return size


def int64(value: int) -> Any:
    """``value`` typed Edm.Int64 (the SDK refuses Python ints beyond Int32 otherwise)."""
    from azure.data.tables import EdmType, EntityProperty

    return EntityProperty(value, EdmType.INT64)


def plain_int(value: Any) -> int:
    """An integer property as read back (Int64 comes back wrapped in an ``EntityProperty``)."""
    inner = getattr(value, "value", value)
    return int(inner)
