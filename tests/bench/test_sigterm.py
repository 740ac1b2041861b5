"""A benchmark stopped with SIGTERM stops the Azurite it started (it runs in its own session, so nothing
else would)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
