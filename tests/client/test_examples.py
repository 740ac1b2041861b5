"""The examples and the README's quick start run as written against the development host; the
package builds as a wheel with its type marker and only httpx and pydantic as dependencies."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from tests.client.conftest import park, some
from tests.support.children import HostProcess

pytestmark = pytest.mark.heavy  # runs other programs: seconds a test

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def run_example(host: HostProcess, *args: str) -> str:
    env = {**os.environ, "SETTLE_URL": host.base_url}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_invoice_node_posts_once_skips_zero_and_retries_failures(host):
    run = uuid.uuid4().hex[:6]
    invoices = [f"INV-{run}", f"ZERO-{run}", f"BAD-{run}"]
    first = run_example(host, "examples/invoice_node.py", *invoices)
    assert f"INV-{run}: posted" in first
    assert f"ZERO-{run}: skipped" in first
    assert f"BAD-{run}: failed (the ledger rejected BAD-{run}: unknown customer)" in first
    assert f"BAD-{run}: Failed" in first

    again = run_example(host, "examples/invoice_node.py", *invoices)
    assert f"INV-{run}: already done" in again and f"ZERO-{run}: already done" in again
    assert f"BAD-{run}: failed" in again  # Failed is retryable: it was tried again


def test_the_handoff_agent_settles_what_is_parked_then_stops(host):
    from settle_client import SettleClient

    endpoint = f"Billing{uuid.uuid4().hex[:8]}"
    good = park(host, endpoint, body={"invoiceId": "INV-9", "rows": 3})
    bad = park(host, endpoint, body={"invoiceId": "INV-10", "rows": -1})
    out = run_example(
        host, "examples/handoff_agent.py", endpoint, "--event-type", "InvoiceCreated", "--max", "2"
    )
    assert f"{good}: completed" in out and f"{bad}: failed (cannot book -1 rows)" in out
    assert "stopped after 2 settlement(s)" in out
    with SettleClient(host.base_url) as client:
        assert some(client.events.get(endpoint, good)).audits[0].audit_type == "CompleteHandoff"
        failed = some(client.events.get(endpoint, bad)).audits[0]
        assert failed.audit_type == "FailHandoff" and failed.auditor_name.startswith("example-agent-")
        assert client.handoffs.next(endpoint) is None


def test_two_copies_of_the_handoff_agent_are_two_agents_and_one_settles(host):
    """Each process has its own agent id (its settledBy), so a second copy that meets the same hand-off
    is refused (a different settlement), never answered as if it had settled it."""
    from settle_client import SettleClient

    endpoint = f"Billing{uuid.uuid4().hex[:8]}"
    event = park(host, endpoint, body={"invoiceId": "INV-11", "rows": 2})
    env = {**os.environ, "SETTLE_URL": host.base_url}
    args = [sys.executable, "examples/handoff_agent.py", endpoint, "--max", "1", "--wait", "2"]
    agents = [
        subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = []
    for agent in agents:
        try:
            out, _ = agent.communicate(timeout=20)
        except subprocess.TimeoutExpired:  # the one that found nothing left watches on: stop it
            agent.send_signal(signal.SIGINT)
            out, _ = agent.communicate(timeout=TIMEOUT_S)
        outs.append(out)
    ids = [out.split(" watching ", 1)[0] for out in outs]
    assert len(set(ids)) == 2 and all(i.startswith("example-agent-") for i in ids), ids
    completed = [out for out in outs if f"{event}: completed" in out]
    assert len(completed) == 1, outs
    assert "replayed" not in completed[0]
    with SettleClient(host.base_url) as client:
        audit = some(client.events.get(endpoint, event)).audits[0]
        assert audit.auditor_name == ids[outs.index(completed[0])]


def test_the_handoff_agent_says_when_settle_answered_from_an_earlier_settlement():
    from settle_client import SettlementAccepted

    spec = importlib.util.spec_from_file_location("handoff_agent", ROOT / "examples" / "handoff_agent.py")
    assert spec is not None and spec.loader is not None
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    answer = {"endpointId": "Billing", "eventId": "e", "messageType": "X", "controlMessageId": "c"}
    fresh = SettlementAccepted.model_validate({**answer, "settledBy": "a-1"})
    again = SettlementAccepted.model_validate({**answer, "settledBy": "a-1", "replayed": True})
    assert agent.replayed(fresh) == ""
    assert agent.replayed(again) == " (replayed: already settled by a-1)"


def test_the_readme_quick_start_runs_as_written(host, tmp_path):
    readme = (ROOT / "client" / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quick start.*?```python\n(.*?)```", readme, re.DOTALL)
    assert block is not None
    script = tmp_path / "quick_start.py"
    script.write_text(block.group(1).replace("http://localhost:7071", host.base_url), encoding="utf-8")
    out = run_example(host, str(script)).splitlines()
    assert out[:4] == [
        "True",
        "Processed {'posted': True}",
        "['Processed', 'Superseded']",
        "skipped: Processed",
    ]
    assert out[4].startswith("posting INV-") and len(out) == 6
    assert out[5] == "{'ledgerEntry': 7781} {'ledgerEntry': 7781}"


def test_the_package_builds_a_typed_wheel_with_two_dependencies(tmp_path):
    source = tmp_path / "client"
    shutil.copytree(
        ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(source), "-w", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("settle_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(archive.read(n).decode() for n in names if n.endswith("METADATA"))
    assert "settle_client/py.typed" in names and "settle_client/__init__.py" in names
    requires = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist")
    ]
    names_only = sorted(re.split(r"[<>=!~; ]", r)[0] for r in requires if "extra ==" not in r)
    assert names_only == ["httpx", "pydantic"]
