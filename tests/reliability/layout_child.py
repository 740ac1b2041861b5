"""An instance of a deployment with its own shard settings, for the layout tests across OS processes:
``python -m tests.reliability.layout_child ARGS`` (JSON).

It sets ``SETTLE_STATE_SHARDS`` / ``SETTLE_HANDOFF_SHARDS`` from ARGS (the tables come from the parent's
environment), waits for ``start_at`` (epoch seconds) so that both processes begin at once, then:

* ``mode: state``: locks every key of ``keys`` (``state_lock``), printing ``{"itemKey", "acquired"}``;
* ``mode: race``: ``threads`` threads each lock their share of ``keys`` in order, one every ``pace``
  seconds, asking again after a 503 (as a client does), printing ``{"itemKey", "status", "acquired"}``;
  ``refresh`` / ``guard`` / ``margin`` shrink the layout's timings (both processes and the parent agree);
* ``mode: handoff``: projects the request and park messages of every event of ``events`` (the resolver, as
  the host would deliver them; both processes deliver the same messages), waits for ``receive_at``, then
  receives until nothing is left, printing ``{"eventId"}`` per hand-off handed out.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from typing import Any


def main() -> None:
    args: dict[str, Any] = json.loads(sys.argv[1])
    os.environ["SETTLE_STATE_SHARDS"] = str(args.get("state_shards", 1))
    os.environ["SETTLE_HANDOFF_SHARDS"] = str(args.get("handoff_shards", 1))
    os.environ.pop("SETTLE_STATE_SHARDS_PREVIOUS", None)
    os.environ.pop("SETTLE_HANDOFF_SHARDS_PREVIOUS", None)

    if "refresh" in args:
        os.environ["SETTLE_LAYOUT_REFRESH_SECONDS"] = str(args["refresh"])
    import function_app
    from common import layouts
    from tests.conftest import Caller

    layouts.GUARD_S = float(args.get("guard", layouts.GUARD_S))
    layouts.MARGIN_S = float(args.get("margin", layouts.MARGIN_S))
    call = Caller({str(f.get_function_name()): f for f in function_app.app.get_functions()})
    time.sleep(max(0.0, float(args["start_at"]) - time.time()))
    if args["mode"] == "race":
        race(call, args)
        return
    if args["mode"] == "state":
        for key in args["keys"]:
            answer = call("state_lock", {"key": key, "lockSeconds": 300})
            line = {
                "itemKey": key["itemKey"],
                "status": answer.status,
                "acquired": (answer.json or {}).get("acquired"),
            }
            print(json.dumps(line), flush=True)
        return
    from tests.support.handoff_flows import Flow

    resolver = call.functions["resolver"].get_user_function()
    for event in args["events"]:
        flow = Flow(endpoint=args["endpoint"], event_id=event["eventId"])
        at = datetime.fromisoformat(event["parkedAt"])
        resolver(flow.request(enqueued=at))
        resolver(flow.park(enqueued=at, job=f"job-{event['eventId']}"))
    time.sleep(max(0.0, float(args["receive_at"]) - time.time()))
    for _ in range(10 * len(args["events"]) + 5):
        answer = call(
            "handoff_receive",
            None,
            route_params={"endpointId": args["endpoint"]},
            params={"leaseSeconds": "300"},
            headers={"x-agent-id": f"agent-{os.getpid()}"},
        )
        if answer.status == 204:
            return
        assert answer.status == 200, answer.body
        print(json.dumps({"eventId": answer.json["coordinates"]["eventId"]}), flush=True)


def race(call: Any, args: dict[str, Any]) -> None:
    import threading

    count = int(args["threads"])
    out = threading.Lock()

    def work(share: list[dict[str, Any]]) -> None:
        for key in share:
            for _ in range(100):
                answer = call("state_lock", {"key": key, "lockSeconds": 300})
                if answer.status != 503:
                    break
                time.sleep(0.1)
            line = {
                "itemKey": key["itemKey"],
                "status": answer.status,
                "acquired": (answer.json or {}).get("acquired"),
            }
            with out:
                print(json.dumps(line), flush=True)
            time.sleep(float(args["pace"]))

    keys = args["keys"]
    threads = [threading.Thread(target=work, args=(keys[n::count],)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
