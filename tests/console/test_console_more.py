"""Every list is complete or says it is not, in the console: find, a session, failed
across endpoints, unconfirmed settlements, overdue hand-offs and stuck records show their first page and a
"More" button (the keyboard's, too) that appends the next until every row is on screen and the button is
gone; a heading says "N" when the count is exact and "at least N" while it is not (the overview's badge
"1000+"), at 1400 px and at 375 px. Rows "More" loaded stay on screen through the 5 s refresh. An open
status counted only up to its cap (10,000) says so on the overview's badge, its oldest age and its listing.

The rows are written straight into the host's tables (as tests/operator/test_list_pages.py seeds them),
cloned from ones the host projected, so the test pays for the paging it checks.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.support.seeding import upsert_all

from .conftest import nimbus_message, resolver_message

pytestmark = pytest.mark.browser

WIDTHS = [(1400, 900), (375, 812)]
FOUND = 120  # find and its session: 50 + 50 + 20
FAILED = 120
UNCONFIRMED = 250  # counted exactly: 200 + 50
OVERDUE = 1001  # counting stops at 1,000: "at least"
STUCK = 60  # the console's page of stuck records is 50


@contextmanager
def host_tables(prefix: str) -> Iterator[None]:
    """This process's stores, on the host's tables (its table prefix)."""
    from common import runtime

    saved = os.environ.get("SETTLE_TABLE_PREFIX")
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    runtime.reset()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("SETTLE_TABLE_PREFIX", None)
        else:
            os.environ["SETTLE_TABLE_PREFIX"] = saved
        runtime.reset()


@pytest.fixture(scope="module", autouse=True)
def leave_the_page(browser_page: Any, console_host: Any) -> Any:
    """The page stops polling before the host stops (else its refused polls count as page errors)."""
    yield
    browser_page.goto("about:blank")


@pytest.fixture(scope="module")
def many(console_host: Any, settle_tables: str) -> dict[str, str]:
    """More of each list than a page: hand-offs sharing an event-id prefix and a session, failed events,
    unconfirmed settlements, overdue hand-offs and records stuck in Processing."""
    from handoff import service
    from handoff.messages.contract import MessageType, ResolutionStatus
    from handoff.storage import keys
    from handoff.storage.ids import IdRef
    from handoff.storage.records import ListingRow, QueueRow, UnconfirmedRow
    from management.records import _LOCK_COLUMN
    from state import service as state_service
    from state.keys import head_row_key
    from state.model import RecordKey, Scope

    host, prefix = console_host
    tag = uuid.uuid4().hex[:6]
    names = {
        "prefix": f"m{tag}",
        "session": f"sess-{tag}",
        "found": f"Found-{tag}",
        "failing": f"Failing-{tag}",
        "stuck": f"Stuck-{tag}",
    }
    template = f"m{tag}-template"
    message = nimbus_message(
        "EventRequest", endpoint=names["found"], event_id=template, message_id=f"{template}-r"
    )
    message["sessionId"] = names["session"]
    resolver_message(host.base_url, **message)
    entity_id = int(tag, 16) % 1_000_000
    lock_key = {
        "tenantId": 7,
        "scopeId": 4,
        "entityId": entity_id,
        "itemEntityKey": "invoice",
        "itemKey": "t",
    }
    locked = httpx.post(
        f"{host.base_url}/api/v1/state/lock", json={"key": lock_key, "lockSeconds": 1}, timeout=30
    )
    assert locked.json()["acquired"], locked.text
    base = datetime.now(UTC) - timedelta(hours=2)
    with host_tables(prefix):
        store = service.store()
        events, index = [], []
        model = store.locate_event(names["found"], template)[1]
        assert model is not None
        for n in range(FOUND - 1):
            event_id = f"m{tag}-{n:03d}"
            pk = store.layout.event_partition(names["found"], event_id)
            events.append(
                {**model, "PartitionKey": pk, "RowKey": keys.event_row(event_id), "EventId": event_id}
            )
            index += [
                IdRef("eventId", event_id, names["found"], event_id).entity(),
                IdRef("sessionId", names["session"], names["found"], event_id).entity(),
            ]
        for n in range(FAILED):
            event_id, at = f"f{tag}-{n:03d}", base + timedelta(seconds=n)
            row = ListingRow(
                event_id=event_id,
                resolution_status=ResolutionStatus.Failed,
                message_type=MessageType.ErrorResponse,
                updated_at=at,
                enqueued_time_utc=at,
                reason="ERP timeout",
            )
            pk = store.layout.event_partition(names["failing"], event_id)
            events.append(row.to_entity(pk, keys.bucket_row("Failed", at, event_id)))
        for n in range(OVERDUE):
            event_id, at = f"o{tag}-{n:04d}", base + timedelta(seconds=n)
            pk = store.layout.event_partition(names["stuck"], event_id)
            parked = QueueRow(event_id=event_id, parked_message_id=f"park-{event_id}", expected_by=at)
            events.append(parked.to_entity(pk, keys.queue_row(at, event_id)))  # due: its ExpectedBy passed
            if n < UNCONFIRMED:
                unconfirmed = UnconfirmedRow(
                    event_id=event_id,
                    parked_message_id=f"park-{event_id}",
                    control_message_id=f"ctl-{event_id}",
                    message_type=MessageType.HandoffCompletedRequest,
                    settled_by="agent-7",
                    claimed_at=at,
                    since=at,
                )
                events.append(unconfirmed.to_entity(pk, keys.unconfirmed_row(event_id, f"park-{event_id}")))
        upsert_all(store.table(keys.EVENTS_TABLE), events, threads=8)
        upsert_all(store.table(keys.IDS_TABLE), index, threads=8)
        for endpoint in (names["failing"], names["stuck"]):
            store.register_endpoint(endpoint)
        # Records stuck in Processing: the expired lock's head and lock index row, cloned.
        state = state_service.store()
        head = state.read_head(RecordKey(7, Scope(4), entity_id, "invoice", "t"))
        assert head is not None
        pk, lock_row = str(head.entity["PartitionKey"]), str(head.entity[_LOCK_COLUMN])
        # (each with a level-2 row, as the code before ADR-0021 wrote them: a lock has no row of its own now)
        lock_index = {"PartitionKey": pk}
        rows = []
        for n in range(STUCK - 1):
            row_key = head_row_key(RecordKey(7, Scope(4), entity_id, "invoice", f"stuck-{tag}-{n:03d}"))
            lock = f"{lock_row.rsplit('|', 1)[0]}|{tag}{n:03d}"
            rows += [
                {**head.entity, "RowKey": row_key, _LOCK_COLUMN: lock},
                {**lock_index, "RowKey": lock, "StateRK": row_key},
            ]
        upsert_all(state.table, rows, threads=8)
    time.sleep(2)  # the locks expire by the latest the storage clock may read
    return names


@pytest.fixture(params=WIDTHS, ids=lambda size: f"{size[0]}px")
def page(request: pytest.FixtureRequest, browser_page: Any) -> Iterator[Any]:
    width, height = request.param
    browser_page.goto("about:blank")  # a fresh console: each list at its first page
    browser_page.set_viewport_size({"width": width, "height": height})
    try:
        yield browser_page
    finally:
        browser_page.set_viewport_size({"width": 1280, "height": 900})


def more_until_gone(page: Any, name: str, rows: str) -> list[str]:
    """Press the list's "More" from the keyboard until it is gone; the id of every row the list ended
    with, or "(hidden)" for a row not laid out on the page."""
    more = page.locator(f"#{name}-more")
    presses = 0
    while more.count():
        shown = page.locator(rows).count()
        more.focus()
        page.keyboard.press("Enter")
        grown = "([rows, n, id]) => document.querySelectorAll(rows).length>n || !document.getElementById(id)"
        page.wait_for_function(grown, arg=[rows, shown, f"{name}-more"])
        presses += 1
        assert presses < 20, "More never ends"
    assert page.evaluate("document.activeElement !== document.body"), "the keyboard lost its place"
    listed: list[str] = page.evaluate(
        """(rows) => [...document.querySelectorAll(rows)].map((row) => {
             const box = row.getBoundingClientRect();
             const seen = row.getClientRects().length > 0 && getComputedStyle(row).visibility !== "hidden";
             const id = row.dataset.event || row.dataset.unconfirmed || row.dataset.overdue
               || row.querySelector("a[data-lookup]").dataset.lookup;
             return seen && box.width > 0 && box.height > 0 ? id : "(hidden)";
           })""",
        rows,
    )
    return listed


def test_find_says_more_match_and_more_shows_every_hand_off(page, console_host, many):
    from playwright.sync_api import expect

    host, _ = console_host
    page.goto(f"{host.base_url}/api/console#/find?by=eventId&q={many['prefix'].upper()}")
    rows = "tr[data-event]"
    expect(page.locator(rows)).to_have_count(50)
    summary = page.locator("#find-summary")
    expect(summary).to_contain_text("at least 51 hand-offs by event id; 50 shown, more match")
    expect(page.locator("#find-shown")).to_contain_text("50 shown of at least 51")
    listed = more_until_gone(page, "find", rows)
    assert "(hidden)" not in listed
    assert sorted(listed) == sorted(
        [f"{many['prefix']}-template", *(f"{many['prefix']}-{n:03d}" for n in range(FOUND - 1))]
    )
    expect(summary).to_have_text(f"{FOUND} hand-offs by event id.")
    expect(page.locator("#find-shown")).to_have_text(f"All {FOUND} shown.")
    # The 5 s refresh reads them all again: nothing "More" loaded leaves the screen
    page.wait_for_timeout(6000)
    expect(page.locator(rows)).to_have_count(FOUND)
    # A new search starts at the first page
    page.goto(f"{host.base_url}/api/console#/session/{many['session']}")
    expect(page.locator(rows)).to_have_count(50)
    assert len(more_until_gone(page, "session", rows)) == FOUND


def test_failed_across_endpoints_pages_with_more(page, console_host, many):
    from playwright.sync_api import expect

    host, _ = console_host
    page.goto(f"{host.base_url}/api/console#/failed")
    rows = "tr[data-event]"
    expect(page.locator(rows)).to_have_count(50)
    expect(page.locator("#failed-count")).to_have_text("at least 51 failed events")
    listed = more_until_gone(page, "failed", rows)
    assert "(hidden)" not in listed and len(set(listed)) == FAILED
    expect(page.locator("#failed-count")).to_have_text(f"{FAILED} failed events")


def test_stuck_hand_offs_say_at_least_where_counting_stopped_and_more_shows_them_all(
    page, console_host, many
):
    from playwright.sync_api import expect

    host, _ = console_host
    page.goto(f"{host.base_url}/api/console#/")
    row = page.locator(f"tr[data-endpoint='{many['stuck']}']")
    expect(row.locator("[data-bucket=Overdue]")).to_have_text("1000+")
    expect(row.locator("[data-bucket=Overdue]")).to_have_attribute("aria-label", "at least 1000 Overdue")
    expect(row.locator("[data-bucket=Unconfirmed]")).to_have_text(str(UNCONFIRMED))
    page.goto(f"{host.base_url}/api/console#/stuck/{many['stuck']}")
    expect(page.locator("#unconfirmed-title")).to_have_text(f"Unconfirmed settlements ({UNCONFIRMED})")
    expect(page.locator("#overdue-title")).to_have_text("Overdue hand-offs (at least 1000)")
    expect(page.locator("tr[data-unconfirmed]")).to_have_count(200)
    expect(page.locator("tr[data-overdue]")).to_have_count(200)
    expect(page.locator("#overdue-shown")).to_contain_text("200 shown of at least 1000")
    unconfirmed = more_until_gone(page, "unconfirmed", "tr[data-unconfirmed]")
    assert "(hidden)" not in unconfirmed and len(set(unconfirmed)) == UNCONFIRMED
    expect(page.locator("#unconfirmed-title")).to_have_text(f"Unconfirmed settlements ({UNCONFIRMED})")
    overdue = more_until_gone(page, "overdue", "tr[data-overdue]")
    assert "(hidden)" not in overdue and len(set(overdue)) == OVERDUE
    # Every page read: the count is exact now
    expect(page.locator("#overdue-title")).to_have_text(f"Overdue hand-offs ({OVERDUE})")


def test_stuck_records_page_with_more(page, console_host, many):
    from playwright.sync_api import expect

    host, _ = console_host
    page.goto(f"{host.base_url}/api/console#/state")
    title = page.locator("#stuck-records-title")
    expect(title).to_have_text("Stuck in Processing past their lock (at least 51)")
    rows = "section tr:has(a[data-lookup])"
    expect(page.locator(rows)).to_have_count(50)
    listed = more_until_gone(page, "stuck-records", rows)
    assert "(hidden)" not in listed and len(set(listed)) == STUCK
    expect(title).to_have_text(f"Stuck in Processing past their lock ({STUCK})")


@pytest.fixture(scope="module")
def past_the_cap(console_host: Any, settle_tables: str) -> str:
    """An endpoint with one Failed event more than the open counts' cap (``OPEN_COUNT_CAP``), one a second."""
    from handoff import service
    from handoff.messages.contract import MessageType, ResolutionStatus
    from handoff.storage import keys
    from handoff.storage.overview import OPEN_COUNT_CAP
    from handoff.storage.records import ListingRow

    _, prefix = console_host
    tag = uuid.uuid4().hex[:6]
    endpoint = f"Outage-{tag}"
    base = datetime.now(UTC) - timedelta(days=3)
    with host_tables(prefix):
        store = service.store()
        rows = []
        for n in range(OPEN_COUNT_CAP + 1):
            event_id, at = f"c{tag}-{n:05d}", base + timedelta(seconds=n)
            row = ListingRow(
                event_id=event_id,
                resolution_status=ResolutionStatus.Failed,
                message_type=MessageType.ErrorResponse,
                updated_at=at,
                enqueued_time_utc=at,
                reason="ERP down",
                since_at=at,
            )
            pk = store.layout.event_partition(endpoint, event_id)
            rows.append(row.to_entity(pk, keys.bucket_row("Failed", at, event_id)))
        upsert_all(store.table(keys.EVENTS_TABLE), rows, threads=8)
        store.register_endpoint(endpoint)
    return endpoint


def test_an_open_count_that_stopped_at_its_cap_says_at_least(browser_page, console_host, past_the_cap):
    from playwright.sync_api import expect

    host, _ = console_host
    page = browser_page
    # Given an endpoint with 10,001 Failed events, When the overview shows it
    page.goto(f"{host.base_url}/api/console#/")
    row = page.locator(f"tr[data-endpoint='{past_the_cap}']")
    # Then its Failed badge says counting stopped, and its oldest failure is of the events read (at least)
    expect(row.locator("[data-bucket=Failed]")).to_have_text("10000+")
    expect(row.locator("[data-bucket=Failed]")).to_have_attribute("aria-label", "at least 10000 Failed")
    expect(row.locator("td[data-label='Oldest failed']")).to_have_text("≥ 3 d")
    expect(row.locator("[data-bucket=Pending]")).to_have_text("0")
    # And its Failed listing says how many it counted, at least
    row.locator("[data-bucket=Failed]").click()
    expect(page.locator("#list-count")).to_have_text("at least 10000 Failed events; this page shows 25.")
