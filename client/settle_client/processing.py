"""The item inside ``with client.processing(key) as item:`` and the rules of leaving that block.

The seeds' TryAcquireLock → act → Set pattern, decided here without I/O:

* entering takes the lock (``requestId`` generated, so a retry after a lost answer gets the same lock);
  a refusal raises :class:`AlreadyProcessed` (Processed/Skipped) or :class:`LockHeld`;
* while inside, the lock is extended in the background every third of its length, timed from when each
  request was sent (never from the server's clock, so clock skew cannot make it late);
* leaving normally records Processed with ``item.data`` (or Skipped / Failed when ``item.skip`` /
  ``item.fail`` was called), fenced by the lock token;
* leaving with an exception releases the lock as Failed with the exception's text and re-raises it;
* if an extension answered ``lock-lost``, ``item.lost`` is true and leaving raises :class:`LockLost`
  instead of recording: nothing is written with a token that no longer holds the lock.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from settle_client._calls import Call, Requests, error_text, jsonable
from settle_client.enums import EXISTS_STATUSES, Status
from settle_client.errors import (
    AlreadyProcessed,
    InvalidInput,
    LockHeld,
    LockLost,
    LockNotAcquired,
    PayloadTooLarge,
    SettleError,
)
from settle_client.models import ExtendResult, Key, LockResult, Metadata, Record

# Extend after this share of the lock's length; after a failed extension, try again after RETRY_SHARE.
EXTEND_SHARE = 1 / 3
RETRY_SHARE = 1 / 10
MIN_RETRY_S = 0.2


class Item:
    """The item being processed. Set ``data`` (JSON) to record it; call :meth:`skip` or :meth:`fail` to
    record Skipped or Failed instead. After the block, ``record`` is what was written."""

    def __init__(self, key: Key, lock: LockResult, *, metadata: Metadata | None = None) -> None:
        self.key = key
        self.takeover = lock.takeover  # the previous holder's lock expired: it may have done part of the work
        self.replayed = lock.replayed
        self.metadata = metadata
        self.record: Record | None = None
        self._data: Any = None
        self._outcome = Status.PROCESSED
        self._reason: str | None = None
        self._guard = threading.Lock()
        self._token = lock.lock_token
        self._locked_until = lock.locked_until
        self._lost: LockLost | None = None

    @property
    def data(self) -> Any:
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        self._data = jsonable(value)  # fail here, inside the block, rather than when recording

    def skip(self, reason: str) -> None:
        """Record Skipped (terminal) with ``reason`` as its substatus when the block ends."""
        self._outcome, self._reason = Status.SKIPPED, reason

    def fail(self, error: str) -> None:
        """Record Failed (retryable) with ``error`` when the block ends, without raising."""
        self._outcome, self._reason = Status.FAILED, error

    @property
    def lock_token(self) -> str | None:
        """The newest token of the lock (opaque; ``None`` for the null handler)."""
        with self._guard:
            return self._token

    @property
    def locked_until(self) -> datetime | None:
        """Until when the lock holds, by the server's clock (moves with each extension)."""
        with self._guard:
            return self._locked_until

    @property
    def lost(self) -> bool:
        """True once an extension was answered ``lock-lost``: stop working, the block will raise."""
        with self._guard:
            return self._lost is not None

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock was lost (call between steps of long work)."""
        with self._guard:
            lost = self._lost
        if lost is not None:
            raise lost

    # -- used by the keepers ----------------------------------------------------------------------
    def extended(self, result: ExtendResult) -> None:
        with self._guard:
            self._token, self._locked_until = result.lock_token, result.locked_until

    def lose(self, error: LockLost) -> None:
        with self._guard:
            if self._lost is None:
                self._lost = error


def refusal(lock: LockResult) -> LockNotAcquired:
    """The exception for a lock the server refused."""
    reason = lock.reason or f"The lock was not acquired (the record is {lock.status})."
    try:
        status = Status.parse(lock.status)
    except ValueError:
        status = None
    if status in EXISTS_STATUSES:
        return AlreadyProcessed(reason, record_status=lock.status)
    if status is Status.PROCESSING:
        return LockHeld(reason, record_status=lock.status, locked_until=lock.locked_until)
    return LockNotAcquired(reason, record_status=lock.status, locked_until=lock.locked_until)


def outcome_call(requests: Requests, item: Item) -> Call[Record | None]:
    """The write that records a block that ended normally."""
    return requests.set(
        item.key,
        item._outcome,
        data=item.data,
        metadata=item.metadata,
        substatus=item._reason if item._outcome is Status.SKIPPED else None,
        error=item._reason if item._outcome is Status.FAILED else None,
        lock_token=item.lock_token,
    )


def release_call(requests: Requests, item: Item, exc: BaseException) -> Call[Record | None]:
    """The write that releases the lock of a block that raised."""
    return requests.release(item.key, error_text(exc), lock_token=item.lock_token)


def extension_delay(lock_seconds: float) -> float:
    return lock_seconds * EXTEND_SHARE


def retry_delay(lock_seconds: float) -> float:
    return max(MIN_RETRY_S, lock_seconds * RETRY_SHARE)


def rejected(error: SettleError) -> bool:
    """Did Settle refuse the outcome itself (bad input, too large)? Then nothing was written and the
    lock is released at once with the reason, instead of hanging until it expires."""
    return isinstance(error, InvalidInput | PayloadTooLarge)


UNRECORDED_NOTE = (
    "settle-client: the outcome was not recorded; the lock expires after lock_seconds and the item "
    "can then be processed again."
)
