"""``make run``: Settle on http://127.0.0.1:7071 (or ``SETTLE_URL``'s port) against Azurite, in one command.

1. Writes ``local.settings.json`` from ``local.settings.json.example`` when it is absent.
2. Starts an Azurite of its own (blob, queue, table: the Functions host needs all three) with its data in
   ``.azurite/`` (git-ignored): on 10000-10002 when they are free, otherwise on free ports, and says
   which. An Azurite it did not start is used only when asked (``--reuse-azurite``).
3. Starts the app: ``func start`` when Azure Functions Core Tools is on the PATH, otherwise the
   development host (``python -m devtools.host``). Its address is ``SETTLE_URL``, the one setting
   ``settle``, the client, ``make demo`` and the walkthrough follow.
4. Ctrl-C (or SIGTERM) stops everything it started, Azurite included.
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

from settle_client.address import DEFAULT_PORT, RUN_PORT_SETTING, URL_SETTING

from common.settings import DEVELOPMENT_STORAGE
from devtools.azurite import (
    SERVICES,
    STANDARD_PORTS,
    Azurite,
    FolderInUse,
    azurite_answers,
    connection_string_for,
    free_port,
    port_open,
)
from devtools.host import read_settings

ROOT = Path(__file__).resolve().parent.parent
# Settings that point at "the development storage"; moved with Azurite when it is not on 10000-10002.
STORAGE_SETTINGS = ("AzureWebJobsStorage", "SETTLE_TABLES")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
YES = {"1", "true", "yes", "on"}


def say(message: str) -> None:
    print(f"[make run] {message}", flush=True)


def answers_health(port: int) -> bool:
    """Does the app on ``port`` answer its health check (200) yet?"""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=1) as answer:
            return bool(answer.status == 200)
    except (OSError, ValueError):
        return False


def served_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def ready_lines(port: int) -> list[str]:
    """What ``make run`` prints once the app answers: where the API and the console are, and the
    ``SETTLE_URL`` that points ``settle``, ``make demo``, the client and the walkthrough at it."""
    url = served_url(port)
    base = f"{url}/api"
    lines = [
        "ready:",
        f"  API      {base}/v1/  (OpenAPI document: {base}/v1/openapi.json)",
        f"  console  {base}/console",
        f"  address  {URL_SETTING}={url}  (settle, make demo, the client and the walkthrough follow it)",
    ]
    if port != DEFAULT_PORT:
        lines.append(f"  in another terminal: export {URL_SETTING}={url}")
    lines.append("  Ctrl-C stops the app and Azurite.")
    return lines


def app_port(environ: Mapping[str, str]) -> int:
    """``--port``'s default: ``SETTLE_RUN_PORT``, else the port of ``SETTLE_URL`` when it names this
    machine over http, else 7071."""
    text = environ.get(RUN_PORT_SETTING, "").strip()
    source = RUN_PORT_SETTING
    if not text:
        url = urlsplit(environ.get(URL_SETTING, "").strip())
        if url.scheme != "http" or url.hostname not in LOCAL_HOSTS:
            return DEFAULT_PORT
        try:
            return url.port or 80
        except ValueError:
            raise SystemExit(f"[make run] {URL_SETTING}={url.geturl()} has no valid port.") from None
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"[make run] {source}={text!r} is not a port number.") from None


def address_note(port: int, environ: Mapping[str, str]) -> str | None:
    """A sentence when ``SETTLE_URL`` names another address than the one this run serves."""
    named = environ.get(URL_SETTING, "").strip().rstrip("/")
    if not named:
        return None
    url = urlsplit(named)
    try:
        same = url.scheme == "http" and url.hostname in LOCAL_HOSTS and (url.port or 80) == port
    except ValueError:
        same = False
    if same:
        return None
    return (
        f"note: {URL_SETTING}={named}, but this run serves {served_url(port)}; settle, make demo and the "
        f"client follow {URL_SETTING}, so they will not talk to this app unless you change it."
    )


def ensure_settings(path: Path, example: Path) -> bool:
    """Write ``path`` from ``example`` when it is absent; returns True when it was written."""
    if path.exists():
        return False
    path.write_text(example.read_text(encoding="utf-8"), encoding="utf-8")
    return True


def _env_ports() -> dict[str, int] | None:
    text = os.environ.get("SETTLE_RUN_AZURITE_PORTS", "").strip()
    try:
        return parse_ports(text) if text else None
    except (ValueError, argparse.ArgumentTypeError):
        raise SystemExit(
            f"[make run] SETTLE_RUN_AZURITE_PORTS={text!r}: give three ports, BLOB,QUEUE,TABLE."
        ) from None


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


def start_storage(ports: dict[str, int] | None, location: Path, *, reuse: bool) -> Storage:
    """Start an Azurite of this run's own: on ``ports``, or (``None``) on 10000-10002 when they are free
    and on free ports when they are not. An Azurite already on those ports is used only with ``reuse``."""
    wanted = ports or STANDARD_PORTS
    taken = [port for port in wanted.values() if port_open(port)]
    if taken:
        is_azurite = len(taken) == len(wanted) and all(azurite_answers(port) for port in wanted.values())
        if reuse and is_azurite:
            say(
                f"Azurite: reusing the one already on {_describe(wanted)} (--reuse-azurite); this run did "
                "not start it and will not stop it."
            )
            return Storage(wanted, None)
        holder = (
            "an Azurite this run did not start" if is_azurite else "something that is not a complete Azurite"
        )
        listed = ", ".join(str(p) for p in taken)
        if reuse or ports is not None:
            advice = "stop it, or choose other ports with --azurite-ports BLOB,QUEUE,TABLE"
            if is_azurite:
                advice += " (or leave them out: make run then starts its own on free ports)"
            elif not reuse:
                advice += ", or leave them out to get free ones"
            raise SystemExit(f"[make run] port(s) {listed} are taken by {holder}; {advice}.")
        wanted = {service: free_port() for service in SERVICES}
        say(
            f"port(s) {listed} are taken by {holder}: starting an Azurite of this run's own on free ports "
            "(--reuse-azurite uses the one there instead)."
        )
    try:
        azurite = Azurite(services=SERVICES, data_dir=location, requested_ports=wanted).start()
    except FolderInUse as exc:
        raise SystemExit(
            f"[make run] {exc}: stop it, pass --reuse-azurite to use it, or keep this run's data elsewhere "
            "with --azurite-location."
        ) from None
    pid = azurite.process.pid if azurite.process else "?"
    say(
        f"Azurite: started by this run on {_describe(wanted)} (pid {pid}), data in {location}; "
        "Ctrl-C stops it."
    )
    return Storage(wanted, azurite)


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
        prog="python -m devtools.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Every option also comes from the environment variable named in its help; the command "
        f"line wins. {URL_SETTING}, where settle, make demo, the client and the walkthrough find the app, "
        "defaults to what this serves.",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"the app's port (env {RUN_PORT_SETTING}; else the port of {URL_SETTING} when it names this "
        f"machine; else {DEFAULT_PORT}). The app is served at http://127.0.0.1:PORT",
    )
    parser.add_argument(
        "--azurite-ports",
        type=parse_ports,
        default=_env_ports(),
        metavar="BLOB,QUEUE,TABLE",
        help="the ports of this run's Azurite (env SETTLE_RUN_AZURITE_PORTS; default 10000,10001,10002 "
        "when they are free, else free ports); a port taken is an error",
    )
    parser.add_argument(
        "--reuse-azurite",
        action="store_true",
        default=os.environ.get("SETTLE_RUN_REUSE_AZURITE", "").strip().lower() in YES,
        help="use the Azurite that already answers on those ports instead of starting one (env "
        "SETTLE_RUN_REUSE_AZURITE=1); it is left running. Without it, make run only uses an Azurite it "
        "started and stops it on Ctrl-C",
    )
    parser.add_argument(
        "--azurite-location",
        type=Path,
        default=Path(os.environ.get("SETTLE_RUN_AZURITE_LOCATION", str(ROOT / ".azurite"))),
        metavar="FOLDER",
        help="where this run's Azurite keeps its data (env SETTLE_RUN_AZURITE_LOCATION; default .azurite/)",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        default=ROOT / "local.settings.json",
        metavar="FILE",
        help="the app's settings, written from local.settings.json.example when absent (default "
        "local.settings.json; `func start` always reads ./local.settings.json)",
    )
    parser.add_argument(
        "--host",
        choices=("auto", "func", "dev"),
        default=os.environ.get("SETTLE_RUN_HOST", "auto"),
        help="what serves the app (env SETTLE_RUN_HOST): func = Azure Functions Core Tools (func start), "
        "dev = the development host (python -m devtools.host), auto = func when it is on the PATH "
        "(default)",
    )
    args = parser.parse_args(argv)
    port: int = args.port if args.port is not None else app_port(os.environ)

    if ensure_settings(args.settings, ROOT / "local.settings.json.example"):
        say(f"wrote {args.settings} from local.settings.json.example (git ignores it; edit it freely).")
    settings = read_settings(args.settings)
    command, name = app_command(args.host, port, args.settings)
    if (note := address_note(port, os.environ)) is not None:
        say(note)
    if port_open(port):  # checked before Azurite starts, so nothing is left behind
        raise SystemExit(
            f"[make run] port {port} is taken (another `make run` or app?); stop it, or choose another "
            "port with --port PORT (or SETTLE_RUN_PORT)."
        )

    stopping = False

    def _request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    # Ctrl-C reaches the whole foreground process group (the app too); SIGTERM only us: both end below.
    signal.signal(signal.SIGINT, _request_stop)
    signal.signal(signal.SIGTERM, _request_stop)

    storage = start_storage(args.azurite_ports, args.azurite_location, reuse=args.reuse_azurite)
    app: subprocess.Popen[bytes] | None = None
    try:
        say(f"starting {name} on {served_url(port)}/api/v1/health")
        app = subprocess.Popen(command, cwd=ROOT, env=child_environment(settings, storage))
        ready = False
        while not stopping and app.poll() is None:
            if not ready and (ready := answers_health(port)):
                for line in ready_lines(port):
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
