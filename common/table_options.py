"""What a table call says about itself, and how its answer's body is read: shared by the table clients
(``common.tables``) and their retry policy (``common.table_retry``), so neither imports the other's module."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from common.errors import SERVER_BUSY

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


def refused_unreceived(http: Any) -> bool:
    """Storage's own 503 ``ServerBusy`` (its code in ``x-ms-error-code`` or, failing that, the body)."""
    if http.status_code != 503:
        return False
    code = http.headers.get("x-ms-error-code")
    if code is None:
        try:
            error = json.loads(response_body(http) or b"{}").get("odata.error") or {}
        except (ValueError, AttributeError):
            return False
        code = error.get("code") if isinstance(error, dict) else None
    return bool(code == SERVER_BUSY)
