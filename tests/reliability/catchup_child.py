"""A catch-up instance for the reliability suite: run as ``python -m tests.reliability.catchup_child ARGS``.

It does what the app's ``state_catchup`` timer does (``service.catchup().drain()``) against the tables the
environment names (the parent's, through a proxy of this process's own), as one more instance of the
app: its own process, its own lease owner (``state.catchup.PROCESS_OWNER``), its own clock estimate.

It prints ``ready`` once its clients are built, waits for a line on stdin (the parent starts every
instance at the same moment), runs, and prints one JSON line with what its runs reported (the parent
judges the outcome from storage, not from this).

``lease_ms`` shortens the lease a run takes on a level-1 pointer (the default is one timer period, 60 s),
so that a test can wait out the lease of an instance it killed. ``kill_after`` (a test-only hook, nothing
in the product) sends SIGKILL to the process itself once that many state-table transactions have been
answered: the instance dies in the middle of a pointer it holds a lease on.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

from azure.core.pipeline.policies import HTTPPolicy


class KillAfterTransactions(HTTPPolicy):  # type: ignore[type-arg]
    """SIGKILL once ``count`` entity-group transactions have been applied (answered 2xx; a throttled
    attempt the SDK retries does not count)."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self._lock = threading.Lock()

    def send(self, request: Any) -> Any:
        response = self.next.send(request)
        http = request.http_request
        if http.method == "POST" and "$batch" in http.url and response.http_response.status_code < 300:
            with self._lock:
                self.count -= 1
                if self.count <= 0:
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
        return response


def main(args: dict[str, Any]) -> None:
    from common import runtime
    from state import catchup, service
    from state.keys import STATE_TABLE

    kill_after = args.get("kill_after")
    runtime.reset(policies=[KillAfterTransactions(int(kill_after))] if kill_after else [])
    runner = service.catchup()
    if args.get("lease_ms"):
        runner.lease_ms = int(args["lease_ms"])
    runtime.tables().table(STATE_TABLE)  # clients built before the start line, so instances start together
    print(json.dumps({"ready": True, "pid": os.getpid(), "owner": catchup.PROCESS_OWNER}), flush=True)
    sys.stdin.readline()
    results = runner.drain()
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "owner": runner.owner,
                "runs": len(results),
                "locks_failed": sum(r.locks_failed for r in results),
                "leases_skipped": sum(r.leases_skipped for r in results),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
