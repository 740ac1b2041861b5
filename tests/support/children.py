"""Other OS processes the tests start, each started, awaited and stopped here, once.

- Children running Settle against the same tables: each is ``python -m <module> <args as JSON>`` from
  the repository root and prints one JSON object a line (what it was answered).
  ``tests/reliability/settle_child.py`` calls the app's functions; ``tests/reliability/layout_child.py``
  does the same under shard settings of its own. The races between processes start here.
- The development host, ``python -m devtools.host`` on a free port (:func:`start_devhost`), with the
  environment of ``tests/support/devhost.py``: started, awaited until it answers, stopped (SIGTERM) or killed
  (SIGKILL). The ``start_host`` fixture (tests/conftest.py) starts the ones a module needs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devtools.azurite import free_port

ROOT = Path(__file__).resolve().parents[2]
SETTLE_CHILD = "tests.reliability.settle_child"
LAYOUT_CHILD = "tests.reliability.layout_child"


def start(module: str, args_list: list[dict[str, Any]]) -> list[subprocess.Popen[str]]:
    """One child per arguments, all started before any is waited for."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [
        subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(args)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in args_list
    ]


def finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[subprocess.CompletedProcess[str]]:
    """Wait for every child, in order, and keep what each printed."""
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def lines_of(done: list[subprocess.CompletedProcess[str]]) -> list[list[dict[str, Any]]]:
    """Each child's printed objects; a child that failed fails the test with the end of its stderr."""
    answers = []
    for child in done:
        assert child.returncode == 0, child.stderr[-3000:]
        answers.append([json.loads(line) for line in child.stdout.splitlines()])
    return answers


def run_children(
    args_list: list[dict[str, Any]], timeout: float = 180, module: str = SETTLE_CHILD
) -> list[list[dict[str, Any]]]:
    """Start one child per arguments, wait for all, and return what each printed."""
    return lines_of(finish(start(module, args_list), timeout))


@dataclass
class HostProcess:
    """A running ``python -m devtools.host``."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    prefix: str  # its table prefix

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, as the Functions host is stopped; SIGKILL if it has not ended within ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def kill(self) -> int:
        """SIGKILL: no clean-up at all (a crash)."""
        self.process.send_signal(signal.SIGKILL)
        return int(self.process.wait(30))


StartHost = Callable[..., HostProcess]  # the start_host fixture: start(*, app="function_app", env=None)


def start_devhost(
    folder: Path,
    environ: dict[str, str],
    *args: str,
    log_name: str = "host.log",
    ready_path: str = "/",
    ready_status: int | None = None,
) -> HostProcess:
    """Start the development host on a free port with ``environ`` (``tests.support.devhost.host_environment``)
    and the settings file ``folder/local.settings.json`` (the example's, unless the folder has one), its
    output in ``folder/log_name``; return once it answers ``ready_path`` (with ``ready_status``, if given)."""
    settings = folder / "local.settings.json"
    if not settings.exists():
        shutil.copy(ROOT / "local.settings.json.example", settings)
    port = free_port()
    log_path = folder / log_name
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "devtools.host", "--port", str(port), "--settings", str(settings), *args],
            cwd=ROOT,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    host = HostProcess(f"http://127.0.0.1:{port}", process, log_path, environ["SETTLE_TABLE_PREFIX"])
    try:
        wait_until_serving(host, path=ready_path, status=ready_status)
    except BaseException:
        host.stop()
        raise
    return host


def wait_until_serving(
    host: HostProcess, timeout: float = 120.0, path: str = "/", status: int | None = None
) -> None:
    """Until the host answers ``path`` (with ``status``, if given); fails with its output if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.process.poll() is not None:
            raise AssertionError(f"the development host exited early:\n{host.output()[-3000:]}")
        try:
            answer = httpx.get(host.base_url + path, timeout=2.0)
            if status is None or answer.status_code == status:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(
        f"the development host did not answer within {timeout:.0f}s:\n{host.output()[-3000:]}"
    )
