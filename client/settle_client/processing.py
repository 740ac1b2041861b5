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
  instead of recording: nothing is written with a token that no longer holds the lock;
* an outcome write that finds Settle unavailable is retried (the lock extended meanwhile) until the lock
  is close to expiry, at most one lock length after leaving: a fenced write is safe to repeat, and giving
  up early would have the whole job done again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

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
    TransportFailure,
    Unavailable,
)
from settle_client.models import (
    ExtendResult,
    Key,
    LockResult,
    Metadata,
    MetadataLike,
    PreviousAttempt,
    Record,
)
from settle_client.retry import RetryPolicy

log = logging.getLogger("settle_client")

# Extend after this share of the lock's length; after a failed extension, try again after RETRY_SHARE.
EXTEND_SHARE = 1 / 3
RETRY_SHARE = 1 / 10
MIN_RETRY_S = 0.2


class Item:
    """The item being processed. Set ``data`` (JSON) to record it; call :meth:`skip` or :meth:`fail` to
    record Skipped or Failed instead. After the block, ``record`` is what was written."""

    def __init__(
        self,
        key: Key,
        lock: LockResult,
        *,
        metadata: Metadata | None = None,
        expires_at: float | None = None,
    ) -> None:
        self.key = key
        self.takeover = (
            lock.takeover
        )  # this lock took an expired one over (see ``previous`` for catch-up too)
        self.replayed = lock.replayed
        # How the attempt before this one ended: status, error, and whether its lock expired.
        self.previous: PreviousAttempt | None = lock.previous_attempt
        self.metadata = metadata
        self.record: Record | None = None
        self._data: Any = None
        self._outcome = Status.PROCESSED
        self._reason: str | None = None
        self._substatus: str | None = None  # of a Processed outcome (``@idempotent``'s payload hash)
        self._unstored: tuple[str, Any] | None = None  # (substatus, data) if Settle refuses the data
        # When the lock runs out by this process's monotonic clock (moved by each extension).
        self._expires_at = expires_at if expires_at is not None else float("inf")
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
    def previous_expired(self) -> bool:
        """True when the previous attempt's lock expired before it recorded an outcome (its holder
        crashed, was stopped or lost the lock): it may have done part of the work. Taken over by this
        lock or concluded Failed by catch-up first, alike."""
        return self.previous is not None and self.previous.lock_expired

    @property
    def expires_at(self) -> float:
        """When the lock runs out by ``time.monotonic()`` (timed from when the lock or extension was sent)."""
        with self._guard:
            return self._expires_at

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
    def extended(self, result: ExtendResult, expires_at: float | None = None) -> None:
        with self._guard:
            self._token, self._locked_until = result.lock_token, result.locked_until
            if expires_at is not None:
                self._expires_at = max(self._expires_at, expires_at)

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
        substatus=item._reason if item._outcome is Status.SKIPPED else item._substatus,
        error=item._reason if item._outcome is Status.FAILED else None,
        lock_token=item.lock_token,
    )


def unstored_call(requests: Requests, item: Item, error: SettleError) -> Call[Record | None] | None:
    """``@idempotent``: when Settle refused the result (400/413) after the side effect, record the key
    Processed without it (so it is not run again); ``None`` when the block did not ask for that."""
    if item._unstored is None or item._outcome is not Status.PROCESSED:
        return None
    substatus, data = item._unstored
    item._unstored = None
    reason = data if isinstance(data, str) else f"Settle refused it: {error}"
    return requests.set(
        item.key,
        Status.PROCESSED,
        data={"resultNotStored": reason},
        metadata=item.metadata,
        substatus=substatus,
        lock_token=item.lock_token,
    )


def outcome_wait(
    item: Item, error: SettleError, *, left_at: float, lock_seconds: float, attempt: int, policy: RetryPolicy
) -> float | None:
    """Seconds to wait before sending the outcome again after ``error`` (the call's own retries are
    spent), or ``None`` to give up: only while Settle is unavailable, and only until the lock is close
    to expiry (a margin of :func:`retry_delay`), at most one lock length after the block was left."""
    if not isinstance(error, Unavailable | TransportFailure):
        return None
    deadline = min(item.expires_at, left_at + lock_seconds) - retry_delay(lock_seconds)
    wait = policy.backoff_for(min(attempt, 8))
    if isinstance(error, Unavailable) and error.retry_after is not None:
        wait = max(wait, error.retry_after)
    wait = max(wait, 0.05)
    if time.monotonic() + wait >= deadline:
        return None
    return wait


