"""Start the development host as a separate process (free port, test Azurite, fresh table prefix)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devtools.azurite import free_port
from tests.conftest import new_prefix
from tests.support.devhost import host_environment

ROOT = Path(__file__).resolve().parents[2]
# Never inherited from the developer's shell: the tests decide these.


@dataclass
class HostProcess:
    """A running ``python -m devtools.host``."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def wait_until_serving(host: HostProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.process.poll() is not None:
            raise AssertionError(f"the development host exited early:\n{host.output()}")
        try:
            httpx.get(host.base_url + "/", timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"the development host did not answer within {timeout:.0f}s:\n{host.output()}")


StartHost = Callable[..., HostProcess]


@pytest.fixture(scope="module")
def start_host(azurite_connection: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartHost]:
    """Start development hosts for a module; every one is stopped at the end."""
    started: list[HostProcess] = []

    def start(*, app: str = "function_app", env: dict[str, str] | None = None) -> HostProcess:
        folder = tmp_path_factory.mktemp("devhost")
        settings = folder / "local.settings.json"
        shutil.copy(ROOT / "local.settings.json.example", settings)
        port = free_port()
        environ = host_environment(azurite_connection, new_prefix(), **(env or {}))
        log_path = folder / "host.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "devtools.host",
                    "--port",
                    str(port),
                    "--settings",
                    str(settings),
                    "--app",
                    app,
                ],
                cwd=ROOT,
                env=environ,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        host = HostProcess(f"http://127.0.0.1:{port}", process, log_path)
        started.append(host)
        wait_until_serving(host)
        return host

    yield start
    for host in started:
        host.stop()
