"""What a table call says about itself, and how its answer's body is read: shared by the table clients
(``common.tables``) and their retry policy (``common.table_retry``), so neither imports the other's module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Passed to a write that must not be sent twice (``table.submit_transaction(ops, **RESEND_UNRECEIVED_ONLY)``):
# the retry policy sends it again only when storage refused it before receiving it (503 ServerBusy, a
# connection that never carried it); any other failure reaches the caller (``common/table_retry.py``).
RESEND_UNRECEIVED_ONLY: Mapping[str, Any] = {"resend_unreceived_only": True}


def response_body(http: Any) -> bytes:
    """An answer's body as read (empty when it is streamed and not read yet, or unreadable)."""
    try:
        body = http.body()
    except Exception:  # a streamed answer: nothing to check here
        return b""
    return body if isinstance(body, bytes) else b""