class _Client(Protocol):
    """What a block needs of its client besides sending: the calls' builder and the retry policy."""

    requests: Requests
    retry: RetryPolicy


C = TypeVar("C", bound=_Client)
K = TypeVar("K")


class Block(Generic[C, K]):
    """What a processing block of either client holds: the client ``C`` it sends through, the key, the
    lock's length and the metadata (checked here, so a bad field fails before the lock is asked for); once
    entered, its item and the keeper ``K`` extending its lock (``None`` while it holds none)."""

    # What leaving with an exception notes instead of releasing a lock the block no longer holds.
    _lost_note = "settle-client: the lock had been lost; it was not released."

    def __init__(self, client: C, key: Key, *, lock_seconds: int, metadata: MetadataLike | None) -> None:
        if lock_seconds < 1:
            raise ValueError("lock_seconds must be at least 1")
        self._client = client
        self._key = key
        self._lock_seconds = lock_seconds
        self._metadata = Metadata.of(metadata)
        self._item: Item | None = None
        self._keeper: K | None = None

    def _leaving(self, item: Item, exc: BaseException | None) -> Steps:
        """The steps of leaving the block with ``item`` (see :func:`leaving`)."""
        client = self._client
        return leaving(
            client.requests,
            item,
            exc,
            lock_seconds=self._lock_seconds,
            policy=client.retry,
            lost_note=self._lost_note,
        )


@dataclass(frozen=True)
class Release:
    """A step of leaving: send ``call``, a release, even when the task leaving is being cancelled."""

    call: Call[Record | None]


# A step of leaving a block, for a client to take (see :class:`Steps`): a call to send, a release to send,
# or seconds to sleep.
Step = Call[Any] | Release | float


class Steps:
    """The steps of leaving a block, one at a time: :meth:`next` is the step to take (``None``: done);
    the answer of a call goes back with :meth:`answered`, its :class:`SettleError` with :meth:`failed`
    (each client only sends and sleeps). A step raising (the error the block ends with) raises here."""

    def __init__(self, steps: Generator[Step, Any, None]) -> None:
        self._steps = steps
        self._answer: Any = None
        self._failure: SettleError | None = None

    def next(self) -> Step | None:
        answer, failure = self._answer, self._failure
        self._answer, self._failure = None, None
        try:
            return self._steps.send(answer) if failure is None else self._steps.throw(failure)
        except StopIteration:
            return None

    def answered(self, answer: Any) -> None:
        self._answer = answer

    def failed(self, error: SettleError) -> None:
        self._failure = error


def leaving(
    requests: Requests,
    item: Item,
    exc: BaseException | None,
    *,
    lock_seconds: int,
    policy: RetryPolicy,
    lost_note: str,
) -> Steps:
    """The steps of leaving a block that ``exc`` ended (``None``: normally): release the lock as Failed
    with its text (a lock lost already is not: ``lost_note`` goes on ``exc``), or record the outcome
    (raising :class:`LockLost` at once if the lock was lost)."""
    if exc is not None:
        if item.lost:
            exc.add_note(lost_note)
        return Steps(releasing(None if item.lost else release_call(requests, item, exc), exc))
    item.check()
    return Steps(Leaving(requests, item, lock_seconds=lock_seconds, policy=policy).steps())


def releasing(call: Call[Record | None] | None, error: BaseException) -> Generator[Step, Any, None]:
    """Send ``call`` (a release, if any); its failure becomes a note on the ``error`` being raised."""
    if call is None:
        return
    try:
        yield Release(call)
    except SettleError as release_error:
        error.add_note(f"settle-client: releasing the lock failed: {release_error}")


