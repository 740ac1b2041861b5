"""``python -m devtools.run`` (``make run``): its options explained, its address from ``SETTLE_URL``."""

from __future__ import annotations

import pytest

from devtools.run import address_note, app_port, main, ready_lines


def test_help_names_the_command_and_explains_every_option_and_its_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # What `python -m devtools.run --help` prints (its `make run` tests start the command itself)
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    assert text.startswith("usage: python -m devtools.run")
    for option, variable in (
        ("--port PORT", "SETTLE_RUN_PORT"),
        ("--azurite-ports BLOB,QUEUE,TABLE", "SETTLE_RUN_AZURITE_PORTS"),
        ("--reuse-azurite", "SETTLE_RUN_REUSE_AZURITE"),
        ("--azurite-location FOLDER", "SETTLE_RUN_AZURITE_LOCATION"),
        ("--settings FILE", "local.settings.json"),
        ("--host {auto,func,dev}", "SETTLE_RUN_HOST"),
    ):
        assert f"{option} " in text and variable in text.partition(option)[2], option
    assert "SETTLE_URL" in text


def test_the_port_comes_from_settle_run_port_then_a_local_settle_url_then_7071() -> None:
    assert app_port({}) == 7071
    assert app_port({"SETTLE_URL": "http://127.0.0.1:7345"}) == 7345
    assert app_port({"SETTLE_URL": "http://localhost:7345/"}) == 7345
    assert app_port({"SETTLE_URL": "http://127.0.0.1:7345", "SETTLE_RUN_PORT": "7346"}) == 7346
    assert app_port({"SETTLE_URL": "https://func-settle.azurewebsites.net"}) == 7071  # not ours to serve


def test_a_settle_url_this_run_does_not_serve_is_said_once() -> None:
    assert address_note(7345, {"SETTLE_URL": "http://127.0.0.1:7345/"}) is None
    assert address_note(7345, {}) is None
    note = address_note(7346, {"SETTLE_URL": "http://127.0.0.1:7345"})
    assert note is not None and "http://127.0.0.1:7346" in note


def test_ready_names_the_address_to_export_when_it_is_not_the_default() -> None:
    assert not any("export" in line for line in ready_lines(7071))
    assert any("SETTLE_URL=http://127.0.0.1:7071" in line for line in ready_lines(7071))
    assert "  in another terminal: export SETTLE_URL=http://127.0.0.1:7345" in ready_lines(7345)
