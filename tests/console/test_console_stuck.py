"""The console's way out of a stuck settlement, in Debian's Chromium: the overview's
badges, the list of unconfirmed settlements and overdue hand-offs, only the actions that can succeed,
the resolution (release) audited, and every action sent with the message it addresses (``messageId``).
"""

from __future__ import annotations

import json
import os
import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from .conftest import api_json, nimbus_message, resolver_message

pytestmark = pytest.mark.browser

ENDPOINT = "Ledger"


def unconfirmed_settlement(azurite: str, prefix: str, event_id: str) -> None:
    """Make the parked hand-off's settlement unconfirmed, as it happens: topics without duplicate detection,
    a send whose outcome is unknown, the reconciler past its wait (this process, the host's tables)."""
    from common import runtime
    from handoff import service
    from handoff.messages.contract import Coordinates, MessageType
    from handoff.settlement.settler import Settlement
    from tests.handoff.broker import Broker, BrokerTransport

    saved = os.environ.get("SETTLE_TABLE_PREFIX")
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    runtime.reset()
    try:
        service.use_transport(BrokerTransport(Broker(window=None)).then(["lost-before"]))
        settlement = service.settlement_service()
        settlement.settle(
            Settlement(
                kind=MessageType.HandoffCompletedRequest,
                endpoint_id=ENDPOINT,
                coordinates=Coordinates(event_id=event_id, message_id=f"{event_id}-park"),
                settled_by="erp-agent",
            )
        )
        settlement.clock = lambda: datetime.now(UTC) + timedelta(minutes=3)
        service.reconciler().run()
    finally:
        if saved is not None:
            os.environ["SETTLE_TABLE_PREFIX"] = saved
        runtime.reset()


@pytest.fixture(scope="module", autouse=True)
def leave_the_page(browser_page: Any, console_host: Any) -> Any:
    """The page stops polling before the host stops (else its refused polls count as page errors)."""
    yield
    browser_page.goto("about:blank")


@pytest.fixture(scope="module")
def stuck(console_host, azurite_connection) -> str:
    host, prefix = console_host
    event_id = "evt-stuck"
    resolver_message(
        host.base_url,
        **nimbus_message("EventRequest", endpoint=ENDPOINT, event_id=event_id, message_id=f"{event_id}-req"),
    )
    overdue = (datetime.now(UTC) - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    resolver_message(
        host.base_url,
        **nimbus_message(
            "PendingHandoffResponse",
            endpoint=ENDPOINT,
            event_id=event_id,
            message_id=f"{event_id}-park",
            parent=f"{event_id}-req",
            HandoffReason="Posting",
            ExternalJobId="job-1",
            ExpectedBy=overdue,
        ),
    )
    unconfirmed_settlement(azurite_connection, prefix, event_id)
    return event_id


def test_an_unconfirmed_settlement_is_shown_and_released_from_the_page(browser_page, console_host, stuck):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    sent: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: (
            sent.append({"url": r.url, "body": json.loads(r.post_data)}) if r.method == "POST" else None
        ),
    )
    page.goto(f"{host.base_url}/api/console")
    row = page.locator(f'tr[data-endpoint="{ENDPOINT}"]')
    expect(row.locator('[data-bucket="Unconfirmed"]')).to_have_text("1")
    expect(row.locator('[data-bucket="Overdue"]')).to_have_text("1")
    row.locator('[data-bucket="Unconfirmed"]').click()
    expect(page.locator("h1")).to_have_text(f"Needs a human on {ENDPOINT}")
    expect(page.locator(f'tr[data-unconfirmed="{stuck}"]')).to_contain_text("erp-agent")
    expect(page.locator(f'tr[data-overdue="{stuck}"]')).to_be_visible()
    page.locator(f'tr[data-unconfirmed="{stuck}"] a').click()
    expect(page.locator("h1")).to_have_text(f"Event {stuck}")
    # Only what can succeed: the resolutions, no complete / fail / resubmit / skip
    expect(page.locator("#release")).to_be_visible()
    expect(page.locator("#mark-delivered")).to_be_visible()
    for absent in ("#complete", "#fail", "#resubmit", "#skip"):
        expect(page.locator(absent)).to_have_count(0)
    page.click("#release")
    page.fill("#resolve-reason", "Not in the ERP: it never arrived")
    page.click("#confirm-ok")
    expect(page.locator("#toast")).to_contain_text("Settlement released")
    expect(page.locator('tr[data-audit="ResolveSettlement"]')).to_be_visible()
    # Released: the hand-off can be settled again, and the page says so
    expect(page.locator("#complete")).to_be_visible()
    page.click("#complete")
    page.click("#confirm-ok")
    expect(page.locator('tr[data-audit="CompleteHandoff"]')).to_have_count(2)
    row_now = api_json(host.base_url, f"endpoints/{ENDPOINT}/events/{stuck}")
    assert row_now["pendingSubStatus"] is None and row_now["messageType"] == "HandoffCompletedRequest"
    complete = [s for s in sent if addressed(s["url"], "/api/v1/events/complete", stuck)]
    assert complete and complete[-1]["body"]["messageId"] == f"{stuck}-park"
    resolve = [s for s in sent if addressed(s["url"], "/api/v1/events/settlement/resolve", stuck)]
    assert resolve[-1]["body"]["resolution"] == "released"


