"""Start and stop Azurite (npm package ``azurite``) for tests, the benchmark and local runs.

``python -m devtools.azurite`` starts blob, queue and table on free ports (or the standard ports with
``--standard-ports``), prints ``export`` lines with the connection strings, and runs until stopped.
"""

from __future__ import annotations

import argparse
import fcntl
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.settings import AZURITE_ACCOUNT_KEY

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("blob", "queue", "table")
STANDARD_PORTS = {"blob": 10000, "queue": 10001, "table": 10002}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(services: tuple[str, ...]) -> str:
    name = "azurite" if len(services) > 1 else f"azurite-{services[0]}"
    local = ROOT / "node_modules" / ".bin" / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    raise RuntimeError(f"{name} not found: run `npm ci` in {ROOT} (package.json pins azurite)")


class FolderInUse(RuntimeError):
    """Another Azurite started from this checkout keeps its data in the folder asked for."""


def _claim(folder: Path) -> int:
    """Hold ``folder`` for this Azurite (two Azurites writing one folder overwrite each other's data)."""
    descriptor = os.open(folder / ".in-use", os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise FolderInUse(
            f"{folder} is in use by another Azurite started from this checkout (`make run`, `make azurite`)"
        ) from None
    return descriptor


def _wait_for(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"Azurite did not open port {port} within {timeout:.0f}s")


@dataclass
class Azurite:
    """A running Azurite process."""

    services: tuple[str, ...] = ("table",)
    data_dir: Path | None = None  # None: in memory
    standard_ports: bool = False
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    requested_ports: dict[str, int] | None = None  # explicit ports (wins over standard_ports)
    _claimed: int | None = field(
        default=None, init=False, repr=False
    )  # the data folder's lock, while it runs

    def start(self, timeout: float = 30.0) -> Azurite:
        if self.requested_ports is not None:
            self.ports = {s: self.requested_ports[s] for s in self.services}
        else:
            self.ports = {
                s: (STANDARD_PORTS[s] if self.standard_ports else free_port()) for s in self.services
            }
        args = [_binary(self.services), "--disableTelemetry", "--skipApiVersionCheck", "--loose"]
        for service, port in self.ports.items():
            args += [f"--{service}Host", "127.0.0.1", f"--{service}Port", str(port)]
        if self.data_dir is None:
            args.append("--inMemoryPersistence")
            workdir = tempfile.mkdtemp(prefix="azurite-")
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._claimed = _claim(self.data_dir)
            args += ["--location", str(self.data_dir)]
            workdir = str(self.data_dir)
        args.append("--silent")
        self.process = subprocess.Popen(
            args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            for port in self.ports.values():
                _wait_for(port, timeout)
        except BaseException:  # not only a timeout: SIGTERM (SystemExit) while it starts must not orphan it
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None
        if self._claimed is not None:
            os.close(self._claimed)  # releases the folder's lock
            self._claimed = None

    def endpoint(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}/devstoreaccount1"

    @property
    def connection_string(self) -> str:
        parts = [
            "DefaultEndpointsProtocol=http",
            "AccountName=devstoreaccount1",
            f"AccountKey={AZURITE_ACCOUNT_KEY}",
        ]
        for service in self.services:
            parts.append(f"{service.capitalize()}Endpoint={self.endpoint(service)}")
        return ";".join(parts) + ";"

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


def azurite_answers(port: int, host: str = "127.0.0.1") -> bool:
    """Whether the server on ``port`` is Azurite (its ``Server`` header names it)."""

    connection = http.client.HTTPConnection(host, port, timeout=2)
    try:
        connection.request("GET", "/devstoreaccount1?comp=properties")
        server = connection.getresponse().getheader("Server") or ""
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return server.lower().startswith("azurite")


def connection_string_for(ports: dict[str, int]) -> str:
    """The development connection string for Azurite services on ``ports``."""
    parts = [
        "DefaultEndpointsProtocol=http",
        "AccountName=devstoreaccount1",
        f"AccountKey={AZURITE_ACCOUNT_KEY}",
    ]
    for service, port in ports.items():
        parts.append(f"{service.capitalize()}Endpoint=http://127.0.0.1:{port}/devstoreaccount1")
    return ";".join(parts) + ";"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--standard-ports", action="store_true", help="use 10000-10002")
    parser.add_argument("--location", type=Path, help="persist data in this folder (default: memory)")
    parser.add_argument("--env-file", type=Path, help="also write the export lines to this file")
    args = parser.parse_args()
    azurite = Azurite(services=SERVICES, data_dir=args.location, standard_ports=args.standard_ports).start()
    lines = f"export SETTLE_TEST_AZURITE='{azurite.connection_string}'\n"
    if args.env_file:
        args.env_file.write_text(lines)
    sys.stdout.write(lines)
    sys.stdout.flush()

    def _stop(*_: object) -> None:
        azurite.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    assert azurite.process is not None
    azurite.process.wait()
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
