"""A console that stays put, in Debian's Chromium, at 1400 px and at 375 px.

Every view keeps the header (navigation and the "Updated" freshness line) on screen, opens at its top
and shows no literal ``null``; the console answers at ``/api/console/`` too; ids and times stay on one
line; a state record is found by pasting its key's JSON with the scope chosen by name; an audit's data
is indented JSON folded in a ``<details>``. The tests of this module share one development host, one
browser page and ``make demo``'s traffic (tag ``p``), plus an event with a UUID for an id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from devtools import demo as demo_traffic
from state.model import Scope

from .conftest import WAIT_MS

pytestmark = pytest.mark.browser

WIDTHS = (1400, 375)
HEIGHT = 800


@dataclass(frozen=True)
class Traffic:
    demo: demo_traffic.Demo
    long_id: str  # a UUID event id on Billing, failed with a long error text
    audited: str  # a Billing event resubmitted with changes (its audit carries JSON)
    record_key: dict[str, Any]  # a Processed state record (scope Element)


@pytest.fixture(scope="module")
def traffic(console_host: Any) -> Traffic:
    host, _ = console_host
    base = host.base_url
    demo = demo_traffic.build("p")
    long_id = demo.event(
        "Billing",
        str(uuid.uuid4()),
        "InvoiceCreated",
        {"invoiceId": "INV-77777"},
        "ErrorResponse",
        error=("The ERP refused the posting: period 2026-12 is closed for company 100 " * 3, "Rejected"),
    )
    sent = demo_traffic.send(
        demo, lambda m: httpx.post(f"{base}/admin/functions/resolver", json=m, timeout=30).status_code
    )
    assert sent == len(demo.messages)
    audited = demo.ident("inv-2005")
    resubmitted = httpx.post(
        f"{base}/api/v1/events/resubmit",
        params={"endpointId": "Billing", "eventId": audited},
        json={
            "eventJson": json.dumps({"invoiceId": "INV-00005", "lines": [{"sku": "A-1", "qty": 2}]}),
            "reason": "VAT code fixed",
        },
        timeout=30,
    )
    assert resubmitted.status_code == 202, resubmitted.text
    key = {"tenantId": 47, "scopeId": int(Scope.ELEMENT), "entityId": 100, "itemEntityKey": "invoice"}
    key["itemKey"] = demo.ident("INV-PASTE")
    state = f"{base}/api/v1/state"
    token = httpx.post(f"{state}/lock", json={"key": key}, timeout=30).json()["lockToken"]
    done = httpx.post(
        f"{state}/set", json={"key": key, "status": "Processed", "lockToken": token}, timeout=30
    )
    assert done.status_code == 200, done.text
    return Traffic(demo, long_id, audited, key)


@pytest.fixture(scope="module", autouse=True)
def leave_the_page(browser_page: Any, console_host: Any) -> Iterator[None]:
    """The page stops polling before the host stops (else its refused polls count as page errors)."""
    yield
    browser_page.goto("about:blank")


@pytest.fixture(params=WIDTHS, ids=lambda w: f"{w}px")
def page(request: pytest.FixtureRequest, browser_page: Any) -> Iterator[Any]:
    """The shared page at one of the two widths."""
    browser_page.set_viewport_size({"width": request.param, "height": HEIGHT})
    yield browser_page
    browser_page.set_viewport_size({"width": 1280, "height": 900})


def views(t: Traffic) -> list[tuple[str, str]]:
    """Every view of the console: (route, its title)."""
    d = t.demo
    return [
        ("#/", "Endpoints"),
        ("#/endpoint/Billing", "Events of Billing"),
        (f"#/event/Billing/{d.ident('inv-2001')}", f"Event {d.ident('inv-2001')}"),
        (f"#/event/Billing/{d.ident('inv-4001')}", f"Event {d.ident('inv-4001')}"),
        ("#/stuck/Billing", "Needs a human on Billing"),
        (f"#/poison?day={d.now.strftime('%Y%m%d')}", "Poison"),
        ("#/state", "State records"),
        ("#/find?by=any&q=inv-20", "Find"),
        (f"#/session/{d.ident('customer-10442')}", f"Session {d.ident('customer-10442')}"),
        ("#/failed", "Failed across endpoints"),
        ("#/audits", "Audits"),
    ]


def go(page: Any, route: str, title: str) -> None:
    from playwright.sync_api import expect

    page.evaluate("(route) => { location.hash = route; }", route)
    expect(page.locator("main h1").first).to_have_text(title)
    page.wait_for_function("document.activeElement && document.activeElement.id === 'main'")


def header_in_view(page: Any) -> dict[str, Any]:
    box: dict[str, Any] = page.evaluate(
        """() => {
            const bar = document.querySelector("header.bar").getBoundingClientRect();
            const fresh = document.getElementById("refresh").getBoundingClientRect();
            return { scrollY: window.scrollY, top: bar.top, bottom: bar.bottom, freshTop: fresh.top,
              freshBottom: fresh.bottom, height: window.innerHeight,
              fresh: document.getElementById("refresh").textContent };
        }"""
    )
    return box


def assert_header_in_view(box: dict[str, Any], where: str) -> None:
    assert box["top"] >= 0 and box["bottom"] <= box["height"], f"{where}: the header is off screen: {box}"
    fresh_in_view = box["freshTop"] >= 0 and box["freshBottom"] <= box["height"]
    assert fresh_in_view, f"{where}: 'Updated' is off screen: {box}"
    assert box["fresh"].startswith("Updated "), f"{where}: {box['fresh']!r}"


def test_every_view_opens_at_its_top_with_the_header_and_its_freshness_on_screen(
    page: Any, console_host: Any, traffic: Traffic
) -> None:
    """Given a view scrolled to its bottom, when the operator opens another, then it opens at scrollY 0
    with the header in view; scrolled down again, the header stays on screen (sticky)."""
    host, _ = console_host
    width = page.viewport_size["width"]
    page.goto(f"{host.base_url}/api/console#/")
    page.locator("main h1").first.wait_for()
    seen: dict[str, int] = {}
    for route, title in views(traffic):
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        go(page, route, title)
        box = header_in_view(page)
        seen[route] = box["scrollY"]
        assert box["scrollY"] == 0, f"{route} at {width} px opened scrolled to {box['scrollY']}"
        assert_header_in_view(box, f"{route} at {width} px")
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        assert_header_in_view(header_in_view(page), f"{route} at {width} px, scrolled down")
    print(f"\nscrollY after navigation at {width} px: {seen}")
    # The navigation itself, clicked from the bottom of a long view, stays in reach.
    page.click('header.bar a[data-nav="audits"]')
    page.locator("main h1", has_text="Audits").wait_for()
    assert header_in_view(page)["scrollY"] == 0


def test_the_skip_link_focuses_the_view_without_leaving_it(
    page: Any, console_host: Any, traffic: Traffic
) -> None:
    host, _ = console_host
    route, title = views(traffic)[2]
    page.goto(f"{host.base_url}/api/console{route}")
    page.locator("main h1", has_text=title).wait_for()
    page.focus("a.skip")  # the first stop of Tab from the top of the page
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    assert page.evaluate("location.hash") == route
    assert_header_in_view(header_in_view(page), "after the skip link")


NULL_TEXTS = """() => {
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const found = [];
    while (walker.nextNode()) {
        const text = walker.currentNode.textContent.trim();
        if (["null", "undefined", "[object Object]", "NaN"].includes(text)) {
            found.push(`${text} in ${walker.currentNode.parentElement.outerHTML.slice(0, 160)}`);
        }
    }
    return found;
}"""


def test_no_view_shows_a_literal_null(page: Any, console_host: Any, traffic: Traffic) -> None:
    host, _ = console_host
    page.goto(f"{host.base_url}/api/console#/")
    page.locator("main h1").first.wait_for()
    for route, title in views(traffic):
        go(page, route, title)
        assert page.evaluate(NULL_TEXTS) == [], f"{route} at {page.viewport_size['width']} px"


def test_the_console_works_at_its_address_with_a_trailing_slash(
    page: Any, console_host: Any, traffic: Traffic
) -> None:
    from playwright.sync_api import expect

    host, _ = console_host
    page.goto(f"{host.base_url}/api/console/#/failed")
    expect(page.locator("main h1")).to_have_text("Failed across endpoints")
    expect(page.locator(f'tr[data-event="{traffic.long_id}"]')).to_be_visible()
    assert page.evaluate("getComputedStyle(document.querySelector('header.bar')).position") == "sticky"
    page.click('header.bar a[data-nav="endpoints"]')
    expect(page.locator('tr[data-endpoint="Billing"] [data-bucket="Failed"]')).to_be_visible()
    assert page.evaluate("location.pathname") == "/api/console/"


ONE_LINE = """(selector) => [...document.querySelectorAll(selector)].map((el) => {
    const lineHeight = parseFloat(getComputedStyle(el).lineHeight);
    return { text: el.textContent, lines: el.getClientRects().length,
      height: el.getBoundingClientRect().height, lineHeight };
})"""


@pytest.mark.parametrize(
    ("route", "title"),
    [
        ("#/endpoint/Billing", "Events of Billing"),
        ("#/failed", "Failed across endpoints"),
        ("#/find?by=any&q=inv-20", "Find"),
        ("#/audits", "Audits"),
    ],
)
def test_ids_and_times_stay_on_one_line(
    page: Any, console_host: Any, traffic: Traffic, route: str, title: str
) -> None:
    host, _ = console_host
    page.goto(f"{host.base_url}/api/console{route}")
    page.locator("main h1", has_text=title).wait_for()
    page.locator("main table a.id").first.wait_for()
    measured = page.evaluate(ONE_LINE, "main table .id, main table time")
    assert len(measured) >= 2
    if route == "#/failed":
        assert any(m["text"] == traffic.long_id for m in measured)
    wrapped = [m for m in measured if m["lines"] != 1 or m["height"] > 1.5 * m["lineHeight"]]
    assert not wrapped, f"{route} at {page.viewport_size['width']} px: {wrapped}"


def test_a_record_is_found_by_pasting_its_key_and_naming_its_scope(
    page: Any, console_host: Any, traffic: Traffic
) -> None:
    from playwright.sync_api import expect

    host, _ = console_host
    page.goto(f"{host.base_url}/api/console#/state")
    expect(page.locator("main h1")).to_have_text("State records")
    options = page.locator("#lookup-scope option")
    names = options.evaluate_all("(os) => os.map((o) => o.value).filter(Boolean)")
    assert names == [scope.code for scope in Scope]
    # Pasted as the API takes it (scopeId a number): the scope shows by name.
    page.fill("#lookup-key", json.dumps({"key": traffic.record_key}, indent=2))
    expect(page.locator("#lookup-scope")).to_have_value("Element")
    page.click("#lookup")
    expect(page.locator("#record h2").first).to_have_text("Record: Processed")
    expect(page.locator("#record")).to_contain_text(traffic.record_key["itemKey"])
    # Without a scope in the JSON, the one picked by name is used; a wrong one finds nothing.
    key = {k: v for k, v in traffic.record_key.items() if k != "scopeId"}
    page.fill("#lookup-key", json.dumps(key))
    page.select_option("#lookup-scope", "Thread")
    page.click("#lookup")
    expect(page.locator("#record h2").first).to_have_text("No record for this key")
    page.select_option("#lookup-scope", "Element")
    page.click("#lookup")
    expect(page.locator("#record h2").first).to_have_text("Record: Processed")
    # What is not JSON is refused on the page, saying so, and the text stays to be fixed.
    page.fill("#lookup-key", "{tenantId: 47")
    page.click("#lookup")
    expect(page.locator("main .card.error")).to_contain_text("not valid JSON")
    expect(page.locator("#lookup-key")).to_have_value("{tenantId: 47")


def test_an_audits_json_is_indented_and_folded(page: Any, console_host: Any, traffic: Traffic) -> None:
    from playwright.sync_api import expect

    host, _ = console_host
    for route, title, row in (
        (
            "#/audits?auditType=ResubmitWithChanges",
            "Audits",
            f'tr[data-audit="ResubmitWithChanges"]:has(a[href$="{traffic.audited}"])',
        ),
        (
            f"#/event/Billing/{traffic.audited}",
            f"Event {traffic.audited}",
            'tr[data-audit="ResubmitWithChanges"]',
        ),
    ):
        page.goto(f"{host.base_url}/api/console{route}")
        expect(page.locator("main h1")).to_have_text(title)
        details = page.locator(f'{row} td[data-label="Data"] details.audit-data').first
        expect(details).to_be_visible(timeout=WAIT_MS)
        assert details.evaluate("(d) => d.open") is False
        pre = details.locator("pre")
        expect(pre).to_be_hidden()
        details.locator("summary").click()
        expect(pre).to_be_visible()
        text = pre.text_content() or ""
        assert '\\"' not in text, text  # no JSON escaped inside JSON
        assert '\n  "' in text, text  # indented
        data = json.loads(text)
        assert isinstance(data, dict) and data, text
