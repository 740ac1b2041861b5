"""The stored data: the seeds' standard envelope, serialised and split across Table properties.

Callers send ``data`` (any JSON) and whatever ``metadata`` they have; Settle fills the rest of
``metadata`` and the whole ``idempotencyInfo``. The envelope is stored as UTF-8 JSON in Binary
properties of at most 64,000 bytes each (the real service rejects String/Binary values over 64 KB), so a
record holds up to :data:`MAX_DATA_BYTES` while its row stays under the 1 MiB entity limit.
"""

from __future__ import annotations

import json
from typing import Any

from common.clock import iso, utcnow
from common.errors import PayloadTooLarge
from state.model import RecordKey, Status

MAX_DATA_BYTES = 512 * 1024
CHUNK_BYTES = 64_000
DATA_PREFIX = "Data"
ENVELOPE_VERSION = "1.0"


def build_envelope(
    *,
    key: RecordKey,
    status: Status,
    data: Any,
    metadata: dict[str, Any] | None,
    handler_key: str,
    execution_id: int | None = None,
) -> dict[str, Any]:
    """The envelope of one write. ``execution_id``: the run that writes it (the request key's
    ``entityExecutionId``, sent for every scope); it wins over a caller's ``metadata.executionId``."""
    meta: dict[str, Any] = {
        "nodeType": None,
        "elementKey": None,
        "executionId": None,
        "runAt": iso(utcnow()),
        "version": ENVELOPE_VERSION,
    }
    meta.update({k: v for k, v in (metadata or {}).items() if v is not None})
    run = execution_id if execution_id is not None else key.entity_execution_id
    if run is not None:
        meta["executionId"] = run
    meta["handlerKey"] = handler_key
    return {
        "metadata": meta,
        "idempotencyInfo": {
            "itemKey": key.item_key,
            "itemEntityKey": key.item_entity_key,
            "subItemKey": key.sub_item_key,
            "subItemEntityKey": key.sub_item_entity_key,
            "scope": key.scope.code,
            "status": status.label,
        },
        "data": data,
    }


def encode(envelope: dict[str, Any]) -> dict[str, Any]:
    """Serialise into ``Data0..DataN`` properties, or raise 413 beyond the limit."""
    raw = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(raw) > MAX_DATA_BYTES:
        raise PayloadTooLarge(
            f"The stored data would be {len(raw)} bytes; the limit is {MAX_DATA_BYTES} bytes "
            f"({MAX_DATA_BYTES // 1024} KiB) of UTF-8 JSON including the envelope.",
            field="data",
            limitBytes=MAX_DATA_BYTES,
        )
    chunks = [raw[i : i + CHUNK_BYTES] for i in range(0, len(raw), CHUNK_BYTES)]
    props: dict[str, Any] = {f"{DATA_PREFIX}{i}": chunk for i, chunk in enumerate(chunks)}
    props["DataChunks"] = len(chunks)
    return props


def decode(entity: dict[str, Any]) -> Any:
    count = int(entity.get("DataChunks") or 0)
    if count == 0:
        return None
    raw = b"".join(bytes(entity[f"{DATA_PREFIX}{i}"]) for i in range(count))
    return json.loads(raw.decode("utf-8", "surrogatepass"))


def data_properties(entity: dict[str, Any]) -> dict[str, Any]:
    """The data properties of a stored row, to copy into its history row unchanged."""
    count = int(entity.get("DataChunks") or 0)
    props: dict[str, Any] = {f"{DATA_PREFIX}{i}": entity[f"{DATA_PREFIX}{i}"] for i in range(count)}
    props["DataChunks"] = count
    return props
