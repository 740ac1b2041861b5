"""Other OS processes running Settle against the same tables: each child is ``python -m <module> <args as
JSON>`` from the repository root, and prints one JSON object a line (what it was answered).

``tests/reliability/settle_child.py`` calls the app's functions; ``tests/reliability/layout_child.py`` does
the same under shard settings of its own. The races between processes start here, once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
