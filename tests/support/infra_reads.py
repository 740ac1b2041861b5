"""What the infra tests read from the code: the metric attributes Settle records, the CI's Python."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.infra.bicep import REPO

ROOT = Path(__file__).resolve().parents[2]


def recorded_attributes() -> dict[str, set[str]]:
    """Metric name → keyword attributes passed where the code records it (all of Settle's packages)."""
    found: dict[str, set[str]] = {}
    for folder in ("common", "state", "handoff"):
        for path in (ROOT / folder).rglob("*.py"):
            for name, rest in CALL.findall(path.read_text()):
                found.setdefault(name, set()).update(re.findall(r"\b([a-z_]+)=", rest))
    found.setdefault("settle.state.operations", set()).update({"op", "outcome"})  # state_operation()
    return found


def ci_python() -> str:
    """The Python minor version CI runs, from pyproject's requires-python (e.g. '>=3.11,<3.12')."""
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert match, spec
    return f"{match.group(1)}.{match.group(2)}"


CALL = re.compile(r"telemetry\.(?:add|gauge|record)\(\s*\"(settle\.[a-z_.]+)\"(.*?)\)\n", re.DOTALL)
