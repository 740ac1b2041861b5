"""One address everywhere: ``SETTLE_URL``, defaulting to what ``make run`` serves.

``settle``, the client (sync and async), ``make demo``, the examples and the walkthrough resolve the app's
address through :func:`settle_client.default_url`; ``tests/devhost/test_make_run.py`` points them all at a
non-default port with that one variable.
"""

from __future__ import annotations

import pytest
from settle_client import AsyncSettleClient, SettleClient, default_url


def test_settle_url_names_the_app() -> None:
    assert default_url({"SETTLE_URL": "http://127.0.0.1:7345/"}) == "http://127.0.0.1:7345"
    assert default_url({"SETTLE_URL": "https://func.example", "SETTLE_RUN_PORT": "7345"}) == (
        "https://func.example"
    )


def test_unset_it_is_what_make_run_serves() -> None:
    assert default_url({}) == "http://127.0.0.1:7071"
    assert default_url({"SETTLE_URL": ""}) == "http://127.0.0.1:7071"
    assert default_url({"SETTLE_RUN_PORT": "7345"}) == "http://127.0.0.1:7345"


def test_a_client_made_without_a_url_follows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_URL", "http://127.0.0.1:7345")
    with SettleClient(handle_sigterm=False) as client:
        assert client.base_url == "http://127.0.0.1:7345"
    assert AsyncSettleClient().base_url == "http://127.0.0.1:7345"
    monkeypatch.delenv("SETTLE_URL")
    monkeypatch.setenv("SETTLE_RUN_PORT", "7346")
    with SettleClient(handle_sigterm=False) as client:
        assert client.base_url == "http://127.0.0.1:7346"
    with SettleClient("http://other:1", handle_sigterm=False) as client:  # an explicit URL wins
        assert client.base_url == "http://other:1"
