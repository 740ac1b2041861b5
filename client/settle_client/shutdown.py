"""SIGTERM: release the open processing blocks, then stop (the normal stop of Functions scale-in,
Container Apps and Kubernetes).

Python's default answer to SIGTERM is to die on the spot: no ``finally``, no ``__exit__``, so an open
block's item stays Processing until its lock expires. A :class:`~settle_client.SettleClient` therefore
installs, when it is created (or a block is entered) in the main thread, a SIGTERM handler that

1. releases every open block of the process (whatever thread runs it) as Failed with
   ``"Terminated: SIGTERM ..."`` (fenced, each on a connection of its own, a few seconds at most) and marks
   its item lost, so a block still running in another thread writes nothing afterwards;
2. puts SIGTERM back to its default (a second SIGTERM stops the process at once), and
3. raises :class:`Terminated` (a ``SystemExit`` with status 143 = 128 + SIGTERM) in the main thread, so
   ``finally`` blocks and ``atexit`` handlers run and the process stops as SIGTERM would have stopped it.

It is installed only where SIGTERM still has Python's default disposition (nobody else handles it) and
only from the main thread; ``SettleClient(handle_sigterm=False)`` turns it off. A program with its own
SIGTERM handler calls :func:`release_open_blocks` from it.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import httpx

from settle_client._core import ClientCore, read
from settle_client.errors import LockLost, SettleError
from settle_client.processing import Item, release_call

log = logging.getLogger("settle_client")

EXIT_STATUS = 128 + int(signal.SIGTERM)
RELEASE_TIMEOUT_S = 5.0

_guard = threading.Lock()
_open: dict[int, tuple[ClientCore, Item]] = {}
_installed = False


class Terminated(SystemExit):
    """Raised in the main thread when the process got SIGTERM (exit status 143)."""

    def __init__(self) -> None:
        super().__init__(EXIT_STATUS)

    def __str__(self) -> str:
        return "SIGTERM: the process was stopped before the block ended"


def opened(client: ClientCore, item: Item) -> None:
    with _guard:
        _open[id(item)] = (client, item)


def closed(item: Item) -> None:
    with _guard:
        _open.pop(id(item), None)


def install() -> bool:
    """Install the SIGTERM handler (main thread, SIGTERM still at its default); True when it is in place."""
    global _installed
    with _guard:
        if _installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return False
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not the main interpreter, or no signals here
            return False
        _installed = True
        return True


def release_open_blocks(reason: BaseException | None = None) -> int:
    """Release every open processing block of this process as Failed (``reason``'s text, by default
    :class:`Terminated`'s) and mark their items lost; the number released. Safe from a signal handler:
    each release uses a connection of its own, never the client's pool."""
    why = reason if reason is not None else Terminated()
    with _guard:
        blocks = list(_open.values())
        _open.clear()
    released = 0
    for client, item in blocks:
        if item.lost:
            continue
        call = release_call(client.requests, item, why)
        item.lose(LockLost(f"settle-client: released on shutdown ({why})"))
        request = client.request(call, client.auth.headers(), timeout=httpx.Timeout(RELEASE_TIMEOUT_S))
        try:
            with httpx.Client() as http:
                read(call, http.send(request))
            released += 1
        except (SettleError, httpx.HTTPError) as error:
            log.warning("releasing %s on shutdown failed: %s", item.key.item_key, error)
    return released


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _installed
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with _guard:
        _installed = False
    release_open_blocks()
    raise Terminated()
