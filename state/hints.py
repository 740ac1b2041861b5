"""What this process last knew of recently used heads: a bounded cache that saves reads, never writes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from common.limits import entity_size
from state.lifecycle import Head

HINT_BYTES = 16 * 1024 * 1024


@dataclass
class Hints:
    """What this process last knew of recently used heads (None = known absent), bounded in bytes.

    A hint only saves a read: writes made from it are still ETag-conditional, and a stale hint costs
    one failed attempt and a fresh read. Heads are counted by their Table size estimate, and a head
    larger than 1/64 of the budget is not kept, so the cache never holds more than ``max_bytes``.
    """

    max_bytes: int = HINT_BYTES
    entries: OrderedDict[tuple[str, str], tuple[Head | None, int]] = field(default_factory=OrderedDict)
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, pk: str, rk: str) -> tuple[bool, Head | None]:
        with self.lock:
            entry = self.entries.get((pk, rk))
            if entry is None:
                return False, None
            self.entries.move_to_end((pk, rk))
            return True, entry[0]

    def put(self, pk: str, rk: str, head: Head | None) -> None:
        size = 64 + 2 * (len(pk) + len(rk)) + (entity_size(head.entity) if head is not None else 0)
        with self.lock:
            self._drop((pk, rk))
            if size > self.max_bytes // 64:
                return
            self.entries[(pk, rk)] = (head, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self.entries.popitem(last=False)
                self.bytes -= evicted

    def forget(self, pk: str, rk: str) -> None:
        with self.lock:
            self._drop((pk, rk))

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.bytes = 0

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[1]
