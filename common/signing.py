"""Signed tokens: what Settle hands a caller and must be able to trust when it comes back.

A lock token or a continuation token travels through callers, so each one is signed with HMAC-SHA256
and verified (in constant time) before any of its fields is parsed. The key is 32 random bytes generated
once per storage account and table prefix and kept in a table of Settle's (the caller names it; the state
package uses ``statelocks``) under PartitionKey ``hmac``, RowKey ``v1``, Binary ``Key``: the first process
that needs it inserts one (insert-if-absent; a process that loses that race reads the winner's key), every
process reads it once and keeps it. So no secret
lives in app settings, and every instance of one deployment signs with the same key. Whoever can read
the data account could forge a token, but could equally write the records themselves.

A token is ``v2.<base64url(payload)>.<base64url(mac)>`` (no padding). The MAC covers a purpose label
(``lock``, ``page``) and the payload, so a token made for one purpose never passes as another.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets

from common.table_protocol import TableSource

KEY_PARTITION = "hmac"
KEY_ROW = "v1"
KEY_BYTES = 32
VERSION = "v2"

_BASE64URL = re.compile(r"^[A-Za-z0-9_-]*$")


def b64encode(raw: bytes) -> str:
    """Unpadded base64url."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def b64decode(text: str) -> bytes | None:
    """Strict inverse of :func:`b64encode`: None for anything it would not have produced."""
    if not _BASE64URL.match(text) or len(text) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if b64encode(raw) == text else None  # canonical only: no stray trailing bits


class Signer:
    """Signs and opens tokens with one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a signing key has {KEY_BYTES} bytes, not {len(key)}")
        self._key = key

    def _mac(self, purpose: str, payload: bytes) -> bytes:
        return hmac.new(self._key, purpose.encode("ascii") + b"\n" + payload, hashlib.sha256).digest()

    def sign(self, purpose: str, payload: bytes) -> str:
        return f"{VERSION}.{b64encode(payload)}.{b64encode(self._mac(purpose, payload))}"

    def open(self, purpose: str, token: str) -> bytes | None:
        """The payload of a token this key signed for ``purpose``, or None (nothing else is looked at)."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != VERSION:
            return None
        payload, mac = b64decode(parts[1]), b64decode(parts[2])
        if payload is None or mac is None:
            return None
        if not hmac.compare_digest(mac, self._mac(purpose, payload)):
            return None
        return payload


def load_signer(tables: TableSource, table_name: str) -> Signer:
    """The deployment's signer: reads the key, or creates it when nobody has (1 request, 2 the first time).

    Callers keep the result for the life of the process (the key never changes)."""
    from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

    table = tables.table(table_name)
    try:
        entity = table.get_entity(KEY_PARTITION, KEY_ROW)
    except ResourceNotFoundError:
        key = secrets.token_bytes(KEY_BYTES)
        try:
            table.create_entity({"PartitionKey": KEY_PARTITION, "RowKey": KEY_ROW, "Key": key})
            return Signer(key)
        except ResourceExistsError:  # another process was first: use its key
            entity = table.get_entity(KEY_PARTITION, KEY_ROW)
    value = entity.get("Key")
    if not isinstance(value, bytes | bytearray) or len(value) != KEY_BYTES:
        raise RuntimeError(f"the signing key row {KEY_PARTITION}/{KEY_ROW} in {table_name} is damaged")
    return Signer(bytes(value))
