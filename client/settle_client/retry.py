"""When a call is retried, and how long the client waits first. Pure: no I/O, tested without a server.

Two kinds of call (documented per method in the README):

* ``IDEMPOTENT``: sending it twice changes nothing beyond sending it once: reads; ``lock`` with its
  ``requestId``; ``extend``; fenced ``set``/``upsert``/``release`` (the retry of an applied fenced write
  answers with the record it wrote); settlement (Settle answers a repeated identical settlement from its
  claim: same ``controlMessageId``, ``replayed``). Retried on 429/503 answers and on any transport failure.
* ``UNSAFE``: a retry could apply it twice (unfenced writes: a 503 can follow a write that storage
  applied). Retried only when the connection was never opened, so the server provably never saw it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

import httpx


class Safety(Enum):
    IDEMPOTENT = "idempotent"
    UNSAFE = "unsafe"


RETRIED_STATUSES = frozenset({429, 503})
# Failures where the request never left this process: nothing can have been applied.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a call is retried.

    ``attempts``: tries in all, the first included (1 disables retries). The n-th retry waits
    ``backoff * 2**(n-1)`` seconds, at most ``max_backoff``, with jitter (a random part of the upper
    half, so callers that failed together do not come back together). A ``Retry-After`` from the
    server is honoured: the wait is never shorter than it. A ``Retry-After`` longer than
    ``max_retry_after`` is not waited out: the error is raised at once, carrying it.
    """

    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff < 0 or self.max_backoff < 0 or self.max_retry_after < 0:
            raise ValueError("backoff, max_backoff and max_retry_after must not be negative")

    def backoff_for(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before retry number ``retry`` (1-based), without a Retry-After."""
        ceiling = min(self.max_backoff, self.backoff * 2.0 ** (retry - 1))
        if not self.jitter:
            return ceiling
        return (rng or random).uniform(ceiling / 2, ceiling)

    def delay(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float | None:
        """Seconds to wait before trying again after failed attempt ``attempt`` (1-based), or ``None``
        when the call must give up."""
        if attempt >= self.attempts:
            return None
        if retry_after is not None and retry_after > self.max_retry_after:
            return None
        wait = self.backoff_for(attempt, rng)
        return max(wait, retry_after) if retry_after is not None else wait


def may_retry_transport(safety: Safety, exc: httpx.TransportError) -> bool:
    """May a call that failed with ``exc`` be sent again?"""
    return safety is Safety.IDEMPOTENT or isinstance(exc, NOT_SENT)


def may_retry_answer(safety: Safety, status: int) -> bool:
    """May a call answered with ``status`` be sent again? Not an unfenced write: its 503 may come after
    storage applied it and lost the answer."""
    return safety is not Safety.UNSAFE and status in RETRIED_STATUSES
