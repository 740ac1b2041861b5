"""What a run was measured on: recorded beside every benchmark and reliability result (no heavy imports)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _azurite_version() -> str | None:
    try:
        package = json.loads((ROOT / "node_modules" / "azurite" / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = package.get("version")
    return str(version) if version else None


def _git_commit() -> str | None:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    return commit + ("+changes" if dirty else "")


def describe() -> dict[str, Any]:
    """The machine, the software under it and the commit measured."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "azurite": _azurite_version(),
        "commit": _git_commit(),
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
    }


def one_line(machine: dict[str, Any]) -> str:
    """``2 x Intel Xeon ..., 7.8 GiB, Linux-6.1, Python 3.11.9, Azurite 3.35.0`` for the docs."""
    parts = [f"{machine.get('cpus')} x {machine.get('cpu')}"]
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']} GiB")
    parts.append(str(machine.get("os")))
    parts.append(f"Python {machine.get('python')}")
    if machine.get("azurite"):
        parts.append(f"Azurite {machine['azurite']} (in memory)")
    if machine.get("load_average_at_start"):
        parts.append("load average at start " + " / ".join(str(x) for x in machine["load_average_at_start"]))
    return ", ".join(parts)
