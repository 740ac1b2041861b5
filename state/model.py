"""The state machine's vocabulary and its rules, free of I/O.

Scopes and statuses are the seeds' (``001_8c09fe22b10f9835.txt``). :class:`RecordKey` is a record's
identity; :func:`lock_decision` is the whole ``tryAcquireLock`` rule, so it can be tested without storage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum

from common.clock import iso


class Scope(IntEnum):
    """How broadly a record applies (seed 001)."""

    APP = 1
    PROCESS = 2
    THREAD = 3
    ELEMENT = 4
    PROCESS_EXECUTION = 5
    THREAD_EXECUTION = 6
    ELEMENT_EXECUTION = 7

    @property
    def code(self) -> str:
        """The seeds' scope name, e.g. ``ElementExecution``."""
        return _SCOPE_CODES[self]

    @property
    def is_execution(self) -> bool:
        """Execution scopes (5-7) make ``entityExecutionId`` part of the key."""
        return self >= Scope.PROCESS_EXECUTION

    @classmethod
    def from_code(cls, code: str) -> Scope:
        for scope, name in _SCOPE_CODES.items():
            if name.lower() == code.strip().lower():
                return scope
        raise ValueError(f"unknown scope {code!r}; expected one of {', '.join(_SCOPE_CODES.values())}")


_SCOPE_CODES = {
    Scope.APP: "App",
    Scope.PROCESS: "Process",
    Scope.THREAD: "Thread",
    Scope.ELEMENT: "Element",
    Scope.PROCESS_EXECUTION: "ProcessExecution",
    Scope.THREAD_EXECUTION: "ThreadExecution",
    Scope.ELEMENT_EXECUTION: "ElementExecution",
}


class Status(IntEnum):
    """IdempotencyStatus of the seeds."""

    NONE = 0
    PROCESSED = 1
    PROCESSING = 2
    FAILED = 3
    SKIPPED = 4
    SUPERSEDED = 5
    EXPIRED = 6

    @property
    def label(self) -> str:
        return self.name.capitalize()

    @classmethod
    def parse(cls, value: str | int) -> Status:
        if isinstance(value, int):
            return cls(value)
        for status in cls:
            if status.label.lower() == value.strip().lower():
                return status
        raise ValueError(f"unknown status {value!r}")


# Retention (handler option) is at most a hundred years: its deadline must stay a storable DateTime.
MAX_RETENTION_DAYS = 36_500
MAX_RETENTION_SECONDS = MAX_RETENTION_DAYS * 86_400

# exists() is true exactly for these (seed 001: terminal, prevents re-processing).
EXISTS_STATUSES = (Status.PROCESSED, Status.SKIPPED)
# What `set` may record; Processing comes only from `lock`, Superseded/Expired only from Settle itself.
SETTABLE_STATUSES = (Status.PROCESSED, Status.SKIPPED, Status.FAILED)


@dataclass(frozen=True)
class RecordKey:
    """A record's identity. ``entity_execution_id`` is part of it only for execution scopes."""

    tenant_id: int
    scope: Scope
    entity_id: int
    item_entity_key: str
    item_key: str
    sub_item_entity_key: str = ""
    sub_item_key: str = ""
    entity_execution_id: int | None = None

    def __post_init__(self) -> None:
        if self.scope.is_execution and self.entity_execution_id is None:
            raise ValueError("entityExecutionId is required for execution scopes (5-7)")


@dataclass(frozen=True)
class LockDecision:
    acquire: bool
    takeover: bool = False
    reason: str | None = None


def lock_decision(
    status: Status, locked_until: datetime | None, now: datetime, *, retention_expired: bool = False
) -> LockDecision:
    """May a caller take the lock of a record in ``status``? (seed 000 ``TryAcquireLockAsync``, fixed).

    Acquires on None, Failed, Expired (also a Processed/Skipped record past its retention window) and
    on Processing whose lock expired (a takeover, recorded in history). Refuses on Processed, Skipped and
    a valid Processing lock, saying why.
    """
    if status in (Status.NONE, Status.FAILED, Status.EXPIRED) or retention_expired:
        return LockDecision(acquire=True)
    if status in EXISTS_STATUSES:
        return LockDecision(acquire=False, reason=f"The item is already {status.label}.")
    if status is Status.PROCESSING:
        if locked_until is not None and locked_until <= now:
            return LockDecision(acquire=True, takeover=True)
        if locked_until is None:
            return LockDecision(acquire=False, reason="Another caller holds the lock (until unknown).")
        return LockDecision(acquire=False, reason=held_reason(locked_until))
    return LockDecision(acquire=False, reason=f"The record is {status.label}.")


def held_reason(locked_until: datetime) -> str:
    """What a caller refused by a held lock should know: how long, and what happens after."""
    until = iso(locked_until)
    return (
        f"Another caller holds the lock until {until}. Until then every lock call is refused (unless the "
        f"holder extends or releases it); after {until} the lock will be taken over: the next lock call "
        "gets it (takeover: true) and the old holder's token no longer writes. Retry after Retry-After."
    )


def retry_after_seconds(locked_until: datetime, now: datetime) -> int:
    """Whole seconds until a held lock may be taken over, at least 1: rounded up, plus one for the
    storage clock's margin (an expiry is judged by the earliest time storage may read)."""
    return max(1, math.ceil((locked_until - now).total_seconds()) + 1)
