"""Lock tokens: what a lock holder presents to write while it holds the lock (fencing).

A token carries the whole Processing version it was issued for (lock id, version, the head's ETag, when
it was locked, until when, the version's ``updatedAt`` and ``createdAt``, who locked it: source app and
execution, the handler's retention, the takeover substatus and note, the lock's requestId) and a
digest of the record key. With it the fenced write is one transaction: ``If-Match`` the ETag replaces the
head, and the superseded version's history row is rebuilt from the token exactly as it was stored (the
ETag match proves the head is that version). An extension rewrites that version in place (no history
row): its token carries the new ETag, ``updatedAt`` and until; an older token of the same lock still
holds it (the lock id decides, after one re-read).

Tokens are signed (``common/signing.py``): the MAC is checked before a field is read, so an edited,
truncated or foreign token holds no lock. The payload is then validated strictly (types, ranges): a bad
one can only come from our own bug, and is refused like a forgery.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.clock import from_epoch_ms
from common.errors import LockLost
from common.limits import INT32_MAX
from common.signing import Signer
from state.model import MAX_RETENTION_SECONDS, RecordKey

PURPOSE = "lock"
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

_Ms = Annotated[int, Field(ge=0, le=MAX_MS)]
_Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]


def key_digest(key: RecordKey) -> str:
    """128 bits of SHA-256 over the record's identity: binds a token (or a page) to one record."""
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
    return hashlib.sha256(raw.encode("ascii")).hexdigest()[:32]


class LockClaims(BaseModel):
    """The signed payload. On the wire each claim has a one-letter alias (the token stays short); in
    code it has its name. The aliases and their order are the token format: tokens issued before the
    names existed verify and read the same."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, validate_by_name=True)

    lock_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] = Field(alias="i")
    key_digest: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] = Field(alias="k")
    version: Annotated[int, Field(ge=1, le=INT32_MAX)] = Field(alias="n")
    etag: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$")] = Field(alias="e")
    locked_at_ms: _Ms = Field(alias="a")
    locked_until_ms: _Ms = Field(alias="u")
    updated_at_ms: _Ms = Field(alias="w")  # of this version
    created_at_ms: _Ms = Field(alias="c")  # of the record
    handler_key: Annotated[str, Field(min_length=1, max_length=32)] = Field(alias="h")
    source_app_id: _Int32 | None = Field(default=None, alias="s")  # of the locker
    entity_execution_id: _Int32 | None = Field(default=None, alias="x")  # of the locker
    retention_seconds: Annotated[int, Field(ge=1, le=MAX_RETENTION_SECONDS)] | None = Field(
        default=None, alias="t"
    )
    substatus: Annotated[str, Field(max_length=64)] | None = Field(default=None, alias="b")  # LockTakenOver
    note: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, alias="o"
    )  # the lock taken over
    request_id: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, alias="q"
    )  # lock's requestId

    @property
    def locked_until(self) -> datetime:
        return from_epoch_ms(self.locked_until_ms)

    def encode(self, signer: Signer) -> str:
        raw = json.dumps(
            self.model_dump(by_alias=True, exclude_none=True), separators=(",", ":"), ensure_ascii=True
        )
        return signer.sign(PURPOSE, raw.encode("ascii"))

    @classmethod
    def decode(cls, text: str, signer: Signer) -> LockClaims:
        """The claims of a token Settle signed, or 409 ``lock-lost`` naming ``lockToken``."""
        payload = signer.open(PURPOSE, text)
        if payload is None:
            raise LockLost("The lock token is not one Settle issued (or it was changed).", field="lockToken")
        try:
            return cls.model_validate_json(payload)
        except ValidationError as exc:
            raise LockLost("The lock token is not one Settle issued.", field="lockToken") from exc
