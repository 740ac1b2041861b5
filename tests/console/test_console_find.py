"""The on-call engineer in the console, with only the other team's job number: types it (in whatever case),
finds the hand-off and sees what kind of id matched; an empty value reads ``""`` and a missing one an em
dash; every time is UTC and says so, in a browser whose own zone is not UTC; and at 375 px no label breaks
inside a word."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from .conftest import ARGS, WAIT_MS, nimbus_message, require_chromium, resolver_message

pytestmark = pytest.mark.browser

# Far from UTC, so a time shown in the browser's own zone cannot pass for UTC.
BROWSER_ZONE = "Pacific/Kiritimati"  # UTC+14
LONG_ERROR = "ERP-DMF-import-of-the-ledger-package-timed-out-while-waiting-for-the-batch-server-" * 2


@pytest.fixture(scope="module")
def page_far_from_utc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    chromium = require_chromium()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-find")),
            executable_path=chromium,
            headless=True,
            args=ARGS,
            viewport={"width": 1280, "height": 900},
            timezone_id=BROWSER_ZONE,
        )
        context.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)
        page = context.pages[0] if context.pages else context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        context.close()
        assert not errors, errors


@pytest.fixture(scope="module")
def stuck_job(console_host) -> dict[str, str]:
    """A hand-off parked with ERP job JOB-4711-… and an empty HandoffReason, on one endpoint; on another, an
    event of the same session that failed with a long error and no job."""
    host, _ = console_host
    tag = uuid.uuid4().hex[:6]
    ids = {
        "tag": tag,
        "job": f"JOB-4711-{tag}",
        "session": f"order-{tag}",
        "parked": f"evt-{tag}-parked",
        "failed": f"evt-{tag}-failed",
        "erp": f"Erp-{tag}",
        "crm": f"Crm-{tag}",
    }

    def send(kind: str, endpoint: str, event_id: str, message_id: str, **kw: Any) -> None:
        message = nimbus_message(kind, endpoint=endpoint, event_id=event_id, message_id=message_id, **kw)
        message["sessionId"] = ids["session"]
        resolver_message(host.base_url, **message)

    send("EventRequest", ids["erp"], ids["parked"], f"{ids['parked']}-req")
    send(
        "PendingHandoffResponse",
        ids["erp"],
        ids["parked"],
        f"{ids['parked']}-park",
        parent=f"{ids['parked']}-req",
        HandoffReason="",
        ExternalJobId=ids["job"],
    )
    send("EventRequest", ids["crm"], ids["failed"], f"{ids['failed']}-req")
    send(
        "ErrorResponse",
        ids["crm"],
        ids["failed"],
        f"{ids['failed']}-err",
        parent=f"{ids['failed']}-req",
        error_text=LONG_ERROR,
    )
    return ids


def _utc_shown(text: str) -> datetime:
    match = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", text)
    assert match, f"no time in UTC in {text!r}"
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def test_the_job_number_in_another_case_finds_the_hand_off_and_says_what_matched(
    page_far_from_utc, console_host, stuck_job
):
    from playwright.sync_api import expect

    host, _ = console_host
    page = page_far_from_utc
    page.goto(f"{host.base_url}/api/console#/find")
    expect(page.locator("h1")).to_have_text("Find")
    expect(page.locator("#find-by")).to_have_value("any")  # one box: any kind of id
    page.fill("#find-q", stuck_job["job"].lower())
    page.click("#find-go")
    row = page.locator("tr[data-event]")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-matched", "externalJobId")
    expect(row.locator("td[data-label=Matched]")).to_contain_text(f"External job id {stuck_job['job']}")
    expect(row.locator("td[data-label=Endpoint]")).to_have_text(stuck_job["erp"])
    expect(page.locator("#find-summary")).to_contain_text("1 hand-off by external job id")
    # the session, typed in capitals, finds both events; the event id's first characters too
    page.fill("#find-q", stuck_job["session"].upper())
    page.click("#find-go")
    expect(page.locator("tr[data-matched=sessionId]")).to_have_count(2)
    page.fill("#find-q", f"EVT-{stuck_job['tag'].upper()}")
    page.click("#find-go")
    expect(page.locator("tr[data-matched=eventId]")).to_have_count(2)
    # a fragment from the middle of an id finds nothing, and says so
    page.fill("#find-q", f"{stuck_job['tag']}-parked")
    page.click("#find-go")
    expect(page.locator("#find-none")).to_contain_text("No hand-off")
    # the found hand-off: its empty reason reads "", the job is shown
    page.goto(f"{host.base_url}/api/console#/find?q={stuck_job['job']}")
    page.locator("tr[data-event] td[data-label=Event] a").click()
    expect(page.locator("[data-fact=handoff-reason]")).to_have_text('""')
    expect(page.locator("[data-fact=external-job]")).to_have_text(stuck_job["job"])
    expect(page.locator("[data-fact=expected-by]")).to_have_text("—")  # never sent: an em dash


def test_times_are_utc_and_say_so_in_a_browser_far_from_utc(page_far_from_utc, console_host, stuck_job):
    from playwright.sync_api import expect

    host, _ = console_host
    page = page_far_from_utc
    page.goto(f"{host.base_url}/api/console#/find?q={stuck_job['session']}")
    expect(page.locator("tr[data-event]")).to_have_count(2)
    expect(page.locator("#refresh")).to_contain_text("UTC")
    updated = page.locator("#refresh").text_content() or ""
    match = re.search(r"Updated (\d\d):(\d\d):(\d\d) UTC", updated)
    assert match, updated
    now = datetime.now(UTC)
    shown = now.replace(hour=int(match.group(1)), minute=int(match.group(2)), second=int(match.group(3)))
    assert abs((now - shown).total_seconds()) < 120 or abs((now - shown).total_seconds()) > 86_280, updated
    changed = page.locator("tr[data-event] td[data-label=Changed]").first.text_content() or ""
    assert abs((_utc_shown(changed) - now).total_seconds()) < 600, changed
    # a value never sent is an em dash
    page.goto(f"{host.base_url}/api/console#/event/{stuck_job['crm']}/{stuck_job['failed']}")
    expect(page.locator("h1")).to_contain_text(stuck_job["failed"])
    facts = page.locator("dl.facts").first
    expect(facts.locator("dt", has_text="Updated").locator("xpath=following-sibling::dd[1]")).to_contain_text(
        " UTC"
    )


# Every label of a stacked row (its ``::before``: the width it was given against the width its text needs on
# one line) and of a fact list (the lines its text took).
_LABEL_LINES = """() => {
  const found = [];
  for (const td of document.querySelectorAll("table.stack td[data-label]")) {
    const before = getComputedStyle(td, "::before");
    const probe = document.createElement("span");
    for (const name of ["font-family", "font-size", "font-weight", "letter-spacing", "text-transform"]) {
      probe.style.setProperty(name, before.getPropertyValue(name));
    }
    probe.style.whiteSpace = "nowrap";
    probe.style.position = "absolute";
    probe.textContent = td.dataset.label;
    document.body.append(probe);
    const needed = probe.getBoundingClientRect().width;
    probe.remove();
    found.push({ label: td.dataset.label, lines: parseFloat(before.width) + 0.5 < needed ? 2 : 1 });
  }
  for (const dt of document.querySelectorAll("dl.facts dt")) {
    const range = document.createRange();
    range.selectNodeContents(dt);
    const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
    found.push({ label: dt.textContent, lines: tops.size });
  }
  return found;
}"""


def test_no_label_breaks_inside_a_word_at_375_px(page_far_from_utc, console_host, stuck_job):
    from playwright.sync_api import expect

    host, _ = console_host
    page = page_far_from_utc
    page.set_viewport_size({"width": 375, "height": 800})
    try:
        for route, ready in [
            (f"#/find?q={stuck_job['session']}", "tr[data-event]"),
            (f"#/event/{stuck_job['crm']}/{stuck_job['failed']}", "dl.facts"),
            (f"#/event/{stuck_job['erp']}/{stuck_job['parked']}", "[data-fact=handoff-reason]"),
            (f"#/endpoint/{stuck_job['crm']}", "tr[data-event]"),
        ]:
            page.goto(f"{host.base_url}/api/console{route}")
            expect(page.locator(ready).first).to_be_visible()
            labels = page.evaluate(_LABEL_LINES)
            assert labels, route
            broken = [x for x in labels if x["lines"] > 1]
            assert not broken, f"{route}: labels on more than one line at 375 px: {broken}"
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= 375, f"{route} scrolls sideways at 375 px ({scroll} px)"
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
