"""Lock tokens: what a lock holder must present to write while it holds the lock (fencing).

A token names the lock (a random id stored on the head row) and carries what the holder's next write
needs to be a single round trip: the head's ETag and version at acquisition, when the lock was taken and
until when, and a digest of the record key (a token of another record is refused at once). The store
writes with ``If-Match: <etag>``, so the write succeeds only if nobody changed the record since the
token was issued; when the ETag is stale the store re-reads the head and compares the lock id.

Tokens are bearer capabilities: the head's ETag is never exposed by the API, and the lock id is 128
random bits.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from common.errors import LockLost
from state.model import RecordKey


def key_digest(key: RecordKey) -> str:
    raw = json.dumps(
        [
            key.tenant_id,
            int(key.scope),
            key.entity_id,
            key.entity_execution_id,
            key.item_entity_key,
            key.item_key,
            key.sub_item_entity_key,
            key.sub_item_key,
        ],
        ensure_ascii=True,
    )
    return hashlib.sha256(raw.encode("ascii")).hexdigest()[:16]


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True)
class LockToken:
    lock_id: str
    version: int
    etag: str
    locked_at: datetime
    locked_until: datetime
    key_digest: str
    created_at: datetime
    note: str | None = None

    def encode(self) -> str:
        body = {
            "i": self.lock_id,
            "n": self.version,
            "e": self.etag,
            "a": _ms(self.locked_at),
            "u": _ms(self.locked_until),
            "k": self.key_digest,
            "c": _ms(self.created_at),
        }
        if self.note:
            body["o"] = self.note
        raw = json.dumps(body, separators=(",", ":")).encode()
        return "v1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> LockToken:
        """Parse a token, or raise 409 ``lock-lost`` naming ``lockToken`` (a malformed or foreign token
        cannot hold any lock)."""
        try:
            if not text.startswith("v1."):
                raise ValueError("version")
            payload = text[3:]
            raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
            body = json.loads(raw)
            return cls(
                lock_id=str(body["i"]),
                version=int(body["n"]),
                etag=str(body["e"]),
                locked_at=_dt(int(body["a"])),
                locked_until=_dt(int(body["u"])),
                key_digest=str(body["k"]),
                created_at=_dt(int(body["c"])),
                note=body.get("o"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LockLost("The lock token is not one Settle issued.", field="lockToken") from exc
