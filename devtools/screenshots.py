"""``make screenshots``: the README's console screenshots, taken from the real console.

Starts an Azurite of its own (in memory, free ports) and a development host on the loopback transport,
sends ``make demo``'s traffic through the resolver, makes the operator actions the pictures show (a
resubmission with changes, a bulk resubmit with one refusal, a state record with its history and a stuck
lock), then drives a headless Chromium (Playwright; Debian's ``/usr/bin/chromium`` unless ``--chromium``
or ``SETTLE_CHROMIUM`` names another) through each view and writes ``docs/img/console-*.png``.

Beside them it records, in ``docs/img/screenshots.json``, a digest of the console's files
(:func:`console_digest`): ``tests/console/test_screenshots.py`` fails when the console has changed since,
so a change to a view comes with its new pictures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devtools import demo as demo_traffic
from devtools.azurite import Azurite, free_port

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "console" / "static"
DOCS_IMG = ROOT / "docs" / "img"
MANIFEST = "screenshots.json"
TAG = "demo"
WIDE, PHONE = 1280, 375
WAIT_MS = 30_000


def console_digest() -> str:
    """SHA-256 over the console's static files (names and bytes): what the screenshots show."""
    digest = hashlib.sha256()
    for path in sorted(STATIC.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def say(message: str) -> None:
    print(f"[screenshots] {message}", flush=True)


@dataclass
class Scene:
    """One picture: the view at ``route`` once ``ready`` is visible (``act`` may prepare it first)."""

    file: str
    route: str
    ready: str
    width: int = WIDE
    act: Callable[[Any], None] | None = None


@contextmanager
def development_host() -> Iterator[str]:
    """Azurite and a development host of our own; yields the host's base URL."""
    with Azurite(services=("blob", "queue", "table")) as azurite, tempfile.TemporaryDirectory() as folder:
        settings = Path(folder) / "local.settings.json"
        shutil.copy(ROOT / "local.settings.json.example", settings)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ServiceBusConnection", "SETTLE_"))}
        env.update(
            SETTLE_TABLES=azurite.connection_string,
            SETTLE_TABLE_PREFIX="shots",
            SETTLE_LOOPBACK="true",
            PYTHONUNBUFFERED="1",
            # Keep the expired lock visible as stuck and the overdue hand-off overdue.
            **{
                "AzureWebJobs.state_catchup.Disabled": "true",
                "AzureWebJobs.handoff_sweeper.Disabled": "true",
            },
        )
        log = (Path(folder) / "host.log").open("wb")
        command = [sys.executable, "-m", "devtools.host", "--port", str(port), "--settings", str(settings)]
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"[screenshots] the development host exited:\n{log.name}")
                try:
                    if httpx.get(f"{base}/api/v1/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("[screenshots] the development host did not answer within 60 s")
                time.sleep(0.2)
            yield base
        finally:
            process.terminate()
            process.wait(timeout=30)
            log.close()


def fill(base: str) -> demo_traffic.Demo:
    """The demo's traffic, one resubmission with changes, a state record with history, a stuck lock."""
    demo = demo_traffic.build(TAG)
    resolver = f"{base}/admin/functions/resolver"
    demo_traffic.send(demo, lambda m: httpx.post(resolver, json=m, timeout=30).status_code)
    changed = {
        "invoiceId": "INV-00005",
        "customerId": 10444,
        "amount": 195,
        "currency": "NOK",
        "vatCode": "S1",
    }
    answer = httpx.post(
        f"{base}/api/v1/events/resubmit",
        params={"endpointId": "Billing", "eventId": demo.ident("inv-2005")},
        json={"eventJson": json.dumps(changed), "reason": "VAT code S9 corrected to S1", "by": "alice"},
        timeout=30,
    )
    answer.raise_for_status()
    state = f"{base}/api/v1/state"
    key = {"tenantId": 1, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice", "itemKey": "INV-42"}
    token = httpx.post(f"{state}/lock", json={"key": key}, timeout=30).json()["lockToken"]
    failed = {"key": key, "lockToken": token, "status": "Failed", "error": "ERP timeout after 30 s"}
    httpx.post(f"{state}/set", json=failed, timeout=30).raise_for_status()
    token = httpx.post(f"{state}/lock", json={"key": key}, timeout=30).json()["lockToken"]
    done = {
        "key": key,
        "lockToken": token,
        "status": "Processed",
        "data": {"posted": True, "voucher": "V-981"},
    }
    httpx.post(f"{state}/set", json=done, timeout=30).raise_for_status()
    stuck = {**key, "itemKey": "INV-43"}
    httpx.post(f"{state}/lock", json={"key": stuck, "lockSeconds": 1}, timeout=30).raise_for_status()
    return demo


def bulk_resubmit(base: str, demo: demo_traffic.Demo) -> Callable[[Any], None]:
    """Select the timeouts, have another operator skip one meanwhile, resubmit them all."""

    def act(page: Any) -> None:
        page.click("#bulk-matching")
        page.locator("#bulk-count", has_text="3 selected").wait_for()
        skipped = httpx.post(
            f"{base}/api/v1/events/skip",
            params={"endpointId": "Billing", "eventId": demo.ident("inv-2004")},
            json={"by": "carol", "reason": "sent twice by the ERP"},
            timeout=30,
        )
        skipped.raise_for_status()
        page.click("#bulk-resubmit")
        page.fill("#bulk-reason", "ERP timeouts fixed")
        page.click("#confirm-ok")
        page.locator("#bulk-report").wait_for()

    return act


def look_up(page: Any) -> None:
    key = {"tenantId": 1, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice", "itemKey": "INV-42"}
    page.fill("#lookup-key", json.dumps(key))
    page.click("#lookup")
    page.locator("#record").wait_for()
    # The expired lock shows once its expiry index row is due (the page polls every 5 s).
    page.locator("section", has_text="INV-43").wait_for(timeout=WAIT_MS * 3)


def open_audit(page: Any) -> None:
    page.locator('tr[data-audit="ResubmitWithChanges"] details.audit-data summary').first.click()


def scenes(base: str, demo: demo_traffic.Demo) -> list[Scene]:
    """Every screenshot the README shows, in an order whose actions do not spoil a later picture."""
    day = demo.now.strftime("%Y%m%d")
    return [
        Scene("console-endpoints.png", "#/", 'tr[data-endpoint="Crm"]'),
        Scene("console-phone.png", "#/", 'tr[data-endpoint="Crm"]', width=PHONE),
        Scene(
            "console-event.png",
            f"#/event/Billing/{demo.ident('inv-2005')}",
            'tr[data-audit="ResubmitWithChanges"]',
            act=open_audit,
        ),
        Scene(
            "console-handoff.png", f"#/event/Billing/{demo.ident('inv-4001')}", '[data-fact="external-job"]'
        ),
        Scene("console-poison.png", f"#/poison?day={day}", "tr[data-poison]"),
        Scene("console-find.png", "#/find?by=any&q=INV-20", "#find-summary"),
        Scene("console-session.png", f"#/session/{demo.ident('customer-10442')}", "[data-session-state]"),
        Scene(
            "console-bulk.png",
            "#/endpoint/Billing?status=Failed&errorText=timeout",
            "#error-count",
            act=bulk_resubmit(base, demo),
        ),
        Scene("console-audits.png", "#/audits?endpointId=Billing", "tr[data-audit]"),
        Scene("console-state.png", "#/state", "#lookup-key", act=look_up),
    ]


def take(base: str, demo: demo_traffic.Demo, out: Path, chromium: str) -> list[str]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    taken = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": WIDE, "height": 900})
        page.set_default_timeout(WAIT_MS)
        for scene in scenes(base, demo):
            page.set_viewport_size({"width": scene.width, "height": 900 if scene.width == WIDE else 812})
            page.goto(f"{base}/api/console{scene.route}")
            page.locator(scene.ready).first.wait_for()
            if scene.act is not None:
                scene.act(page)
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(out / scene.file), full_page=True)
            taken.append(scene.file)
            say(f"{scene.file} ({scene.width} px): {scene.route}")
        browser.close()
    return taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DOCS_IMG, help="where to write them (default: docs/img)")
    parser.add_argument(
        "--chromium",
        default=os.environ.get("SETTLE_CHROMIUM", "/usr/bin/chromium"),
        help="the browser to drive (default: SETTLE_CHROMIUM, else /usr/bin/chromium)",
    )
    args = parser.parse_args(argv)
    if not Path(args.chromium).exists():
        say(f"no browser at {args.chromium}: apt-get install chromium, or pass --chromium")
        return 2
    with development_host() as base:
        say(f"development host at {base}; sending the demo's traffic")
        demo = fill(base)
        files = take(base, demo, args.out, args.chromium)
    manifest: dict[str, Any] = {
        "console": console_digest(),
        "files": files,
        "about": "Taken by `make screenshots` (devtools/screenshots.py) from the console whose static files "
        "have this SHA-256; tests/console/test_screenshots.py compares it with console/static/ now.",
    }
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    say(f"{len(files)} screenshots and {MANIFEST} written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
