"""``make demo``: realistic traffic through the resolver, so a newcomer's console has something to show.

Sends NimBus messages to a running Settle (``make run``, or any development host) through the host's
``POST /admin/functions/resolver`` (what Service Bus would deliver), so every row is the resolver's own
projection: nothing is written to storage directly. Three endpoints (``Billing``, ``Shipping``, ``Crm``)
receive invoices, shipments and customer updates; the answers park hand-offs (one overdue), fail with the
errors an ERP really returns (a dozen on Billing, enough to try a bulk resubmit), defer, dead-letter,
report unsupported types, and two messages are poison (a misspelt message type, a body that is not JSON).
One customer's session carries several events, so the session view shows a blocked session.

Every id carries a run tag (``--tag``, default: the time), so running it twice adds a second set beside the
first instead of colliding with it. ``--base-url`` names the app; by default ``SETTLE_URL``, the address
every entry point follows (``SETTLE_DEMO_URL``, its older name here, wins when set), else what ``make run``
serves (http://127.0.0.1:7071, or the port ``SETTLE_RUN_PORT`` names).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from settle_client.address import default_url

ERRORS = (
    ("ERP timeout after 30 s (POST /ledger/invoices)", "TimeoutException"),
    ("Customer 10442 is blocked for invoicing", "BusinessRuleException"),
    ("Deadlock victim on table INVOICE_LINES; rerun the transaction", "SqlException"),
    ("VAT code 'S9' is unknown in company 100", "ValidationException"),
)


@dataclass
class Demo:
    """The messages of one demo run, built in order (a response follows its request)."""

    tag: str
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    messages: list[dict[str, Any]] = field(default_factory=list)
    expected: dict[str, int] = field(default_factory=dict)  # what the run should leave, for a reader

    def ident(self, name: str) -> str:
        return f"{name}-{self.tag}"

    def message(
        self,
        kind: str,
        *,
        endpoint: str,
        event: str,
        session: str,
        event_type: str,
        payload: dict[str, Any] | None,
        parent: str = "self",
        error: tuple[str, str] | None = None,
        suffix: str = "req",
        **props: Any,
    ) -> str:
        request = kind.endswith("Request")
        message_id = f"{event}-{suffix}"
        body: dict[str, Any] = {"EventContent": None, "ErrorContent": None}
        if payload is not None:
            body["EventContent"] = {"EventTypeId": event_type, "EventJson": json.dumps(payload)}
        if error is not None:
            body["ErrorContent"] = {"ErrorText": error[0], "ErrorType": error[1]}
        self.messages.append(
            {
                "messageId": message_id,
                "sessionId": session,
                "correlationId": f"corr-{event}",
                "applicationProperties": {
                    "MessageType": kind,
                    "To": endpoint if request else "Resolver",
                    "From": "Erp" if request else endpoint,
                    "EventId": event,
                    "EventTypeId": event_type,
                    "OriginatingMessageId": "self",
                    "ParentMessageId": parent,
                    "OriginatingFrom": "self",
                    "RetryCount": 0,
                    **props,
                },
                "body": body,
                "enqueuedTimeUtc": (self.now + timedelta(milliseconds=len(self.messages))).isoformat(),
            }
        )
        return message_id

    def event(
        self,
        endpoint: str,
        name: str,
        event_type: str,
        payload: dict[str, Any],
        answer: str | None,
        *,
        session: str | None = None,
        error: tuple[str, str] | None = None,
        **props: Any,
    ) -> str:
        event = self.ident(name)
        session = session or f"s-{event}"
        request = self.message(
            "EventRequest",
            endpoint=endpoint,
            event=event,
            session=session,
            event_type=event_type,
            payload=payload,
        )
        if answer is not None:
            self.message(
                answer,
                endpoint=endpoint,
                event=event,
                session=session,
                event_type=event_type,
                payload=None,
                parent=request,
                error=error,
                suffix=answer[:3].lower(),
                **props,
            )
        bucket = _bucket(answer, props)
        # A parked event counts as Pending too (the overview's Pending includes Pending + Handoff).
        for name in (bucket, "Pending") if bucket == "PendingHandoff" else (bucket,):
            key = f"{endpoint}.{name}"
            self.expected[key] = self.expected.get(key, 0) + 1
        return event

    def poison(self, name: str, *, endpoint: str, kind: str, body: Any) -> None:
        event = self.ident(name)
        self.messages.append(
            {
                "messageId": f"{event}-req",
                "sessionId": f"s-{event}",
                "correlationId": f"corr-{event}",
                "applicationProperties": {
                    "MessageType": kind,
                    "To": endpoint,
                    "From": "Erp",
                    "EventId": event,
                    "EventTypeId": "InvoiceCreated",
                },
                "body": body,
                "enqueuedTimeUtc": self.now.isoformat(),
            }
        )
        self.expected[f"{endpoint}.Poison"] = self.expected.get(f"{endpoint}.Poison", 0) + 1


def _bucket(answer: str | None, props: dict[str, Any]) -> str:
    if answer is None:
        return "Pending"
    if answer == "ErrorResponse":
        return "DeadLettered" if props.get("DeadLetterErrorDescription") else "Failed"
    return {
        "ResolutionResponse": "Completed",
        "DeferralResponse": "Deferred",
        "UnsupportedResponse": "Unsupported",
        "PendingHandoffResponse": "PendingHandoff",
        "SkipResponse": "Skipped",
    }[answer]


def build(tag: str, *, now: datetime | None = None) -> Demo:
    """The demo's traffic (see the module docstring)."""
    demo = Demo(tag=tag, now=now or datetime.now(UTC))
    soon = (demo.now + timedelta(hours=4)).isoformat().replace("+00:00", "Z")
    overdue = (demo.now - timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    customer = demo.ident("customer-10442")
    for n in range(1, 9):
        demo.event("Billing", f"inv-{1000 + n}", "InvoiceCreated", _invoice(n), "ResolutionResponse")
    for n in range(1, 13):
        demo.event(
            "Billing",
            f"inv-{2000 + n}",
            "InvoiceCreated",
            _invoice(n),
            "ErrorResponse",
            error=ERRORS[n % len(ERRORS)],
            session=customer if n <= 3 else None,
        )
    demo.event("Billing", "inv-3001", "InvoiceCreated", _invoice(31), None, session=customer)
    demo.event("Billing", "inv-3002", "InvoiceCreated", _invoice(32), None)
    for n, reason, job, expected_by in (
        (1, "Posting in the ledger", "job-7781", soon),
        (2, "Waiting for the bank's settlement file", "job-7790", overdue),
    ):
        demo.event(
            "Billing",
            f"inv-{4000 + n}",
            "InvoicePosted",
            _invoice(40 + n),
            "PendingHandoffResponse",
            HandoffReason=reason,
            ExternalJobId=demo.ident(job),
            ExpectedBy=expected_by,
        )
    for n in range(1, 4):
        demo.event(
            "Shipping",
            f"shp-{n}",
            "ShipmentBooked",
            {"shipmentId": f"SH-{n}", "carrier": "DHL"},
            "ResolutionResponse",
        )
    demo.event(
        "Shipping", "shp-10", "ShipmentBooked", {"shipmentId": "SH-10"}, "DeferralResponse", session=customer
    )
    demo.event(
        "Shipping",
        "shp-11",
        "ShipmentBooked",
        {"shipmentId": "SH-11"},
        "ErrorResponse",
        error=("Carrier API answered 503 ten times", "HttpRequestException"),
        DeadLetterErrorDescription="MaxDeliveryCountExceeded",
    )
    demo.event("Shipping", "shp-12", "ShipmentCancelled", {"shipmentId": "SH-12"}, "UnsupportedResponse")
    demo.event(
        "Crm", "cus-1", "CustomerUpdated", {"customerId": 10442, "name": "Nordlys AS"}, "ResolutionResponse"
    )
    demo.event(
        "Crm",
        "cus-2",
        "CustomerUpdated",
        {"customerId": 10443},
        "ErrorResponse",
        error=("Field 'email' is required", "ValidationException"),
    )
    demo.poison("inv-typo", endpoint="Billing", kind="EventRequested", body={"EventContent": None})
    demo.poison("inv-garbled", endpoint="Billing", kind="EventRequest", body="{not json")
    return demo


def _invoice(n: int) -> dict[str, Any]:
    return {
        "invoiceId": f"INV-{n:05d}",
        "customerId": 10442 + n % 3,
        "amount": 120 + 15 * n,
        "currency": "NOK",
    }


def send(demo: Demo, post: Callable[[dict[str, Any]], int]) -> int:
    """Every message in order; the number the resolver accepted (202)."""
    accepted = 0
    for message in demo.messages:
        status = post(message)
        if status != 202:
            raise SystemExit(f"[make demo] the resolver answered {status} for {message['messageId']}")
        accepted += 1
    return accepted


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--base-url",
        default=os.environ.get("SETTLE_DEMO_URL") or default_url(),
        help="the app (default SETTLE_URL, or SETTLE_DEMO_URL; else what make run serves)",
    )
    parser.add_argument("--tag", default=datetime.now(UTC).strftime("%H%M%S"))
    args = parser.parse_args(argv)
    base = args.base_url.rstrip("/")
    try:
        httpx.get(f"{base}/api/v1/health", timeout=5)
    except httpx.TransportError:
        print(f"[make demo] nothing answers at {base}: start Settle first (`make run`, another terminal).")
        return 1
    demo = build(args.tag)
    with httpx.Client(timeout=60) as client:
        count = send(demo, lambda m: client.post(f"{base}/admin/functions/resolver", json=m).status_code)
    print(f"[make demo] {count} messages through the resolver (tag {args.tag}); expected:")
    for key, value in sorted(demo.expected.items()):
        print(f"  {key}: {value}")
    print(f"[make demo] open {base}/api/console")
    return 0


if __name__ == "__main__":
    sys.exit(main())