class Leaving:
    """Leaving a block that ended normally, decided without I/O: :attr:`call` is the write to send; after
    each failure of it, :meth:`failed` says whether to send it again and when; while it is retried,
    :meth:`extension` keeps the lock. :meth:`steps` takes them in order."""

    def __init__(self, requests: Requests, item: Item, *, lock_seconds: int, policy: RetryPolicy) -> None:
        self.requests = requests
        self.item = item
        self.lock_seconds = lock_seconds
        self.policy = policy
        self.call = outcome_call(requests, item)
        self.left_at = time.monotonic()
        self.failures = 0
        self._extension_sent_at = 0.0

    def failed(self, error: SettleError) -> float | None:
        """After :attr:`call` failed with ``error``: seconds to wait before sending :attr:`call` again (0:
        at once, it is now the ``@idempotent`` fallback), or ``None``: give up (:meth:`give_up`)."""
        self.failures += 1
        fallback = unstored_call(self.requests, self.item, error) if rejected(error) else None
        if fallback is not None:  # @idempotent: the side effect happened; never run it again
            self.call = fallback
            return 0.0
        return outcome_wait(
            self.item,
            error,
            left_at=self.left_at,
            lock_seconds=self.lock_seconds,
            attempt=self.failures,
            policy=self.policy,
        )

    def give_up(self, error: SettleError) -> Call[Record | None] | None:
        """The release to send before ``error`` is raised (Settle refused the outcome itself), else
        ``None``; the error then says the outcome was not recorded."""
        if rejected(error):
            return release_call(self.requests, self.item, error)
        if not isinstance(error, LockLost):
            error.add_note(UNRECORDED_NOTE)
        return None

    def extension(self) -> Call[ExtendResult] | None:
        """The extension due now while the outcome is retried (one try: the outcome is fenced either
        way), or ``None``; its answer or error goes to :meth:`extension_answered`."""
        token = self.item.lock_token
        if token is None or not extension_due(self.item, self.lock_seconds):
            return None
        self._extension_sent_at = time.monotonic()
        return self.requests.extend(self.item.key, token, lock_seconds=self.lock_seconds)

    def extension_answered(self, answer: ExtendResult | SettleError) -> None:
        if isinstance(answer, LockLost):
            self.item.lose(answer)
        elif isinstance(answer, ExtendResult):
            self.item.extended(answer, self._extension_sent_at + self.lock_seconds)

    def steps(self) -> Generator[Step, Any, None]:
        """Send :attr:`call` until it is recorded in ``item.record``; while Settle is unavailable, wait and
        extend the lock between tries; on giving up, release as :meth:`give_up` says and raise."""
        while True:
            try:
                self.item.record = yield self.call
                return
            except SettleError as error:
                wait = self.failed(error)
                if wait is None:
                    yield from releasing(self.give_up(error), error)
                    raise
            if wait:
                log.info("recording %s: Settle unavailable; retrying in %.2fs", self.item.key.item_key, wait)
                yield float(wait)
                extension = self.extension()
                if extension is not None:
                    try:
                        answer = yield extension
                    except SettleError as error:
                        answer = error
                    self.extension_answered(answer)


class Keeping:
    """The background extension of a block's lock, decided without I/O: when the next one is :attr:`due`
    (by ``time.monotonic()``), its :meth:`call`, and what its answer or failure does to the item."""

    def __init__(self, requests: Requests, item: Item, lock_seconds: int, sent_at: float) -> None:
        self.requests = requests
        self.item = item
        self.lock_seconds = lock_seconds
        self.due = sent_at + extension_delay(lock_seconds)
        self._sent_at = sent_at

    def call(self) -> Call[ExtendResult]:
        token = self.item.lock_token
        assert token is not None  # a block holding no lock (the null handler) is not kept
        self._sent_at = time.monotonic()
        return self.requests.extend(self.item.key, token, lock_seconds=self.lock_seconds)

    def answered(self, result: ExtendResult) -> None:
        """Extended: timed from when the request was sent (never the server's clock)."""
        self.item.extended(result, self._sent_at + self.lock_seconds)
        self.due = self._sent_at + extension_delay(self.lock_seconds)

    def failed(self, error: Exception) -> bool:
        """True when keeping must stop (the lock was lost); else try again soon (the server fences)."""
        if isinstance(error, LockLost):
            self.item.lose(error)
            return True
        log.warning("extending the lock of %s failed: %s", self.item.key.item_key, error)
        self.due = time.monotonic() + retry_delay(self.lock_seconds)
        return False


def extension_due(item: Item, lock_seconds: float) -> bool:
    """Is an extension due (a third of the lock has passed since the last one)?"""
    return time.monotonic() >= item.expires_at - lock_seconds + extension_delay(lock_seconds)


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
