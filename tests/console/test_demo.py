"""``make demo`` (``python -m devtools.demo``) against a running development host, and without one."""

from __future__ import annotations

import httpx
import pytest

from devtools import demo
from devtools.azurite import free_port
from tests.support.children import StartHost


def test_make_demo_fills_a_running_settle_through_the_resolver(
    start_host: StartHost,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host = start_host()
    assert demo.main(["--base-url", host.base_url, "--tag", "m"]) == 0
    out = capsys.readouterr().out
    assert "messages through the resolver" in out and "/api/console" in out
    overview = httpx.get(f"{host.base_url}/api/v1/endpoints", timeout=30).json()
    items = {i["endpointId"]: i for i in overview["items"]}
    expected = demo.build("m").expected
    assert items["Billing"]["counts"]["failed"] == expected["Billing.Failed"] == 12
    assert items["Billing"]["poison"] == expected["Billing.Poison"] == 2
    assert items["Shipping"]["counts"]["deadLettered"] == 1
    # Run again with another tag: a second set beside the first, nothing collides
    assert demo.main(["--base-url", host.base_url, "--tag", "n"]) == 0
    again = {
        i["endpointId"]: i for i in httpx.get(f"{host.base_url}/api/v1/endpoints", timeout=30).json()["items"]
    }
    assert again["Billing"]["counts"]["failed"] == 24


def test_make_demo_without_a_running_settle_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--base-url", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "start Settle first (`make run`" in capsys.readouterr().out
