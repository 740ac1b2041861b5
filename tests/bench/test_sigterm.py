"""A benchmark stopped with SIGTERM stops the Azurite it started (it runs in its own session, so nothing
else would)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.storage  # starts an Azurite of its own

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_the_benchmarks_azurite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "--only", "scaleout", "--out", str(tmp_path / "r.json")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert bench.stderr is not None
    # Given a benchmark that started its Azurite and is running a section
    for line in bench.stderr:
        if "scaleout ..." in line:
            break
    azurite = _children(bench.pid)
    assert azurite, "the benchmark started no child process"
    # When it is sent SIGTERM
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=60) != 0
    # Then its Azurite is gone too
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in azurite) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in azurite if _alive(p)]


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        children = _children(todo.pop())
        found += children
        todo += children
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _azurites(pids: list[int]) -> list[int]:
    return [p for p in pids if "azurite" in _cmdline(p)]


def _stop_and_check(command: list[str], started: str, azurites: int, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    run = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert run.stderr is not None
    try:
        # Given the whole harness running a section, with every Azurite it starts up
        for line in run.stderr:
            if started in line:
                break
        deadline = time.monotonic() + 120
        while len(_azurites(_descendants(run.pid))) < azurites and time.monotonic() < deadline:
            time.sleep(0.2)
        tree = _descendants(run.pid)
        assert len(_azurites(tree)) == azurites, tree
        # When it is sent SIGTERM
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=90) != 0
        # Then nothing it started is left running: no Azurite, no process beside it
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [_cmdline(p) for p in tree if _alive(p)]
    finally:
        if run.poll() is None:
            run.kill()


def test_sigterm_stops_every_azurite_of_the_whole_harness(tmp_path: Path) -> None:
    # The full run starts two: its own, and the keeper's beside it (bench/__main__.py BESIDE).
    _stop_and_check(
        [sys.executable, "-m", "bench", "--out", str(tmp_path / "r.json")], "roundtrips ...", 2, tmp_path
    )


def test_sigterm_to_make_bench_smoke_stops_every_azurite(tmp_path: Path) -> None:
    _stop_and_check(["make", "bench-smoke"], "roundtrips ...", 2, tmp_path)
