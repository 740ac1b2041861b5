"""The seeds' vocabulary: scopes, statuses, handlers (kept equal to ``GET /api/v1/state/meta`` by a test)."""

from __future__ import annotations

from enum import IntEnum


class Scope(IntEnum):
    """How broadly a record applies. ``Element`` (4) is the usual choice."""

    APP = 1
    PROCESS = 2
    THREAD = 3
    ELEMENT = 4
    PROCESS_EXECUTION = 5
    THREAD_EXECUTION = 6
    ELEMENT_EXECUTION = 7

    @property
    def label(self) -> str:
        """The name on the wire, e.g. ``ElementExecution``."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def is_execution(self) -> bool:
        """Execution scopes (5-7) make ``entityExecutionId`` part of the key."""
        return self >= Scope.PROCESS_EXECUTION

    @classmethod
    def parse(cls, value: Scope | int | str) -> Scope:
        """A scope from itself, its id or its name (case-insensitive)."""
        if isinstance(value, int):
            return cls(value)
        for scope in cls:
            if scope.label.lower() == value.strip().lower():
                return scope
        names = ", ".join(s.label for s in cls)
        raise ValueError(f"unknown scope {value!r}; expected one of {names}")


class Status(IntEnum):
    """A record's status (the seeds' IdempotencyStatus)."""

    NONE = 0
    PROCESSED = 1
    PROCESSING = 2
    FAILED = 3
    SKIPPED = 4
    SUPERSEDED = 5
    EXPIRED = 6

    @property
    def label(self) -> str:
        """The name on the wire, e.g. ``Processed``."""
        return self.name.capitalize()

    @classmethod
    def parse(cls, value: Status | int | str) -> Status:
        """A status from itself, its code or its name (case-insensitive)."""
        if isinstance(value, int):
            return cls(value)
        for status in cls:
            if status.label.lower() == value.strip().lower():
                return status
        raise ValueError(f"unknown status {value!r}")


# ``exists`` is true exactly for these; ``processing`` raises AlreadyProcessed for them.
EXISTS_STATUSES = frozenset({Status.PROCESSED, Status.SKIPPED})
# What ``set`` may record.
SETTABLE_STATUSES = frozenset({Status.PROCESSED, Status.SKIPPED, Status.FAILED})
# ``handler.key`` values the service knows.
HANDLERS = ("built-in", "null")
