"""A process that takes locks until it is killed (``python -m tests.reliability.locker ...``).

Used by ``test_state_adversary.py``: the test starts it, lets it work, and ``SIGKILL``s it at a random
instant (or it kills itself at a chosen storage request, ``--kill-at``). It calls the ``state_lock``,
``state_set``, ``state_release`` and ``state_lock_extend`` functions the way the worker does, from several
threads, on many keys and partitions, with short locks. Before each lock it appends the key to its log
(unbuffered), so the test knows every key a lock may have been applied to.

``--kill-at KIND[:N]``: ``SIGKILL`` this process when it is about to send its N-th (default 1st) request of
KIND, or (``after-batch``) right after the N-th lock transaction was applied, before its answer is read:
``marker`` (insert of an index marker), ``level1`` (the insert-or-merge of a level-1 row that follows it),
``batch`` (an entity group transaction), ``after-batch``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
from typing import Any
from urllib.parse import unquote, urlparse

import azure.functions as func
from azure.core.pipeline.policies import HTTPPolicy


def kind_of(request: Any) -> str | None:
    http = request.http_request
    path = unquote(urlparse(http.url).path)
    table = path.rsplit("/", 1)[-1]
    if table == "$batch" and http.method == "POST":
        return "batch"
    if http.method in ("POST", "MERGE", "PATCH") and ("statelocks(" in table or table.endswith("statelocks")):
        return "level1"
    if http.method == "POST" and table.endswith("state"):
        body = http.body if isinstance(http.body, bytes | str) else b""
        text = body.decode() if isinstance(body, bytes) else body
        return "marker" if '"RowKey": "~' in text or '"RowKey":"~' in text else None
    return None


class KillPolicy(HTTPPolicy):  # type: ignore[type-arg]
    """SIGKILLs the process at the chosen storage request."""

    def __init__(self, kind: str, nth: int) -> None:
        super().__init__()
        self.kind, self.nth = kind, nth
        self.seen = 0
        self.lock = threading.Lock()

    def _due(self, kind: str | None) -> bool:
        with self.lock:
            if kind != self.kind.removeprefix("after-"):
                return False
            self.seen += 1
            return self.seen == self.nth

    def send(self, request: Any) -> Any:
        kind = kind_of(request)
        if not self.kind.startswith("after-") and self._due(kind):
            os.kill(os.getpid(), signal.SIGKILL)
        response = self.next.send(request)
        if self.kind.startswith("after-") and self._due(kind):
            os.kill(os.getpid(), signal.SIGKILL)
        return response


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--locks", type=int, default=10**9, help="stop (exit normally) after this many")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--entity-base", type=int, default=500)
    parser.add_argument("--lock-seconds", default="1,3")
    parser.add_argument("--keys", help="lock exactly these keys (JSON list), in order, one thread")
    parser.add_argument("--kill-at")
    args = parser.parse_args()

    from common import runtime

    if args.kill_at:
        kind, _, nth = args.kill_at.partition(":")
        runtime.reset(policies=[KillPolicy(kind, int(nth or 1))])
    import function_app

    functions = {f.get_function_name(): f.get_user_function() for f in function_app.app.get_functions()}
    low, high = (int(x) for x in args.lock_seconds.split(","))
    log = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    counter = {"locks": 0}
    guard = threading.Lock()

    def call(name: str, body: dict[str, Any]) -> Any:
        req = func.HttpRequest(
            "POST", f"http://localhost/api/{name}", body=json.dumps(body).encode(), headers={}
        )
        response = functions[name](req)
        return json.loads(response.get_body() or b"null"), response.status_code

    def worker(index: int, keys: list[dict[str, Any]] | None) -> None:
        rng = random.Random(args.seed * 1000 + index)
        mine: list[dict[str, Any]] = []
        while True:
            with guard:
                if counter["locks"] >= args.locks:
                    return
                counter["locks"] += 1
            if keys is not None:
                if not keys:
                    return
                key = keys.pop(0)
            elif mine and rng.random() < 0.1:
                key = rng.choice(mine)  # again: a takeover once its lock expired, else a refusal
            else:
                key = {
                    "tenantId": 7,
                    "scopeId": 4,
                    "entityId": args.entity_base + rng.randrange(args.partitions),
                    "itemEntityKey": "kill",
                    "itemKey": f"{args.seed}-{index}-{rng.getrandbits(48):012x}",
                }
                mine.append(key)
            os.write(log, (json.dumps(key) + "\n").encode())
            answer, status = call("state_lock", {"key": key, "lockSeconds": rng.randint(low, high)})
            if status != 200 or not answer.get("acquired"):
                continue
            token = answer["lockToken"]
            roll = rng.random()
            if roll < 0.25:
                call("state_set", {"key": key, "status": "Processed", "lockToken": token, "data": {"n": 1}})
            elif roll < 0.35:
                call("state_release", {"key": key, "error": "gave up", "lockToken": token})
            elif roll < 0.5:
                call(
                    "state_lock_extend",
                    {"key": key, "lockToken": token, "lockSeconds": rng.randint(low, high)},
                )

    if args.keys:
        worker(0, list(json.loads(args.keys)))
        return
    threads = [threading.Thread(target=worker, args=(i, None), daemon=True) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
