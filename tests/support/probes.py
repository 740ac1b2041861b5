"""A fresh interpreter running a probe against Azurite, telemetry settings cleared (cold start, export)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def clean_env(azurite_connection: str, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(TELEMETRY_ENV)}
    environ = {k: v for k, v in environ.items() if not k.startswith("ServiceBusConnection")}
    environ.update(
        SETTLE_TABLES=azurite_connection,
        SETTLE_TABLE_PREFIX="t" + uuid.uuid4().hex[:12],
        SETTLE_LOOPBACK="false",
        PYTHONPATH=str(ROOT),
    )
    environ.update(extra)
    return environ


def run_probe(code: str, environ: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


TELEMETRY_ENV = ("OTEL_", "APPLICATIONINSIGHTS_", "SETTLE_TELEMETRY", "PYTHON_APPLICATIONINSIGHTS")
