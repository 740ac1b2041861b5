"""Every Python snippet of README.md and client/README.md runs as written against the development host.

A snippet preceded by ``<!-- snippet: reference ... -->`` is an API listing (signatures, alternatives):
every call in it is checked against the client instead (the method exists, every keyword it shows is a
parameter). The others run in a fresh process with a prelude that gives them what the surrounding prose
assumes: ``client``, a fresh ``key``, ``post_invoice`` / ``do_the_work``, ``Posted``, the package's names,
``SettleClient("http://localhost:7071")`` pointed at the host, a hand-off parked on ``Billing``, and
``handoffs.watch`` that stops once the parked hand-offs are settled (the prose stops it with a signal).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from settle_client import Handoff, SettleClient

from tests.client.conftest import park
from tests.support.children import HostProcess

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "README.md", ROOT / "client" / "README.md"]
BLOCK = re.compile(r"(<!-- snippet: reference[^>]*-->\n)?```python\n(.*?)```", re.DOTALL)

PRELUDE = '''
import itertools, os, threading, uuid
from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel

import settle_client
from settle_client import *
from settle_client.handoffs import Handoffs


class Posted(BaseModel):
    ledger_entry: int

URL = os.environ["SETTLE_URL"]
_watch = Handoffs.watch


def _bounded_watch(self, *args, **kwargs):
    """The snippet's loop, stopped once what was parked is settled (the prose stops it with a signal)."""
    kwargs["wait_seconds"] = 1
    return itertools.islice(_watch(self, *args, **kwargs), int(os.environ["SNIPPET_PARKED"]))


Handoffs.watch = _bounded_watch
_Client = settle_client.SettleClient


class SettleClient(_Client):
    def __init__(self, base_url, **kwargs):
        super().__init__(URL if "localhost" in base_url else base_url, **kwargs)


settle_client.SettleClient = SettleClient
client = SettleClient(URL)
key = {"tenantId": 1, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice"}
key["itemKey"] = "INV-" + uuid.uuid4().hex[:8]


def post_invoice(*args, **kwargs):
    return {"ledgerEntry": 7781}


def do_the_work(body):
    return {"done": True}


def post_to_erp(handoff):
    return {"ledgerEntry": 7782}
'''


def snippets() -> list[tuple[str, int, bool, str]]:
    found = []
    for path in READMES:
        text = path.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(2)) + 1
            found.append((path.relative_to(ROOT).as_posix(), line, bool(match.group(1)), match.group(2)))
    return found


SNIPPETS = snippets()
IDS = [f"{path}:{line}" for path, line, _, _ in SNIPPETS]


def test_the_readmes_have_the_snippets_this_test_knows():
    assert len(SNIPPETS) >= 7 and sum(reference for _, _, reference, _ in SNIPPETS) == 3


@pytest.mark.parametrize(("path", "line", "reference", "code"), SNIPPETS, ids=IDS)
def test_a_readme_snippet(host: HostProcess, path: str, line: int, reference: bool, code: str) -> None:
    if reference:
        check_listing(code)
        return
    parked = 0
    if "handoffs.watch" in code:
        park(host, "Billing", event_type="InvoiceCreated", body={"invoiceId": "INV-9"})
        parked = 1
    env = {**os.environ, "SETTLE_URL": host.base_url, "SNIPPET_PARKED": str(parked), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + "\n" + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{path}:{line}\n{done.stdout}\n{done.stderr}"


CALL = re.compile(r"\b(client(?:\.\w+)*|handoff)\.(\w+)\(([^()]*(?:\([^()]*\)[^()]*)*)\)")


def check_listing(code: str) -> None:
    """Every ``client.x.y(...)`` / ``handoff.z(...)`` call names a real method and real keywords."""
    client = SettleClient("http://localhost:1")
    checked = 0
    for owner, name, args in CALL.findall(code):
        if owner == "handoff":
            target = getattr(Handoff, name)
        else:
            target = client
            for part in owner.split(".")[1:]:
                target = getattr(target, part)
            target = getattr(target, name)
        params = inspect.signature(target).parameters
        for keyword in re.findall(r"(?<![=\w])(\w+)=(?!=)", args):
            assert keyword in params, f"{owner}.{name}() has no parameter {keyword!r}"
        checked += 1
    client.close()
    assert checked >= 5
