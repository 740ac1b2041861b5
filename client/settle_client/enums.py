"""The seeds' vocabulary: scopes, statuses, handlers (kept equal to ``GET /api/v1/state/meta`` by a test)."""

from __future__ import annotations

from enum import IntEnum
from typing import Self


class _Named(IntEnum):
    """A numbered vocabulary whose wire names are its member names in PascalCase."""

    @property
    def label(self) -> str:
        """The name on the wire, e.g. ``ElementExecution`` or ``Processed``."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @classmethod
    def parse(cls, value: Self | int | str) -> Self:
        """A member from itself, its number (a scope id, a status code) or its name (case-insensitive)."""
        if isinstance(value, int):
            return cls(value)
        for member in cls:
            if member.label.lower() == value.strip().lower():
                return member
        names = ", ".join(m.label for m in cls)
        raise ValueError(f"unknown {cls.__name__.lower()} {value!r}; expected one of {names}")


class Scope(_Named):
    """How broadly a record applies. ``Element`` (4) is the usual choice."""

    APP = 1
    PROCESS = 2
    THREAD = 3
    ELEMENT = 4
    PROCESS_EXECUTION = 5
    THREAD_EXECUTION = 6
    ELEMENT_EXECUTION = 7

    @property
    def is_execution(self) -> bool:
        """Execution scopes (5-7) make ``entityExecutionId`` part of the key."""
        return self >= Scope.PROCESS_EXECUTION


class Status(_Named):
    """A record's status (the seeds' IdempotencyStatus)."""

    NONE = 0
    PROCESSED = 1
    PROCESSING = 2
    FAILED = 3
    SKIPPED = 4
    SUPERSEDED = 5
    EXPIRED = 6


# ``exists`` is true exactly for these; ``processing`` raises AlreadyProcessed for them.
EXISTS_STATUSES = frozenset({Status.PROCESSED, Status.SKIPPED})
# What ``set`` may record.
SETTABLE_STATUSES = frozenset({Status.PROCESSED, Status.SKIPPED, Status.FAILED})
# ``handler.key`` values the service knows.
HANDLERS = ("built-in", "null")
