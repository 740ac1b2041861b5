"""A separate OS process that processes one key with the client and prints how it ended.

``python -m tests.client.racer URL KEY_JSON RAN_FILE [GO_FILE]``: waits for ``GO_FILE`` to exist (a
start line shared by several racers), then ``with client.processing(key)``; the block appends this
process's id to ``RAN_FILE``. Prints ``processed``, ``held`` or ``already``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    from settle_client import AlreadyProcessed, LockHeld, SettleClient

    url, key_json, ran = argv[0], argv[1], Path(argv[2])
    go = Path(argv[3]) if len(argv) > 3 else None
    key = json.loads(key_json)
    with SettleClient(url) as client:
        client.exists(key)  # connect before the start line, so the race is the lock itself
        deadline = time.monotonic() + 60
        while go is not None and not go.exists():
            if time.monotonic() > deadline:
                print("no start signal")
                return 2
            time.sleep(0.005)
        try:
            with client.processing(key) as item:
                with ran.open("a") as out:
                    out.write(f"{os.getpid()}\n")
                item.data = {"pid": os.getpid()}
        except LockHeld:
            print("held")
        except AlreadyProcessed:
            print("already")
        else:
            print("processed")
    return 0


def start_racer(url: str, key: Any, ran: Path, go: Path | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.client.racer", url, json.dumps(key), str(ran)]
    if go is not None:
        args.append(str(go))
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(process: subprocess.Popen[str], timeout: float = 90) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"racer failed:\n{out}\n{err}"
    return out.strip()


def run_racer(url: str, key: Any, ran: Path) -> str:
    return outcome(start_racer(url, key, ran))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
