"""``make run`` (``python -m devtools.run``): one command to a serving app, and Ctrl-C stops it all.

The tests move every port (``--port``, ``--azurite-ports``) and the data folder so they never touch a
developer's 7071 / 10000-10002 or ``.azurite/``; the code path is the one ``make run`` takes.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from devtools.azurite import SERVICES, Azurite, free_port, port_open

pytestmark = pytest.mark.storage  # starts an Azurite of its own

ROOT = Path(__file__).resolve().parents[2]
HEALTH_DEADLINE_SECONDS = 60.0
# Never inherited from the developer's shell: each test says where the app is.
ADDRESS = {"SETTLE_URL", "SETTLE_RUN_PORT", "SETTLE_DEMO_URL", "SETTLE_RUN_REUSE_AZURITE"}


def start_run(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log_path = tmp_path / "run.log"
    environ = {
        k: v for k, v in os.environ.items() if k not in {"SETTLE_TABLES", "SETTLE_TABLE_PREFIX", *ADDRESS}
    }
    environ.update(PYTHONUNBUFFERED="1", **(env or {}))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "devtools.run", *extra],
            cwd=ROOT,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, log_path


def stop_with_sigint(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def wait_for_health(process: subprocess.Popen[bytes], port: int, log_path: Path) -> float:
    started = time.monotonic()
    while time.monotonic() - started < HEALTH_DEADLINE_SECONDS:
        assert process.poll() is None, log_path.read_text()
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1.0)
            if response.status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no health answer within {HEALTH_DEADLINE_SECONDS:.0f}s:\n{log_path.read_text()}")


def azurite_args(ports: dict[str, int]) -> str:
    return ",".join(str(ports[s]) for s in SERVICES)


def describe(ports: dict[str, int]) -> str:
    return ", ".join(f"{s} {ports[s]}" for s in SERVICES)


def test_make_run_answers_health_and_ctrl_c_stops_azurite_too(tmp_path: Path) -> None:
    # Given no local.settings.json and free ports for the app and Azurite
    port = free_port()
    ports = {s: free_port() for s in SERVICES}
    settings = tmp_path / "local.settings.json"
    data = tmp_path / "azurite-data"

    # When `make run`'s entry starts (the dev host, as on a machine without Core Tools)
    process, log_path = start_run(
        tmp_path,
        "--port", str(port),
        "--azurite-ports", azurite_args(ports),
        "--azurite-location", str(data),
        "--settings", str(settings),
        "--host", "dev",
    )  # fmt: skip
    try:
        elapsed = wait_for_health(process, port, log_path)
        deadline = time.monotonic() + 10  # `make run` polls health itself, every 0.2 s
        while "console  http" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        code = stop_with_sigint(process)

    # Then health answered in bounded time, settings were written, Azurite kept its data in the folder
    assert elapsed < HEALTH_DEADLINE_SECONDS
    assert settings.read_text() == (ROOT / "local.settings.json.example").read_text()
    assert any(data.iterdir())
    output = log_path.read_text()
    assert "development tool" in output
    # And once it answered, it said where the API and the console are
    assert f"API      http://127.0.0.1:{port}/api/v1/" in output
    assert f"console  http://127.0.0.1:{port}/api/console" in output
    assert f"export SETTLE_URL=http://127.0.0.1:{port}" in output
    # And it said which Azurite it uses: its own, on the ports asked for
    assert f"Azurite: started by this run on {describe(ports)}" in output
    # And Ctrl-C stopped the app and Azurite: nothing listens any more
    assert code == 0, output
    assert "Azurite stopped" in output
    assert not port_open(port)
    assert not any(port_open(p) for p in ports.values())


def test_one_settle_url_moves_make_run_make_demo_settle_and_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from settle_client import SettleClient

    # Given SETTLE_URL naming a port that is not 7071, and nothing else saying where the app is
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ports = {s: free_port() for s in SERVICES}
    process, log_path = start_run(
        tmp_path,
        "--azurite-ports", azurite_args(ports),
        "--azurite-location", str(tmp_path / "data"),
        "--settings", str(tmp_path / "local.settings.json"),
        "--host", "dev",
        env={"SETTLE_URL": url},
    )  # fmt: skip
    try:
        # When make run starts, then make demo, settle and the client run with that one variable
        wait_for_health(process, port, log_path)
        environ = {k: v for k, v in os.environ.items() if k not in ADDRESS} | {"SETTLE_URL": url}
        demo = subprocess.run(
            [sys.executable, "-m", "devtools.demo", "--tag", "addr"],
            cwd=ROOT, env=environ, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        found = subprocess.run(
            [str(Path(sys.executable).parent / "settle"), "--json", "find", "inv-4001-addr"],
            env=environ, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        for name in ADDRESS:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("SETTLE_URL", url)
        with SettleClient(handle_sigterm=False) as client:
            meta = client.meta()
    finally:
        code = stop_with_sigint(process)

    # Then the app was served at that address, and every entry point reached it there
    output = log_path.read_text()
    assert f"API      {url}/api/v1/" in output and code == 0, output
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"open {url}/api/console" in demo.stdout
    assert found.returncode == 0, found.stderr
    assert [row["eventId"] for row in json.loads(found.stdout)] == ["inv-4001-addr"]
    assert "Processed" in meta.exists_statuses


def test_a_running_azurite_is_reused_only_when_asked_and_left_running(tmp_path: Path) -> None:
    ports = {s: free_port() for s in SERVICES}
    with Azurite(services=SERVICES, requested_ports=ports) as azurite:
        port = free_port()
        process, log_path = start_run(
            tmp_path,
            "--port", str(port),
            "--azurite-ports", azurite_args(ports),
            "--settings", str(tmp_path / "local.settings.json"),
            "--host", "dev",
            env={"SETTLE_RUN_REUSE_AZURITE": "1"},
        )  # fmt: skip
        try:
            wait_for_health(process, port, log_path)
        finally:
            code = stop_with_sigint(process)
        assert code == 0
        assert f"Azurite: reusing the one already on {describe(ports)}" in log_path.read_text()
        assert azurite.process is not None and azurite.process.poll() is None
        assert all(port_open(p) for p in ports.values())


def test_an_azurite_it_did_not_start_is_never_adopted_silently(tmp_path: Path) -> None:
    # Given someone else's Azurite on the ports asked for
    ports = {s: free_port() for s in SERVICES}
    with Azurite(services=SERVICES, requested_ports=ports) as azurite:
        # When make run starts without --reuse-azurite
        process, log_path = start_run(
            tmp_path,
            "--port", str(free_port()),
            "--azurite-ports", azurite_args(ports),
            "--settings", str(tmp_path / "local.settings.json"),
            "--host", "dev",
        )  # fmt: skip
        code = process.wait(timeout=60)
        # Then it refuses in one sentence that says what to do, and leaves that Azurite alone
        text = log_path.read_text()
        assert code != 0
        assert "are taken by an Azurite this run did not start" in text and "Traceback" not in text
        assert azurite.process is not None and azurite.process.poll() is None


def test_busy_standard_ports_get_an_azurite_of_its_own_on_free_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from devtools import run

    # Given an Azurite this run did not start on the ports make run would take by default
    busy = {s: free_port() for s in SERVICES}
    with Azurite(services=SERVICES, requested_ports=busy):
        monkeypatch.setattr(run, "STANDARD_PORTS", busy)
        # When make run starts its storage with no ports asked for
        storage = run.start_storage(None, tmp_path / "data", reuse=False)
        try:
            # Then it started its own elsewhere and said so
            assert storage.azurite is not None
            assert set(storage.ports.values()).isdisjoint(busy.values())
            assert all(port_open(p) for p in storage.ports.values())
            said = capsys.readouterr().out
            assert "taken by an Azurite this run did not start" in said
            assert f"Azurite: started by this run on {describe(storage.ports)}" in said
            # And a second run on the same data folder is refused instead of sharing it
            with pytest.raises(SystemExit, match="is in use by another Azurite"):
                run.start_storage(None, tmp_path / "data", reuse=False)
        finally:
            storage.stop()


def test_ports_taken_by_something_else_are_a_clear_error(tmp_path: Path) -> None:
    import socket

    ports = {s: free_port() for s in SERVICES}
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports["table"]))
        squatter.listen()
        process, log_path = start_run(
            tmp_path,
            "--port", str(free_port()),
            "--azurite-ports", azurite_args(ports),
            "--settings", str(tmp_path / "local.settings.json"),
            "--host", "dev",
        )  # fmt: skip
        code = process.wait(timeout=30)
    assert code != 0
    assert f"{ports['table']} are taken by something that is not a complete Azurite" in log_path.read_text()


def test_core_tools_is_used_when_func_is_on_the_path(tmp_path: Path) -> None:
    # Given a stand-in `func` on the PATH that records how it was called
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "func-calls.txt"
    fake = bin_dir / "func"
    fake.write_text(
        f'#!/bin/sh\necho "$@" > {calls}\ntrap "exit 0" INT TERM\nwhile true; do sleep 0.1; done\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    port = free_port()
    ports = {s: free_port() for s in SERVICES}

    process, log_path = start_run(
        tmp_path,
        "--port", str(port),
        "--azurite-ports", azurite_args(ports),
        "--azurite-location", str(tmp_path / "data"),
        "--settings", str(tmp_path / "local.settings.json"),
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SETTLE_RUN_HOST": "auto"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not calls.exists() and time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()
            time.sleep(0.1)
    finally:
        code = stop_with_sigint(process)

    # Then `make run` started `func start --port <port>` and stopped it and Azurite on Ctrl-C
    assert calls.read_text().split() == ["start", "--port", str(port)]
    assert "Azure Functions Core Tools" in log_path.read_text()
    assert code == 0
    assert not any(port_open(p) for p in ports.values())


def test_make_run_from_a_fresh_clone_answers_health(tmp_path: Path) -> None:
    # Given a fresh clone of the committed tree. Installing is `make install`'s job (CI runs it from a
    # clean clone); here the clone borrows this checkout's virtualenv and Azurite through an install
    # stamp of its own, so the test neither downloads nor touches the shared virtualenv.
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--local", str(ROOT), str(clone)], check=True)
    stamp = tmp_path / "installed.stamp"
    stamp.touch()
    assert not (clone / "local.settings.json").exists()
    port = free_port()
    ports = {s: free_port() for s in SERVICES}
    env = {
        k: v for k, v in os.environ.items() if k not in {"SETTLE_TABLES", "SETTLE_TABLE_PREFIX", "MAKEFLAGS"}
    }
    env.update(
        PATH=f"{ROOT / 'node_modules' / '.bin'}{os.pathsep}{env['PATH']}",
        SETTLE_RUN_PORT=str(port),
        SETTLE_RUN_AZURITE_PORTS=azurite_args(ports),
        SETTLE_RUN_HOST="dev",
        PYTHONUNBUFFERED="1",
    )
    log_path = tmp_path / "make.log"

    # When the README's command runs there (in its own process group, like a terminal)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["make", "run", f"VENV={sys.prefix}", f"STAMP={stamp}", f"PYSTAMP={stamp}"],  # its virtualenv
            cwd=clone,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        elapsed = wait_for_health(process, port, log_path)
    finally:
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise

    # Then health answered within the bound, settings were written, and Ctrl-C left nothing running
    assert elapsed < HEALTH_DEADLINE_SECONDS
    assert (clone / "local.settings.json").exists()
    assert (clone / ".azurite").is_dir()
    output = log_path.read_text()
    assert "pip install" not in output and "npm ci" not in output  # the stamp was honoured
    assert "Azurite stopped" in output
    assert not port_open(port)
    assert not any(port_open(p) for p in ports.values())


def test_an_app_port_that_is_taken_is_a_clear_sentence_not_a_traceback(tmp_path: Path) -> None:
    import socket

    port = free_port()
    ports = {s: free_port() for s in SERVICES}
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        process, log_path = start_run(
            tmp_path,
            "--port", str(port),
            "--azurite-ports", azurite_args(ports),
            "--azurite-location", str(tmp_path / "data"),
            "--settings", str(tmp_path / "local.settings.json"),
            "--host", "dev",
        )  # fmt: skip
        code = process.wait(timeout=60)
    text = log_path.read_text()
    assert code != 0
    assert f"port {port} is taken" in text
    assert "Traceback" not in text
    # Nothing was started for a run that cannot serve: Azurite is not left behind
    assert not any(port_open(p) for p in ports.values())