@pytest.mark.parametrize(
    ("action", "parked", "audit"),
    [("resubmit", False, "Resubmit"), ("skip", False, "Skip"), ("fail", True, "FailHandoff")],
)
def test_resubmit_skip_and_fail_send_the_message_the_operator_saw(
    browser_page, console_host, action, parked, audit
):
    """Each single action names the failed or parked message the page showed (``messageId``), so that a
    retry of it is answered from its claim (complete and bulk: above and in test_console_oncall)."""
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    endpoint, event_id = "Payroll", f"evt-{action}"
    resolver_message(
        host.base_url,
        **nimbus_message("EventRequest", endpoint=endpoint, event_id=event_id, message_id=f"{event_id}-req"),
    )
    shown = f"{event_id}-park" if parked else f"{event_id}-err"
    answer = (
        nimbus_message(
            "PendingHandoffResponse",
            endpoint=endpoint,
            event_id=event_id,
            message_id=shown,
            parent=f"{event_id}-req",
            HandoffReason="Posting",
            ExternalJobId=f"job-{action}",
        )
        if parked
        else nimbus_message(
            "ErrorResponse",
            endpoint=endpoint,
            event_id=event_id,
            message_id=shown,
            parent=f"{event_id}-req",
            error_text="ERP timeout",
        )
    )
    resolver_message(host.base_url, **answer)
    sent: list[dict[str, Any]] = []

    def record(request: Any) -> None:
        if request.method == "POST" and "/api/v1/" in request.url:
            sent.append({"url": request.url, "body": json.loads(request.post_data or "null")})

    page.on("request", record)
    try:
        page.goto(f"{host.base_url}/api/console#/event/{endpoint}/{event_id}")
        expect(page.locator("h1")).to_have_text(f"Event {event_id}")
        expect(page.locator("ol.timeline")).to_contain_text(shown)  # the message the operator sees
        page.click(f"#{action}")
        if action == "fail":
            page.fill("#fail-reason", "The payroll run was cancelled")
        page.click("#confirm-ok")
        expect(page.locator(f'tr[data-audit="{audit}"]')).to_be_visible()
    finally:
        page.remove_listener("request", record)
    posted = [s for s in sent if addressed(s["url"], f"/api/v1/events/{action}", event_id)]
    assert len(posted) == 1, sent
    assert posted[0]["body"]["messageId"] == shown


def addressed(url: str, path: str, event_id: str) -> bool:
    """Whether the console's request ``url`` is ``path`` for ``event_id`` (ids travel in the query string)."""
    parts = urllib.parse.urlsplit(url)
    return parts.path == path and dict(urllib.parse.parse_qsl(parts.query)).get("eventId") == event_id
