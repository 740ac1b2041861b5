"""``make run``: Settle on http://localhost:7071 against Azurite, in one command.

1. Writes ``local.settings.json`` from ``local.settings.json.example`` when it is absent.
2. Starts Azurite (blob, queue, table: the Functions host needs all three) on 10000-10002 with its data in
   ``.azurite/`` (git-ignored). If an Azurite already answers on those ports it is reused (and left running).
3. Starts the app on port 7071: ``func start`` when Azure Functions Core Tools is on the PATH, otherwise
   the development host (``python -m devtools.host``).
4. Ctrl-C (or SIGTERM) stops everything it started, Azurite included.

Options exist so tests (and people with busy ports) can move everything: ``--port``, ``--azurite-ports
BLOB,QUEUE,TABLE``, ``--azurite-location``, ``--settings`` and ``--host auto|func|dev``; the same values can
come from ``SETTLE_RUN_PORT``, ``SETTLE_RUN_AZURITE_PORTS``, ``SETTLE_RUN_AZURITE_LOCATION``,
``SETTLE_RUN_HOST``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from common.settings import DEVELOPMENT_STORAGE
from devtools.azurite import (
    SERVICES,
    STANDARD_PORTS,
    Azurite,
    azurite_answers,
    connection_string_for,
    port_open,
)
from devtools.host import read_settings

ROOT = Path(__file__).resolve().parent.parent
# Settings that point at "the development storage"; moved with Azurite when it is not on 10000-10002.
STORAGE_SETTINGS = ("AzureWebJobsStorage", "SETTLE_TABLES")


def say(message: str) -> None:
    print(f"[make run] {message}", flush=True)


def answers_health(port: int) -> bool:
    """Does the app on ``port`` answer its health check (200) yet?"""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=1) as answer:
            return bool(answer.status == 200)
    except (OSError, ValueError):
        return False


def ready_lines(port: int) -> list[str]:
    """What ``make run`` prints once the app answers: where the API and the console are."""
    base = f"http://localhost:{port}/api"
    return [
        "ready:",
        f"  API      {base}/v1/  (OpenAPI document: {base}/v1/openapi.json)",
        f"  console  {base}/console",
        "  Ctrl-C stops the app and Azurite.",
    ]


def ensure_settings(path: Path, example: Path) -> bool:
    """Write ``path`` from ``example`` when it is absent; returns True when it was written."""
    if path.exists():
        return False
    path.write_text(example.read_text(encoding="utf-8"), encoding="utf-8")
    return True


def parse_ports(text: str) -> dict[str, int]:
    """``"10000,10001,10002"`` → blob/queue/table ports."""
    values = [int(p) for p in text.split(",")]
    if len(values) != len(SERVICES):
        raise argparse.ArgumentTypeError("give three ports: BLOB,QUEUE,TABLE")
    return dict(zip(SERVICES, values, strict=True))


@dataclass
class Storage:
    """Where Azurite is, and whether this run owns it."""

    ports: dict[str, int]
    azurite: Azurite | None  # None: an Azurite that was already running is reused

    @property
    def connection_string(self) -> str:
        return connection_string_for(self.ports)

    def stop(self) -> None:
        if self.azurite is not None:
            self.azurite.stop()
            say("Azurite stopped.")


def start_storage(ports: dict[str, int], location: Path) -> Storage:
    """Start Azurite on ``ports``, or reuse the Azurite that already answers there."""
    open_ports = [port for port in ports.values() if port_open(port)]
    if open_ports:
        if len(open_ports) == len(ports) and all(azurite_answers(port) for port in ports.values()):
            say(f"Azurite is already running on {_describe(ports)}: reusing it (this run will not stop it).")
            return Storage(ports, None)
        taken = ", ".join(str(p) for p in open_ports)
        raise SystemExit(
            f"[make run] port(s) {taken} are taken by something that is not a complete Azurite; stop it, "
            "or choose other ports with --azurite-ports BLOB,QUEUE,TABLE."
        )
    azurite = Azurite(services=SERVICES, data_dir=location, requested_ports=ports).start()
    say(f"Azurite started on {_describe(ports)} with its data in {location}.")
    return Storage(ports, azurite)


def _describe(ports: dict[str, int]) -> str:
    return ", ".join(f"{service} {port}" for service, port in ports.items())


def child_environment(settings: dict[str, str], storage: Storage) -> dict[str, str]:
    """The app's environment: ours, with storage settings moved to Azurite's ports when not standard."""
    environ = dict(os.environ)
    if storage.ports != STANDARD_PORTS:
        for name in STORAGE_SETTINGS:
            if environ.get(name, settings.get(name)) == DEVELOPMENT_STORAGE:
                environ[name] = storage.connection_string
    return environ


def app_command(kind: str, port: int, settings: Path) -> tuple[list[str], str]:
    """The command that serves the app, and its name."""
    func = shutil.which("func")
    if kind == "func" or (kind == "auto" and func):
        if func is None:
            raise SystemExit(
                "[make run] --host func: Azure Functions Core Tools (`func`) is not on the PATH."
            )
        if settings.resolve() != (ROOT / "local.settings.json").resolve():
            say("note: `func start` reads ./local.settings.json, not --settings.")
        return [func, "start", "--port", str(port)], "Azure Functions Core Tools (func start)"
    command = [sys.executable, "-m", "devtools.host", "--port", str(port), "--settings", str(settings)]
    return command, "the development host (Core Tools not found on the PATH)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("SETTLE_RUN_PORT", "7071")))
    parser.add_argument(
        "--azurite-ports",
        type=parse_ports,
        default=parse_ports(os.environ.get("SETTLE_RUN_AZURITE_PORTS", "10000,10001,10002")),
        metavar="BLOB,QUEUE,TABLE",
    )
    parser.add_argument(
        "--azurite-location",
        type=Path,
        default=Path(os.environ.get("SETTLE_RUN_AZURITE_LOCATION", str(ROOT / ".azurite"))),
    )
    parser.add_argument("--settings", type=Path, default=ROOT / "local.settings.json")
    parser.add_argument(
        "--host", choices=("auto", "func", "dev"), default=os.environ.get("SETTLE_RUN_HOST", "auto")
    )
    args = parser.parse_args(argv)

    if ensure_settings(args.settings, ROOT / "local.settings.json.example"):
        say(f"wrote {args.settings} from local.settings.json.example (git ignores it; edit it freely).")
    settings = read_settings(args.settings)
    command, name = app_command(args.host, args.port, args.settings)
    if port_open(args.port):  # checked before Azurite starts, so nothing is left behind
        raise SystemExit(
            f"[make run] port {args.port} is taken (another `make run` or app?); stop it, or choose another "
            "port with --port PORT (or SETTLE_RUN_PORT)."
        )

    stopping = False

    def _request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    # Ctrl-C reaches the whole foreground process group (the app too); SIGTERM only us: both end below.
    signal.signal(signal.SIGINT, _request_stop)
    signal.signal(signal.SIGTERM, _request_stop)

    storage = start_storage(args.azurite_ports, args.azurite_location)
    app: subprocess.Popen[bytes] | None = None
    try:
        say(f"starting {name} on http://localhost:{args.port}/api/v1/health")
        app = subprocess.Popen(command, cwd=ROOT, env=child_environment(settings, storage))
        ready = False
        while not stopping and app.poll() is None:
            if not ready and (ready := answers_health(args.port)):
                for line in ready_lines(args.port):
                    say(line)
            time.sleep(0.2)
        if app.poll() is not None and not stopping:
            say(f"the app exited with code {app.returncode}.")
            return app.returncode or 1
        return 0
    finally:
        if app is not None and app.poll() is None:
            say("stopping the app...")
            app.send_signal(signal.SIGINT)
            try:
                app.wait(timeout=15)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait()
        storage.stop()


if __name__ == "__main__":
    raise SystemExit(main())
