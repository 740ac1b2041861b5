"""A hand-off agent: does the work of each parked hand-off of an endpoint and settles it.

    SETTLE_URL=http://127.0.0.1:7071 python examples/handoff_agent.py Billing --event-type InvoiceCreated

It long-polls Settle for the oldest parked hand-off, does the work the endpoint handed off (here: a
stand-in that books the invoice), and completes the hand-off with the result, or fails it with the
error: exactly one control message each. Ctrl-C or SIGTERM stops it after the current poll;
``--max N`` stops after N settlements.

A status checker whose external jobs finish on their own schedule should not wait on the oldest
hand-off (``next`` is oldest-first and does not claim); it looks each finished job up instead:
``client.handoffs.job(endpoint, job_id).complete(...)``.

Each process is its own agent: ``--agent-id`` (default ``example-agent-<host>-<pid>``) is sent as the
``settledBy`` of its settlements, so two copies never look like one. A settlement Settle answers from an
earlier identical one (``replayed``: this agent's own retry, nothing sent twice) is printed as such.

Settings: ``SETTLE_URL`` (default: what ``make run`` serves, ``http://127.0.0.1:7071``),
``SETTLE_FUNCTION_KEY`` (Azure).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from typing import Any

from settle_client import Conflict, Handoff, SettleClient, SettlementAccepted


def book(handoff: Handoff) -> dict[str, Any]:
    """Stands in for the handed-off work; raises ValueError when the event cannot be booked."""
    event = handoff.payload_json() or {}
    if event.get("rows", 0) < 0:
        raise ValueError(f"cannot book {event.get('rows')} rows")
    return {"booked": event.get("invoiceId")}


def replayed(answer: SettlementAccepted) -> str:
    """Say so when Settle answered from an earlier identical settlement (nothing was sent again)."""
    return f" (replayed: already settled by {answer.settled_by})" if answer.replayed else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("endpoint")
    parser.add_argument("--event-type", action="append", dest="event_types")
    parser.add_argument("--max", type=int, default=0, help="stop after this many settlements (0: never)")
    parser.add_argument("--wait", type=float, default=20.0, help="long-poll seconds (at most 20)")
    parser.add_argument("--agent-id", default=f"example-agent-{socket.gethostname()}-{os.getpid()}")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    key = os.environ.get("SETTLE_FUNCTION_KEY")
    settled = 0
    with SettleClient(function_key=key, agent_id=args.agent_id) as client:
        print(
            f"{args.agent_id} watching {args.endpoint} for {args.event_types or 'every event type'}",
            flush=True,
        )
        for handoff in client.handoffs.watch(
            args.endpoint, args.event_types, wait_seconds=args.wait, stop=stop
        ):
            event_id = handoff.coordinates.event_id
            try:
                try:
                    result = book(handoff)
                except ValueError as error:
                    answer = handoff.fail(str(error), error_type="BookingRejected")
                    print(f"{event_id}: failed ({error}){replayed(answer)}", flush=True)
                else:
                    answer = handoff.complete(result=result)
                    print(f"{event_id}: completed{replayed(answer)}", flush=True)
            except Conflict as conflict:  # another agent settled it first
                print(f"{event_id}: not settled here ({conflict.detail})", flush=True)
                continue
            settled += 1
            if args.max and settled >= args.max:
                break
    print(f"stopped after {settled} settlement(s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
