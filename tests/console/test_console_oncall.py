"""What an on-call engineer reaches for, in Debian's Chromium, driven on ``make demo``'s traffic.

Every view is checked at 1280 px and at 375 px: no sideways scroll, and axe-core (``node_modules``,
injected into the page) finds no serious or critical violation. The tests of this module run in order
against one development host and one browser page (the README's screenshots come from
``make screenshots``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools import demo as demo_traffic

from .conftest import WAIT_MS, api_json, forgive_errors

pytestmark = pytest.mark.browser

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = (1280, 375)


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations of the page as it is now (WCAG 2 A/AA rules)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        # Evaluated by the browser's debugger, so the page's CSP (script-src 'self') does not apply.
        page.evaluate(AXE.read_text(encoding="utf-8") + "\n;undefined")
    result = page.evaluate(
        """async () => {
            const tags = ["wcag2a", "wcag2aa", "wcag21aa"];
            const r = await axe.run(document, { runOnly: { type: "tag", values: tags } });
            return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help,
              nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" ")) }));
        }"""
    )
    return [v for v in result if v["impact"] in ("serious", "critical")]


def check_both_widths(page: Any, shots: Path, name: str, ready: str) -> None:
    """The view at 1280 px and 375 px: readable without sideways scroll, no serious axe violation."""
    from playwright.sync_api import expect

    try:
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            expect(page.locator(ready).first).to_be_visible()
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= width, f"{name}: the page scrolls sideways at {width} px ({scroll} px)"
            violations = axe_violations(page)
            assert not violations, f"{name} at {width} px: {json.dumps(violations, indent=1)}"
            suffix = "" if width == 1280 else "-phone"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / f"console-{name}{suffix}.png"), full_page=True)
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})


@pytest.fixture(scope="module")
def demo(console_host) -> demo_traffic.Demo:
    """``make demo``'s traffic, through the resolver of the test's host (tag ``t``)."""
    host, _ = console_host
    built = demo_traffic.build("t")
    sent = demo_traffic.send(
        built,
        lambda m: httpx.post(f"{host.base_url}/admin/functions/resolver", json=m, timeout=30).status_code,
    )
    assert sent == len(built.messages)
    return built


@pytest.fixture(scope="module", autouse=True)
def leave_the_page(browser_page: Any, console_host: Any) -> Any:
    """The page stops polling before the host stops (else its refused polls count as page errors)."""
    yield
    browser_page.goto("about:blank")


def api_post(base: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{base}/api/v1/{path}", json=body, timeout=30)


def test_make_demo_traffic_gives_the_console_something_to_show(browser_page, shots, console_host, demo):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    items = {i["endpointId"]: i for i in api_json(host.base_url, "endpoints")["items"]}
    for key, expected in demo.expected.items():
        endpoint, bucket = key.split(".")
        field = bucket[0].lower() + bucket[1:]
        got = items[endpoint]["poison"] if bucket == "Poison" else items[endpoint]["counts"][field]
        assert got == expected, f"{key}: {got} != {expected}"
    page.goto(f"{host.base_url}/api/console#/")
    expect(page.locator('tr[data-endpoint="Billing"] [data-bucket="Failed"]')).to_have_text("12")
    check_both_widths(page, shots, "demo", 'tr[data-endpoint="Crm"]')


def test_a_failed_event_shows_the_error_text_and_type_of_the_message_that_failed_it(
    browser_page, shots, console_host, demo
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    event = demo.ident("inv-2001")  # ERRORS[1]
    page.goto(f"{host.base_url}/api/console#/event/Billing/{event}")
    expect(page.locator("h1")).to_have_text(f"Event {event}")
    expect(page.locator('[data-fact="error-text"]')).to_have_text("Customer 10442 is blocked for invoicing")
    expect(page.locator('[data-fact="error-type"]')).to_have_text("BusinessRuleException")
    check_both_widths(page, shots, "failed-event", '[data-fact="error-text"]')


def test_resubmit_asks_a_reason_the_audit_is_pretty_and_fits_a_phone_and_the_page_says_it_waits(
    browser_page, shots, console_host, demo
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    event = demo.ident("inv-2005")
    page.goto(f"{host.base_url}/api/console#/event/Billing/{event}")
    expect(page.locator("h1")).to_have_text(f"Event {event}")  # not the previous event's buttons
    page.click("#resubmit")
    expect(page.locator("#resubmit-reason")).to_be_focused()
    page.fill("#resubmit-reason", "ERP is back after the outage")
    page.click("#confirm-ok")
    audit = page.locator('tr[data-audit="Resubmit"]')
    expect(audit).to_contain_text("ERP is back after the outage")
    audit.locator("details.audit-data summary").click()  # folded until asked for
    data = audit.locator("details.audit-data pre")
    expect(data).to_contain_text('  "controlMessageId": ')  # pretty-printed, not escaped JSON
    # The toast sits above the content, never over the timeline or the audits
    expect(page.locator("#toast")).to_contain_text("Resubmit accepted")
    toast_box = page.locator("#toast").bounding_box()
    for target in ("ol.timeline", 'table[aria-label="Audits"]'):
        box = page.locator(target).bounding_box()
        assert toast_box["y"] + toast_box["height"] <= box["y"], f"the toast covers {target}"
    # The loopback projected the ResubmissionRequest: nothing to do but wait, and the page says so
    expect(page.locator('[data-waiting="ResubmissionRequest"]')).to_contain_text("waits for Billing's answer")
    page.set_viewport_size({"width": 375, "height": 800})
    try:
        table = page.locator('table[aria-label="Audits"]').bounding_box()
        assert table["width"] <= 375, f"the audit table is {table['width']} px wide at 375 px"
        for label in ("When", "Type", "By"):
            cell = audit.locator(f'td[data-label="{label}"]').bounding_box()
            assert cell["x"] >= 0 and cell["x"] + cell["width"] <= 375, f"{label} is off-screen"
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
    check_both_widths(page, shots, "event", 'table[aria-label="Audits"]')


def test_destructive_dialogs_start_on_cancel_and_fail_takes_an_error_type(browser_page, console_host, demo):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/event/Billing/{demo.ident('inv-2003')}")
    expect(page.locator("h1")).to_have_text(f"Event {demo.ident('inv-2003')}")
    page.click("#skip")
    expect(page.locator("#confirm button[value=cancel]")).to_be_focused()
    expect(page.locator("#confirm-ok")).to_have_class("danger")
    page.keyboard.press("Enter")  # Enter on Cancel: nothing happens
    expect(page.locator("#confirm")).not_to_be_visible()
    assert (
        api_json(host.base_url, f"endpoints/Billing/events/{demo.ident('inv-2003')}")["resolutionStatus"]
        == "Failed"
    )
    page.goto(f"{host.base_url}/api/console#/event/Billing/{demo.ident('inv-4002')}")
    expect(page.locator("h1")).to_have_text(f"Event {demo.ident('inv-4002')}")
    page.click("#fail")
    expect(page.locator("#confirm-ok")).to_have_class("danger")
    expect(page.locator("#confirm button[value=cancel]")).to_be_focused()
    page.fill("#fail-reason", "The bank rejected the file")
    page.fill("#fail-type", "BankRejected")
    page.click("#confirm-ok")
    expect(page.locator('tr[data-audit="FailHandoff"]')).to_be_visible()
    history = api_json(host.base_url, f"endpoints/Billing/events/{demo.ident('inv-4002')}")["history"]
    error = history[-1]["messageContent"]["ErrorContent"]
    assert (error["ErrorText"], error["ErrorType"]) == ("The bank rejected the file", "BankRejected")


def test_a_404_has_a_way_back_and_an_unknown_endpoint_is_said(browser_page, shots, console_host, demo):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/event/Billing/no-such-event")
    expect(page.locator("main [role=alert]")).to_contain_text("404")
    forgive_errors(page, "status of 404")
    page.click("text=← Events of Billing")
    expect(page.locator("h1")).to_have_text("Events of Billing")
    page.goto(f"{host.base_url}/api/console#/endpoint/billing")  # the case is wrong
    expect(page.locator("[data-unknown-endpoint]")).to_contain_text('No endpoint named "billing"')
    check_both_widths(page, shots, "unknown-endpoint", "[data-unknown-endpoint]")


def test_when_settle_is_unreachable_the_last_data_stays_with_a_stale_banner(browser_page, console_host, demo):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/")
    expect(page.locator('tr[data-endpoint="Billing"]')).to_be_visible()
    expect(page.locator("#refresh")).to_contain_text("Updated")
    updated = page.locator("#refresh").text_content()
    page.route("**/api/v1/**", lambda route: route.abort())
    try:
        expect(page.locator("#stale")).to_contain_text("Settle unreachable since", timeout=WAIT_MS)
        expect(page.locator("#stale")).to_contain_text("retrying")
        expect(page.locator('tr[data-endpoint="Billing"]')).to_be_visible()  # the last data is kept
        assert page.locator("#refresh").text_content() == updated  # "Updated" does not move
    finally:
        page.unroute("**/api/v1/**")
    expect(page.locator("#stale")).to_be_hidden(timeout=WAIT_MS)
    forgive_errors(page, "net::ERR_FAILED", "Failed to fetch")
    page.route(
        "**/api/v1/endpoints",
        lambda route: route.fulfill(
            status=503, content_type="text/html", body="<h1>Service Unavailable</h1>"
        ),
    )
    try:
        expect(page.locator("#stale")).to_contain_text("Settle unreachable", timeout=WAIT_MS)
        expect(page.locator('tr[data-endpoint="Billing"]')).to_be_visible()
    finally:
        page.unroute("**/api/v1/endpoints")
    expect(page.locator("#stale")).to_be_hidden(timeout=WAIT_MS)
    forgive_errors(page, "status of 503")


def test_find_by_event_id_and_session_failed_across_endpoints_and_the_error_filter(
    browser_page, shots, console_host, demo
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/find")
    expect(page.locator("h1")).to_have_text("Find")
    page.fill("#find-q", "INV-40")  # an event id prefix, in another case: both hand-offs
    page.click("#find-go")
    expect(page.locator("tr[data-event]")).to_have_count(2)
    expect(page.locator(f'tr[data-event="{demo.ident("inv-4001")}"]')).to_contain_text("Pending + Handoff")
    check_both_widths(page, shots, "find", "tr[data-event]")
    page.select_option("#find-by", "sessionId")
    page.fill("#find-q", demo.ident("customer-10442"))
    page.click("#find-go")
    expect(page.locator("tr[data-event]")).to_have_count(5)  # 3 failed + 1 pending on Billing, 1 deferred
    page.locator("tr[data-event] td[data-label=Session] a").first.click()
    expect(page.locator("h1")).to_have_text(f"Session {demo.ident('customer-10442')}")
    expect(page.locator("[data-session-state]")).to_have_attribute("data-session-state", "blocked")
    expect(page.locator('tr[data-endpoint-row="Shipping"]')).to_contain_text("Deferred")
    check_both_widths(page, shots, "session", "[data-session-state]")
    page.goto(f"{host.base_url}/api/console#/failed")
    expect(page.locator('tr[data-endpoint-row="Crm"]')).to_contain_text("Field 'email' is required")
    expect(page.locator('tr[data-endpoint-row="Shipping"]')).to_contain_text("DeadLettered")
    page.fill("#error-text", "deadlock")
    page.keyboard.press("Enter")
    expect(page.locator("#error-count")).to_contain_text("3 of")
    expect(page.locator("tr[data-event]")).to_have_count(3)
    check_both_widths(page, shots, "failed", "tr[data-event]")


def test_bulk_resubmit_of_all_matching_with_progress_and_a_partial_failure(
    browser_page, shots, console_host, demo
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/endpoint/Billing?status=Failed&errorText=timeout")
    expect(page.locator("#error-count")).to_be_visible()
    page.click("#bulk-matching")
    timeouts = [demo.ident(f"inv-{2000 + n}") for n in range(1, 13) if n % 4 == 0]
    expect(page.locator("#bulk-count")).to_have_text(f"{len(timeouts)} selected")
    check_both_widths(page, shots, "bulk-select", "input[data-select]:checked")
    # Meanwhile another operator skips one of them: that event's resubmit is refused, the others go on
    skipped = api_post(host.base_url, f"events/Billing/{timeouts[0]}/skip", {"by": "carol"})
    assert skipped.status_code == 202, skipped.text
    posted: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: posted.append(json.loads(r.post_data)) if r.method == "POST" and "/bulk" in r.url else None,
    )
    page.click("#bulk-resubmit")
    expect(page.locator("#confirm-title")).to_have_text(f"Resubmit {len(timeouts)} event(s)?")
    page.fill("#bulk-reason", "ERP timeouts fixed")
    page.click("#confirm-ok")
    expect(page.locator("#bulk-report")).to_contain_text(f"{len(timeouts) - 1} of {len(timeouts)} accepted")
    expect(page.locator(f'[data-refused="{timeouts[0]}"]')).to_contain_text("409")
    expect(page.locator("#bulk-count")).to_have_text("1 selected")  # the refused one stays selected
    check_both_widths(page, shots, "bulk", "#bulk-report")
    # Every event's action addressed the failed message the operator saw (a retried chunk replays)
    addressed = {e: m for body in posted for e, m in body["messageIds"].items()}
    assert sorted(addressed) == sorted(timeouts)
    for event_id in timeouts[1:]:
        failed = api_json(host.base_url, f"endpoints/Billing/events/{event_id}")["history"]
        assert addressed[event_id] in [m["messageId"] for m in failed if m["messageType"] == "ErrorResponse"]
    for event_id in timeouts[1:]:
        row = api_json(host.base_url, f"endpoints/Billing/events/{event_id}")
        assert row["messageType"] == "ResubmissionRequest"
        resubmits = [a for a in row["audits"] if a["auditType"] == "Resubmit"]
        assert [a["comment"] for a in resubmits] == ["ERP timeouts fixed"]
        sent = [m for m in row["history"] if m["messageType"] == "ResubmissionRequest"]
        assert len(sent) == 1


def test_a_bulk_action_shows_its_progress_chunk_by_chunk(browser_page, console_host):
    """Twelve failures are two chunks (ten, then two): while each chunk's request is held, the progress bar
    and its "n / N" text say how far the action is, and the page does not redraw under it."""
    import time

    from playwright.sync_api import Route, expect

    host, _ = console_host
    page = browser_page
    ledger = demo_traffic.Demo(tag="t")
    events = [
        ledger.event(
            "Ledger",
            f"led-{n}",
            "LedgerPosted",
            {"voucher": n},
            "ErrorResponse",
            error=("Period 2026-11 is closed", "BusinessRuleException"),
        )
        for n in range(12)
    ]
    demo_traffic.send(
        ledger,
        lambda m: httpx.post(f"{host.base_url}/admin/functions/resolver", json=m, timeout=30).status_code,
    )
    held: list[Route] = []

    def next_chunk(count: int) -> Route:
        deadline = time.monotonic() + WAIT_MS / 1000
        while len(held) < count:  # the page sends the next chunk once the last one is answered
            assert time.monotonic() < deadline, f"chunk {count} was never sent"
            page.wait_for_timeout(50)
        return held[count - 1]

    def hold(route: Route) -> None:
        held.append(route)

    bulk = re.compile(r".*/api/v1/endpoints/bulk\?endpointId=Ledger$")  # ids travel in the query string
    page.route(bulk, hold)
    try:
        page.goto(f"{host.base_url}/api/console#/endpoint/Ledger?status=Failed")
        expect(page.locator("tr[data-event]")).to_have_count(12)
        page.click("#bulk-matching")
        expect(page.locator("#bulk-count")).to_have_text("12 selected")
        page.click("#bulk-skip")
        page.fill("#bulk-reason", "period closed for good")
        page.click("#confirm-ok")
        progress, text = page.locator("#bulk-progress"), page.locator("#bulk-progress-text")
        next_chunk(1)
        expect(progress).to_be_visible()
        expect(text).to_have_text("0 / 12")
        assert (progress.get_attribute("max"), progress.evaluate("p => p.value")) == ("12", 0)
        expect(page.locator("#bulk-skip")).to_be_disabled()
        next_chunk(1).continue_()
        next_chunk(2)
        expect(text).to_have_text("10 / 12: 10 accepted, 0 refused")
        assert progress.evaluate("p => p.value") == 10
        next_chunk(2).continue_()
        expect(page.locator("#bulk-report")).to_contain_text("12 of 12 accepted")
        expect(progress).to_be_hidden()
    finally:
        page.unroute(bulk)
    assert len(held) == 2
    for event_id in events:
        row = api_json(host.base_url, f"endpoints/Ledger/events/{event_id}")
        assert [a["comment"] for a in row["audits"] if a["auditType"] == "Skip"] == ["period closed for good"]


def test_poison_is_dismissed_with_a_reason_and_edited_and_replayed(browser_page, shots, console_host, demo):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    before = {i["endpointId"]: i for i in api_json(host.base_url, "endpoints")["items"]}["Billing"]["poison"]
    page.goto(f"{host.base_url}/api/console#/")
    page.locator('tr[data-endpoint="Billing"] [data-bucket="Poison"]').click()
    garbled = page.locator(f'tr[data-poison="{demo.ident("inv-garbled")}-req"]')
    expect(garbled).to_be_visible()
    check_both_widths(page, shots, "poison", f'tr[data-poison="{demo.ident("inv-garbled")}-req"]')
    garbled.locator("[data-dismiss]").click()
    expect(page.locator("#confirm button[value=cancel]")).to_be_focused()
    page.fill("#dismiss-reason", "The old ERP's test message; never resent")
    page.click("#confirm-ok")
    expect(page.locator("#toast")).to_contain_text("Dismissed")
    expect(garbled).to_be_hidden()
    page.check("#show-dismissed")
    expect(garbled).to_contain_text("Dismissed by api")
    typo = page.locator(f'tr[data-poison="{demo.ident("inv-typo")}-req"]')
    typo.locator("[data-edit-replay]").click()
    properties = json.loads(page.input_value("#edit-properties"))
    properties["MessageType"] = "EventRequest"
    page.fill("#edit-properties", json.dumps(properties))
    page.fill(
        "#edit-body", json.dumps({"EventContent": {"EventTypeId": "InvoiceCreated", "EventJson": "{}"}})
    )
    page.click("#confirm-ok")
    expect(page.locator("#toast")).to_contain_text("Replay: applied")
    after = {i["endpointId"]: i for i in api_json(host.base_url, "endpoints")["items"]}["Billing"]["poison"]
    assert after == before - 2
    assert (
        api_json(host.base_url, f"endpoints/Billing/events/{demo.ident('inv-typo')}")["resolutionStatus"]
        == "Pending"
    )


def test_audits_are_searched_by_type_and_operator(browser_page, shots, console_host, demo):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    page.goto(f"{host.base_url}/api/console#/audits")
    expect(page.locator("h1")).to_have_text("Audits")
    # Every type the search holds can be chosen, settlement resolutions included
    expect(page.locator('#audit-type option[value="ResolveSettlement"]')).to_have_count(1)
    page.select_option("#audit-type", "DismissPoison")
    page.click("text=Search")
    expect(page.locator('tr[data-audit="DismissPoison"]')).to_have_count(1)
    expect(page.locator('tr[data-audit="DismissPoison"]')).to_contain_text("never resent")
    page.goto(f"{host.base_url}/api/console#/audits?auditType=Resubmit&endpointId=Billing")
    # inv-2005 resubmitted alone, inv-2008 and inv-2012 in bulk (inv-2004's was refused: no audit)
    expect(page.locator('tr[data-audit="Resubmit"]')).to_have_count(3)
    check_both_widths(page, shots, "audits", 'tr[data-audit="Resubmit"]')


def test_state_records_are_browsed_by_node_status_and_scope_name_with_error_and_note(
    browser_page, shots, console_host
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    base = f"{host.base_url}/api/v1/state"
    key = {"tenantId": 7, "scopeId": 4, "entityId": 300, "itemEntityKey": "order", "itemKey": "ORD-1"}
    for item, status in (("ORD-1", "Failed"), ("ORD-2", "Processed")):
        k = {**key, "itemKey": item}
        token = httpx.post(f"{base}/lock", json={"key": k}, timeout=30).json()["lockToken"]
        body = {"key": k, "status": status, "lockToken": token}
        if status == "Failed":
            body["error"] = "Ledger refused the posting: period closed"
        assert httpx.post(f"{base}/set", json=body, timeout=30).status_code == 200
    page.goto(f"{host.base_url}/api/console#/state")
    expect(page.locator("h1").first).to_have_text("State records")
    page.fill('#browse input[name="browseTenantId"]', "7")
    page.select_option("#browse-scope", "Element")
    page.fill('#browse input[name="browseEntityId"]', "300")
    page.select_option("#browse-status", "Failed")
    page.click("#browse-go")
    results = page.locator("#browse-results")
    expect(results.locator("tbody tr")).to_have_count(1)
    expect(results).to_contain_text("Ledger refused the posting: period closed")
    check_both_widths(page, shots, "state-browse", "#browse-results")
    results.locator("[data-lookup='ORD-1']").click()
    expect(page.locator("#record h2").first).to_have_text("Record: Failed")
    # The history shows the error column (the version that failed)
    expect(page.locator('#record td[data-label="Error"]').first).to_contain_text("period closed")
    # A record stuck in Processing past its lock links to its lookup
    stuck = {**key, "itemKey": "ORD-STUCK"}
    assert httpx.post(f"{base}/lock", json={"key": stuck, "lockSeconds": 1}, timeout=30).json()["acquired"]
    link = page.locator("[data-lookup='ORD-STUCK']")
    expect(link).to_be_visible(timeout=WAIT_MS * 2)  # the page polls; the expiry index row comes due
    link.click()
    expect(page.locator("#record h2").first).to_have_text("Record: Processing")
    # Its lock expired: a new lock takes it over, and the record's note says so in the Note column
    taken = httpx.post(f"{base}/lock", json={"key": stuck}, timeout=30).json()
    assert taken["acquired"], taken
    page.goto(f"{host.base_url}/api/console#/state")
    page.fill('#browse input[name="browseTenantId"]', "7")
    page.select_option("#browse-scope", "Element")
    page.fill('#browse input[name="browseEntityId"]', "300")
    page.select_option("#browse-status", "Processing")
    page.click("#browse-go")
    row = page.locator("#browse-results tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator('td[data-label="Note"]')).to_contain_text("Took over lock")
    expect(row.locator('td[data-label="Note"]')).to_contain_text("that expired at")
