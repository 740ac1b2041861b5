"""Fault injection: an azure-core policy that fails a chosen storage request of the arming thread.

``runtime.reset(policies=[FAULTS])`` puts the policy on every Table client, after the SDK's retry policy
(once per attempt). A thread arms it with :meth:`FaultPolicy.plan`; other threads pass straight through,
so request numbers are those of the operation under test. The plan lives in a context variable, so a
request the operation sends beside itself (``common.beside``: a cold instance's signing-key read) is
numbered and can be failed like the operation's own; two such requests in flight at once take their
numbers in the order they are sent.

Two kinds of fault:

* ``before``: ``ServiceRequestError`` before the request leaves (nothing reached storage);
* ``after``: the request reached Azurite and was applied, then ``ServiceResponseError`` (the answer was
  lost: the ambiguous case, where the caller cannot know whether its write happened).
"""

from __future__ import annotations

import contextvars
import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlparse

from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.core.pipeline.policies import HTTPPolicy

When = Literal["before", "after"]
WHENS: tuple[When, When] = ("before", "after")


@dataclass
class Plan:
    """What to fail on this thread: request number ``index`` (1-based), or at random with ``rate``."""

    index: int | None = None
    when: When = "before"
    rate: float = 0.0
    limit: int | None = None  # at most this many random faults (a caller's retries then get through)
    rng: random.Random = field(default_factory=random.Random)
    requests: list[str] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def number(self, label: str) -> int:
        """Count request ``label`` (from whichever thread sends it) and return its 1-based number."""
        with self.guard:
            self.requests.append(label)
            return len(self.requests)

    def _fires(self, number: int) -> bool:
        if self.index is not None:
            return number == self.index
        if self.limit is not None and len(self.injected) >= self.limit:
            return False
        return self.rate > 0 and self.rng.random() < self.rate


class FaultPolicy(HTTPPolicy):  # type: ignore[type-arg]
    """Fails storage requests according to the current thread's :class:`Plan` (none: pass through)."""

    def __init__(self) -> None:
        super().__init__()
        self._plan: contextvars.ContextVar[Plan | None] = contextvars.ContextVar("fault_plan", default=None)

    @contextmanager
    def plan(
        self,
        index: int | None = None,
        when: When = "before",
        *,
        rate: float = 0.0,
        limit: int | None = None,
        seed: int = 0,
    ) -> Iterator[Plan]:
        plan = Plan(index=index, when=when, rate=rate, limit=limit, rng=random.Random(seed))
        token = self._plan.set(plan)
        try:
            yield plan
        finally:
            self._plan.reset(token)

    def arm(self, index: int = 1, when: When = "before") -> Plan:
        """Arm this thread without a ``with`` block (a transport stub failing the request that follows)."""
        plan = Plan(index=index, when=when)
        self._plan.set(plan)
        return plan

    def disarm(self) -> None:
        self._plan.set(None)

    def send(self, request: Any) -> Any:
        plan = self._plan.get()
        if plan is None:
            return self.next.send(request)
        http = request.http_request
        label = f"{http.method} {unquote(urlparse(http.url).path)}"
        number = plan.number(label)
        with plan.guard:
            fires = plan._fires(number)
        if fires and plan.when == "before":
            plan.injected.append(f"before #{number} {label}")
            raise ServiceRequestError(f"injected fault: request #{number} ({label}) was not sent")
        response = self.next.send(request)
        if fires and plan.when == "after":
            plan.injected.append(f"after #{number} {label}")
            raise ServiceResponseError(
                f"injected fault: request #{number} ({label}) was applied but its answer was lost"
            )
        return response


FAULTS = FaultPolicy()


THROTTLE_SETTING = "SETTLE_RELIABILITY_THROTTLE"
# Azure's targets ÷ 100: 20 entities/s per partition, 200 per account (bench/throttle.py's own figures use
# ÷ 200). Chosen so the suite's races and fault loops, which work a few partitions hard, hit the budget
# while the run stays within a few times the unthrottled one.
THROTTLE_SCALE = 100.0


def throttle_scale() -> float | None:
    """``SETTLE_RELIABILITY_THROTTLE``: unset or 0, no budget; 1, :data:`THROTTLE_SCALE`; else the factor."""
    value = os.environ.get(THROTTLE_SETTING, "").strip()
    if value in ("", "0"):
        return None
    try:
        factor = THROTTLE_SCALE if value == "1" else float(value)
    except ValueError as exc:
        raise ValueError(f"{THROTTLE_SETTING} must be 0, 1 or a scale factor (> 1), not {value!r}") from exc
    if factor <= 1:
        raise ValueError(f"{THROTTLE_SETTING} must be 0, 1 or a scale factor (> 1), not {value!r}")
    return factor


def is_throttle_refusal(exc: BaseException | None) -> bool:
    """Under the suite's storage budget: is ``exc`` (or its cause) storage refusing as Azure throttles?"""
    if throttle_scale() is None:
        return False
    text = repr(exc) + repr(getattr(exc, "__cause__", None))
    return any(
        code in text for code in ("ServerBusy", "Server Busy", "OperationTimedOut", "Operation Timeout")
    )
