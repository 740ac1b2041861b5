"""infra/deploy.sh at its confirmation prompt: nothing is deployed unless the operator answers yes.

The script runs with a stub ``az`` first on PATH (it records every call and answers what the real CLI
would), on a terminal (a pty) that has the answer typed in already, with SETTLE_SKIP_CODE=1 so that even
a broken script never builds a package. Checked:

- Enter (an empty answer) deploys nothing and exits non-zero;
- end of input (Ctrl-D on the terminal) deploys nothing and exits non-zero;
- a failing ``az deployment group what-if`` stops the script before the prompt: answering yes afterwards
  deploys nothing, and the exit status is non-zero;
- and, so that the three cannot pass by a script that never deploys, answering ``y`` does deploy.

The result depends only on the script's text, so it is computed once per distinct script.
"""

from __future__ import annotations

import hashlib
import os
import pty
import subprocess
import tempfile
from pathlib import Path

from tests.infra.report import Finding, Report

STUB_AZ = """#!/usr/bin/env bash
printf '%s\\n' "$*" >>"$STUB_AZ_LOG"
case "$1 $2 $3" in
  "version "*) echo 2.67.0 ;;
  "account show"*) echo user ;;
  "group exists"*) echo true ;;
  "group show"*) echo westeurope ;;
  "deployment group what-if")
    if [ -n "${STUB_AZ_WHAT_IF_FAILS:-}" ]; then echo "ERROR: InvalidTemplate" >&2; exit 1; fi ;;
  "deployment group show") echo func-settle-check ;;
esac
exit 0
"""

# (what the operator does, the bytes typed at the prompt, extra environment, whether it must deploy)
SCENARIOS = [
    ("Enter (an empty answer) at the prompt", b"\n", {}, False),
    ("end of input (EOF) at the prompt", b"\x04", {}, False),
    ("a failing what-if, then yes,", b"y\n", {"STUB_AZ_WHAT_IF_FAILS": "1"}, False),
    ("answering y", b"y\n", {}, True),
]
_results: dict[str, list[str]] = {}


def _run(script: Path, typed: bytes, extra: dict[str, str], work: Path) -> tuple[int, bool, str]:
    """(exit status, whether anything was deployed, stderr) of one run of ``script``."""
    log = work / "calls.log"
    log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PATH": f"{work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "STUB_AZ_LOG": str(log),
        "SETTLE_SKIP_CODE": "1",
        **extra,
    }
    env.pop("SETTLE_DEVELOPER_ACCESS", None)
    controller, terminal = pty.openpty()
    try:
        os.write(controller, typed)  # type-ahead, read by the prompt
        result = subprocess.run(
            ["bash", str(script), "rg-settle-check", "westeurope", "check"],
            stdin=terminal,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    finally:
        os.close(controller)
        os.close(terminal)
    calls = log.read_text().splitlines() if log.exists() else []
    deployed = any(c.startswith(("deployment group create", "group create")) for c in calls)
    return result.returncode, deployed, result.stderr


def problems(script: Path) -> list[str]:
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    if digest in _results:
        return _results[digest]
    found: list[str] = []
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        (work / "bin").mkdir()
        stub = work / "bin" / "az"
        stub.write_text(STUB_AZ)
        stub.chmod(0o755)
        for label, typed, extra, must_deploy in SCENARIOS:
            code, deployed, stderr = _run(script, typed, extra, work)
            if must_deploy and (code != 0 or not deployed):
                found.append(f"{label} did not deploy (exit {code}): {stderr.strip()[-300:]}")
            elif not must_deploy and deployed:
                found.append(f"{label} deployed (it must stop with nothing deployed)")
            elif not must_deploy and code == 0:
                found.append(f"{label} exited 0 (it must exit non-zero: nothing was deployed)")
    _results[digest] = found
    return found


def check_deploy_script(root: Path) -> Report:
    report = Report()
    script = root / "deploy.sh"
    if not script.is_file():
        report.errors.append(Finding("deploy.sh", 0, "", "", "missing"))
        return report
    report.errors += [Finding("deploy.sh", 0, "", "", problem) for problem in problems(script)]
    return report
