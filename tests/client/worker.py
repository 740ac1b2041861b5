"""A separate OS process that holds one key in ``client.processing`` until it is signalled.

``python -m tests.client.worker URL KEY_JSON LOCK_SECONDS STATE_FILE [WORK_SECONDS [thread|async]]``: enters
the block, writes ``inside <pid>`` to ``STATE_FILE`` and works (sleeps, calling ``item.check()`` between
steps) for ``WORK_SECONDS`` (default or ``inf``: for ever), then records ``{"pid": ...}``. With ``thread`` the
block runs in a worker thread while the main thread waits for it. With ``async`` it is an
``AsyncSettleClient`` block in a task, and SIGTERM cancels the task, as the client README advises
(``loop.add_signal_handler(signal.SIGTERM, task.cancel)``). Prints how the block ended: ``processed``,
``lost`` (``LockLost``), ``cancelled`` (async, after SIGTERM) or nothing (killed). With ``slow-lock`` the
lock's answer, once storage has written it, is held back (``lock-answered <pid>`` in ``STATE_FILE``) until a
signal arrives: the window where a SIGTERM finds the block not yet entered. The tests send it SIGKILL,
SIGSTOP/SIGCONT and SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    from settle_client import LockLost, SettleClient

    url, key, lock_seconds, state = argv[0], json.loads(argv[1]), int(argv[2]), Path(argv[3])
    work_s = float(argv[4]) if len(argv) > 4 else float("inf")
    mode = argv[5] if len(argv) > 5 else ""
    in_thread = mode == "thread"
    if mode == "async":
        print(asyncio.run(main_async(url, key, lock_seconds, state, work_s)), flush=True)
        return 0
    with SettleClient(url, transport=SlowLockAnswer(state) if mode == "slow-lock" else None) as client:

        def work() -> str:
            try:
                with client.processing(key, lock_seconds=lock_seconds) as item:
                    state.write_text(f"inside {os.getpid()}\n")
                    started = time.monotonic()
                    while time.monotonic() - started < work_s:
                        item.check()
                        time.sleep(0.05)
                    item.data = {"pid": os.getpid()}
            except LockLost:
                return "lost"
            return "processed"

        if in_thread:
            with ThreadPoolExecutor(1) as pool:
                outcome = pool.submit(work)
                while not outcome.done():
                    time.sleep(0.05)
                print(outcome.result(), flush=True)
        else:
            print(work(), flush=True)
    return 0


class SlowLockAnswer(httpx.HTTPTransport):
    """Real HTTP; the first lock's answer, once received, is held back until a signal interrupts the wait."""

    def __init__(self, state: Path) -> None:
        super().__init__()
        self.state = state
        self.held = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/state/lock") and not self.held:  # the first answer only
            self.held = True
            response.read()
            self.state.write_text(f"lock-answered {os.getpid()}\n")
            time.sleep(120)  # SIGTERM's handler raises here, as it would in a slow read of the answer
        return response


async def main_async(url: str, key: Any, lock_seconds: int, state: Path, work_s: float) -> str:
    """The async worker: SIGTERM cancels the task that runs the block (the client README's advice)."""
    from settle_client import AsyncSettleClient, LockLost

    async with AsyncSettleClient(url) as client:

        async def work() -> str:
            try:
                async with client.processing(key, lock_seconds=lock_seconds) as item:
                    state.write_text(f"inside {os.getpid()}\n")
                    started = time.monotonic()
                    while time.monotonic() - started < work_s:
                        item.check()
                        await asyncio.sleep(0.05)
                    item.data = {"pid": os.getpid()}
            except LockLost:
                return "lost"
            return "processed"

        task = asyncio.create_task(work())
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"


def start_worker(
    url: str,
    key: Any,
    lock_seconds: int,
    state: Path,
    work_s: float | None = None,
    *,
    thread: bool = False,
    use_async: bool = False,
    slow_lock: bool = False,
) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.client.worker", url, json.dumps(key), str(lock_seconds), str(state)]
    args.append(str(work_s if work_s is not None else "inf"))
    if thread or use_async or slow_lock:
        args.append("thread" if thread else "async" if use_async else "slow-lock")
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
