"""The console in a real browser: Debian's Chromium driven by Playwright, against the development host.

The browser is a Chromium already on the machine (``SETTLE_CHROMIUM``, else the usual paths; Playwright
never downloads one, and ``make`` never installs one: ``.ci/run`` installs Debian's package). Without one
the browser tests skip, saying why, except in CI (``CI`` or ``SETTLE_REQUIRE_BROWSER`` set), where a
missing browser fails them. Headless, with a fresh profile and the flags that keep it off the
network. The development host runs on Azurite with the loopback transport (``SETTLE_LOOPBACK=true``).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import new_prefix
from tests.support.children import HostProcess, StartHost

KNOWN_BROWSERS = (
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/snap/bin/chromium",
    "/usr/bin/google-chrome",
    "/usr/bin/google-chrome-stable",
)


def find_chromium() -> str | None:
    """The browser to drive: ``SETTLE_CHROMIUM`` when set (even if missing: then none), else a known path."""
    given = os.environ.get("SETTLE_CHROMIUM")
    if given:
        return given if Path(given).exists() else None
    on_path = shutil.which("chromium") or shutil.which("chromium-browser")
    return next((p for p in (*KNOWN_BROWSERS, on_path) if p and Path(p).exists()), None)


CHROMIUM = find_chromium()


def require_chromium() -> str:
    """The browser's path; without one, skip saying why (fail in CI, where .ci/run installs it)."""
    if CHROMIUM is not None:
        return CHROMIUM
    reason = (
        "no Chromium found (SETTLE_CHROMIUM, " + ", ".join(KNOWN_BROWSERS) + "): install one "
        "(Debian: apt-get install chromium) or point SETTLE_CHROMIUM at it"
    )
    if os.environ.get("CI") or os.environ.get("SETTLE_REQUIRE_BROWSER"):
        pytest.fail(reason)
    print(f"\nskipping the browser tests: {reason}")
    pytest.skip(reason)


ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
WAIT_MS = 30_000  # generous: several suites share two cores


@pytest.fixture(scope="module")
def console_host(start_host: StartHost) -> tuple[HostProcess, str]:
    """A development host of our own (its table prefix is known, so a test can write rows directly)."""
    prefix = new_prefix()
    host = start_host(
        env={
            "SETTLE_TABLE_PREFIX": prefix,
            # Keep expired locks visible as "stuck" (catch-up would turn them Failed within a minute).
            "AzureWebJobs.state_catchup.Disabled": "true",
            "AzureWebJobs.handoff_sweeper.Disabled": "true",
        }
    )
    return host, prefix


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where a test keeps the pictures it takes (the README's come from ``make screenshots``)."""
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    chromium = require_chromium()
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=chromium,
            headless=True,
            args=ARGS,
            viewport={"width": 1280, "height": 900},
        )
        context.set_default_timeout(WAIT_MS)
        from playwright.sync_api import expect

        expect.set_options(timeout=WAIT_MS)
        page = context.pages[0] if context.pages else context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        forgiven: list[str] = []
        # A test that provokes an error on purpose names it (forgive_errors); it is ignored from then on.
        page.settle_forgiven = forgiven  # type: ignore[attr-defined]
        yield page
        context.close()
        unexpected = [e for e in errors if "401" not in e and not any(f in e for f in forgiven)]
        assert not unexpected, f"the page logged errors: {unexpected}"


def resolver_message(base_url: str, **message: Any) -> None:
    """Drop one message on the resolver through the host's admin endpoint (what Service Bus would do)."""
    response = httpx.post(f"{base_url}/admin/functions/resolver", json=message, timeout=30)
    assert response.status_code == 202, response.text


def nimbus_message(
    kind: str,
    *,
    endpoint: str,
    event_id: str,
    message_id: str,
    parent: str = "self",
    event_json: str | None = '{"invoiceId": "INV-1"}',
    error_text: str | None = None,
    **props: Any,
) -> dict[str, Any]:
    request = kind.endswith("Request")
    application = {
        "MessageType": kind,
        "To": endpoint if request else "Resolver",
        "From": "Erp" if request else endpoint,
        "EventId": event_id,
        "EventTypeId": "InvoiceCreated",
        "OriginatingMessageId": "self",
        "ParentMessageId": parent,
        "OriginatingFrom": "self",
        "RetryCount": 0,
        **props,
    }
    body: dict[str, Any] = {"EventContent": None, "ErrorContent": None}
    if event_json is not None:
        body["EventContent"] = {"EventTypeId": "InvoiceCreated", "EventJson": event_json}
    if error_text is not None:
        body["ErrorContent"] = {"ErrorText": error_text, "ErrorType": "TimeoutException"}
    return {
        "messageId": message_id,
        "sessionId": f"session-{event_id}",
        "correlationId": f"corr-{event_id}",
        "applicationProperties": application,
        "body": body,
        "enqueuedTimeUtc": datetime.now(UTC).isoformat(),
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def api_json(base_url: str, path: str) -> Any:
    response = httpx.get(f"{base_url}/api/v1/{path}", timeout=30)
    assert response.status_code == 200, response.text
    return json.loads(response.text)


def forgive_errors(page: Any, *fragments: str) -> None:
    """The browser's error lines a test provokes on purpose (a 404, an API made unreachable): lines
    containing one of ``fragments`` no longer fail the run (the browser reports them asynchronously)."""
    page.settle_forgiven.extend(fragments)
