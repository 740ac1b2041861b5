"""Under the development host (what ``make run`` serves without Core Tools), ``OTEL_TRACES_EXPORTER=console``
and ``OTEL_METRICS_EXPORTER=console`` print Settle's spans and metrics to stdout: a separate process, real
HTTP, the standard variables and nothing else."""

from __future__ import annotations

import time
import uuid

import httpx

from tests.support.children import HostProcess, StartHost


def wait_for(host: HostProcess, *needles: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        output = host.output()
        if all(n in output for n in needles):
            return output
        time.sleep(0.2)
    missing = [n for n in needles if n not in host.output()]
    raise AssertionError(f"not printed within {timeout:.0f}s: {missing}\n{host.output()[-4000:]}")


def test_a_lock_then_set_prints_both_spans_with_their_attributes_and_the_metrics(start_host: StartHost):
    host = start_host(
        env={
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "console",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
        }
    )
    item = "INV-" + uuid.uuid4().hex[:10]
    key = {"tenantId": 1, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice", "itemKey": item}
    lock = httpx.post(f"{host.base_url}/api/v1/state/lock", json={"key": key}, timeout=30)
    assert lock.status_code == 200 and lock.json()["acquired"], lock.text
    token = lock.json()["lockToken"]
    done = httpx.post(
        f"{host.base_url}/api/v1/state/set",
        json={"key": key, "status": "Processed", "lockToken": token},
        timeout=30,
    )
    assert done.status_code == 200, done.text

    output = wait_for(
        host,
        '"name": "settle.state.lock"',
        '"name": "settle.state.set"',
        '"settle.outcome": "acquired"',
        '"settle.outcome": "applied"',
        f'"settle.item_key": "{item}"',
        '"settle.status_after": "Processed"',
        '"name": "settle.state.locks"',
        '"name": "settle.state.duration"',
    )
    assert token not in output  # a span never carries the lock token
