"""The console in Debian's Chromium: counts, an event resubmitted with its audit, a parked hand-off
settled, poison replayed, a state record looked up, phone width and the keyboard.

The tests of this module run in order against one development host and one browser page; each takes a
screenshot into its temporary folder (the README's come from ``make screenshots``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import WAIT_MS, api_json, nimbus_message, resolver_message

pytestmark = pytest.mark.browser

BILLING = "Billing"
SHIPPING = "Shipping"


def shot(page: Any, folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=True)
    assert (folder / name).stat().st_size > 10_000, f"{name} looks empty"


@pytest.fixture(scope="module")
def traffic(console_host, azurite_connection) -> dict[str, str]:
    """What the resolver sees for two endpoints, plus two poison messages (one replayable)."""
    host, prefix = console_host
    base = host.base_url
    expected_by = (datetime.now(UTC) + timedelta(hours=4)).isoformat().replace("+00:00", "Z")

    def event(endpoint: str, event_id: str, *responses: dict[str, Any]) -> None:
        resolver_message(
            base,
            **nimbus_message(
                "EventRequest", endpoint=endpoint, event_id=event_id, message_id=f"{event_id}-req"
            ),
        )
        for response in responses:
            resolver_message(base, **response)

    def response(kind: str, endpoint: str, event_id: str, **kw: Any) -> dict[str, Any]:
        return nimbus_message(kind, endpoint=endpoint, event_id=event_id, parent=f"{event_id}-req", **kw)

    event(
        BILLING,
        "evt-parked",
        response(
            "PendingHandoffResponse",
            BILLING,
            "evt-parked",
            message_id="evt-parked-park",
            HandoffReason="Posting in the ledger",
            ExternalJobId="job-7781",
            ExpectedBy=expected_by,
        ),
    )
    event(
        BILLING,
        "evt-failed",
        response(
            "ErrorResponse",
            BILLING,
            "evt-failed",
            message_id="evt-failed-err",
            error_text="ERP timeout after 30 s",
        ),
    )
    event(BILLING, "evt-pending")
    event(BILLING, "evt-done", response("ResolutionResponse", BILLING, "evt-done", message_id="evt-done-ok"))
    event(
        SHIPPING,
        "evt-deferred",
        response("DeferralResponse", SHIPPING, "evt-deferred", message_id="evt-deferred-d"),
    )
    event(
        SHIPPING,
        "evt-dead",
        response(
            "ErrorResponse",
            SHIPPING,
            "evt-dead",
            message_id="evt-dead-e",
            error_text="bad",
            DeadLetterErrorDescription="MaxDeliveryCountExceeded",
        ),
    )
    # Poison: a type NimBus does not have (stays poison), and a request whose projection failed until its
    # retry budget was spent (stored as the resolver stores it; a replay projects it).
    resolver_message(
        base,
        **nimbus_message("EventRequested", endpoint=BILLING, event_id="evt-typo", message_id="evt-typo-1"),
    )
    replayable = _store_budget_poison(azurite_connection, prefix)
    return {"replayable": replayable}


def _store_budget_poison(connection: str, prefix: str) -> str:
    import json

    from common.settings import TableSettings
    from common.tables import Tables
    from handoff.storage.keys import Layout
    from handoff.storage.records import PoisonRow
    from handoff.storage.store import HandoffStore

    message = nimbus_message(
        "EventRequest", endpoint=BILLING, event_id="evt-replayed", message_id="evt-replayed-req"
    )
    now = datetime.now(UTC)
    row = PoisonRow(
        reason="retry budget exhausted after 10 attempts: ServiceResponseError: connection reset",
        message_id=message["messageId"],
        session_id=message["sessionId"],
        correlation_id=message["correlationId"],
        delivery_count=10,
        enqueued_time_utc=now,
        recorded_at=now,
        application_properties=json.dumps(message["applicationProperties"]),
        message_content=json.dumps(message["body"]),
        endpoint_id=BILLING,
    )
    tables = Tables(
        TableSettings(connection_string=connection, service_uri=None, client_id=None, prefix=prefix)
    )
    try:
        _, row_key = HandoffStore(tables, Layout()).store_poison(row, row.message_id)  # poison: unsharded
    finally:
        tables.close()
    return row_key


def badge(page: Any, endpoint: str, bucket: str) -> Any:
    return page.locator(f'tr[data-endpoint="{endpoint}"] [data-bucket="{bucket}"]')


def test_the_overview_shows_exact_counts_as_badges(browser_page, shots, console_host, traffic):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console")
    expect(page.locator("h1")).to_have_text("Endpoints")
    expect(badge(page, BILLING, "Pending")).to_have_text("2")  # evt-parked and evt-pending
    expect(badge(page, BILLING, "PendingHandoff")).to_have_text("1")
    expect(badge(page, BILLING, "Failed")).to_have_text("1")
    expect(badge(page, BILLING, "Poison")).to_have_text("2")
    expect(badge(page, SHIPPING, "Deferred")).to_have_text("1")
    expect(badge(page, SHIPPING, "DeadLettered")).to_have_text("1")
    api = {i["endpointId"]: i for i in api_json(host.base_url, "endpoints")["items"]}
    assert api[BILLING]["counts"]["pendingHandoff"] == 1 and api[BILLING]["poison"] == 2
    # The poison badge opens the day of the oldest unresolved poison (the page lists one day at a time)
    assert api[BILLING]["oldestPoisonDay"]
    expect(badge(page, BILLING, "Poison")).to_have_attribute(
        "href", f"#/poison?day={api[BILLING]['oldestPoisonDay']}"
    )
    shot(page, shots, "console-endpoints.png")


def test_an_event_is_opened_resubmitted_with_changes_and_its_audit_shown(
    browser_page, shots, console_host, traffic
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    badge(page, BILLING, "Failed").click()
    expect(page.locator("h1")).to_have_text(f"Events of {BILLING}")
    page.locator('tr[data-event="evt-failed"] a').click()
    expect(page.locator("h1")).to_have_text("Event evt-failed")
    expect(page.locator("ol.timeline")).to_contain_text("ErrorResponse")
    expect(page.locator("ol.timeline")).to_contain_text("ERP timeout after 30 s")
    expect(page.locator("pre[aria-label=Payload]")).to_contain_text('"invoiceId": "INV-1"')
    page.fill("#resubmit-payload", '{"invoiceId": "INV-1", "amount": 120}')
    page.click("#resubmit")
    expect(page.locator("#confirm")).to_be_visible()
    expect(page.locator("#confirm-title")).to_have_text("Resubmit with changes?")
    page.click("#confirm-ok")
    expect(page.locator('tr[data-audit="ResubmitWithChanges"]')).to_be_visible()
    expect(page.locator("#toast")).to_contain_text("ResubmitWithChanges accepted")
    row = api_json(host.base_url, f"endpoints/{BILLING}/events/evt-failed")
    assert row["resolutionStatus"] == "Pending" and row["messageType"] == "ResubmissionRequest"
    assert '"amount": 120' in row["history"][-1]["messageContent"]["EventContent"]["EventJson"].replace(
        ":", ": "
    ).replace(":  ", ": ")
    page.evaluate("document.getElementById('toast').textContent = ''")  # it would cover the audit
    shot(page, shots, "console-event.png")


def test_a_parked_hand_off_is_settled_from_the_page(browser_page, shots, console_host, traffic):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/event/{BILLING}/evt-parked")
    expect(page.locator("h1")).to_have_text("Event evt-parked")
    handoff = page.locator('[aria-label="Handoff details"]')
    expect(handoff).to_contain_text("Posting in the ledger")
    expect(handoff).to_contain_text("job-7781")
    shot(page, shots, "console-handoff.png")
    page.fill("#complete-result", '{"ledgerEntry": 7781}')
    page.click("#complete")
    page.click("#confirm-ok")
    expect(page.locator('tr[data-audit="CompleteHandoff"]')).to_be_visible()
    row = api_json(host.base_url, f"endpoints/{BILLING}/events/evt-parked")
    assert row["messageType"] == "HandoffCompletedRequest" and row["pendingSubStatus"] is None
    assert httpx.get(f"{host.base_url}/api/v1/handoffs/{BILLING}/next", timeout=30).status_code == 204


def test_poison_is_replayed_from_the_page(browser_page, shots, console_host, traffic):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/poison")
    expect(page.locator("h1")).to_have_text("Poison")
    typo = page.locator('tr[data-poison="evt-typo-1"]')
    expect(typo).to_contain_text("Unknown MessageType")
    replayable = page.locator('tr[data-poison="evt-replayed-req"]')
    expect(replayable).to_contain_text("retry budget exhausted")
    replayable.locator("[data-replay]").click()
    page.click("#confirm-ok")
    expect(page.locator("#toast")).to_contain_text("Replay: applied")
    expect(replayable).to_contain_text("applied by api")
    expect(replayable.locator("button")).to_have_count(0)  # a projected replay is not offered again
    typo.locator("[data-replay]").click()
    page.click("#confirm-ok")
    expect(page.locator("#toast")).to_contain_text("Replay: poisoned")
    shot(page, shots, "console-poison.png")
    assert (
        api_json(host.base_url, f"endpoints/{BILLING}/events/evt-replayed")["resolutionStatus"] == "Pending"
    )
    page.goto(f"{host.base_url}/api/console#/")
    expect(badge(page, BILLING, "Poison")).to_have_text("1")


def test_a_state_record_is_looked_up_and_a_stuck_lock_listed(browser_page, shots, console_host):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    base = f"{host.base_url}/api/v1/state"
    key = {"tenantId": 1, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice", "itemKey": "INV-42"}
    token = httpx.post(f"{base}/lock", json={"key": key}, timeout=30).json()["lockToken"]
    done = httpx.post(
        f"{base}/set",
        json={"key": key, "status": "Processed", "lockToken": token, "data": {"posted": True}},
        timeout=30,
    )
    assert done.status_code == 200, done.text
    stuck_key = {**key, "itemKey": "INV-STUCK"}
    assert httpx.post(f"{base}/lock", json={"key": stuck_key, "lockSeconds": 1}, timeout=30).json()[
        "acquired"
    ]
    page.goto(f"{host.base_url}/api/console#/state")
    expect(page.locator("h1")).to_have_text("State records")
    page.fill("#lookup-key", json.dumps(key))  # the key as the API takes it, pasted
    expect(page.locator("#lookup-scope")).to_have_value("Element")
    page.click("#lookup")
    expect(page.locator("#record h2").first).to_have_text("Record: Processed")
    expect(page.locator("#record")).to_contain_text("Superseded")
    # The page polls: the lock that expired shows up once its expiry index row is written
    expect(page.locator("section")).to_contain_text("INV-STUCK", timeout=WAIT_MS * 2)
    shot(page, shots, "console-state.png")


def test_the_console_is_readable_at_phone_width_and_usable_with_the_keyboard(
    browser_page, shots, console_host, traffic
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        page.goto(f"{host.base_url}/api/console#/")
        expect(badge(page, BILLING, "PendingHandoff")).to_be_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the page scrolls sideways at phone width ({width} px)"
        shot(page, shots, "console-phone.png")
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
    # Keyboard only: the page puts focus on its content; Shift+Tab walks back to the Poison link in the
    # navigation, Enter opens it.
    page.goto(f"{host.base_url}/api/console#/")
    expect(page.locator("h1")).to_have_text("Endpoints")
    assert page.evaluate("document.activeElement.id") == "main"
    for _ in range(8):
        page.keyboard.press("Shift+Tab")
        if page.evaluate("document.activeElement.textContent") == "Poison":
            break
    assert page.evaluate("document.activeElement.textContent") == "Poison"
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Poison")
    assert page.evaluate("location.hash") == "#/poison"
