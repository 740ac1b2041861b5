"""Full hand-offs/s on one partition, this checkout against an earlier commit, side by side.

``python -m bench.ratio --before COMMIT [--runs 3] [--seconds 60] [--scale 40]`` (``make handoff-ratio
BEFORE=COMMIT``): checks ``COMMIT`` out in a temporary git worktree (its ``node_modules`` linked to this
one's), copies this checkout's :mod:`bench.handoff_full` into it (the driver uses only the service entry
points both commits have), then runs the driver in each checkout in turn, ``runs`` times, each in its own
process and its own Azurite, and prints every run, the medians and their ratio (after / before) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _run(checkout: Path, seconds: float, scale: float) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "bench.handoff_full", "--seconds", str(seconds), "--scale", str(scale)],
        cwd=checkout,
        env=_env(checkout),
        capture_output=True,
        text=True,
        timeout=seconds * 4 + 300,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["median_handoffs_per_s"])


def _env(checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    env["PYTHONPATH"] = str(checkout / "client")
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ratio", description=__doc__)
    parser.add_argument("--before", required=True, help="the earlier commit")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scale", type=float, default=40.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="settle-before-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=ROOT, check=True)
        try:
            (before / "node_modules").symlink_to(ROOT / "node_modules")
            shutil.copy(ROOT / "bench" / "handoff_full.py", before / "bench" / "handoff_full.py")
            runs: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.runs):
                runs["before"].append(_run(before, args.seconds, args.scale))
                runs["after"].append(_run(ROOT, args.seconds, args.scale))
                print(json.dumps(runs), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print(
        json.dumps(
            {
                "before": args.before,
                "runs": runs,
                "medians": medians,
                "ratio": medians["after"] / medians["before"],
                "per_run_ratios": [a / b for a, b in zip(runs["after"], runs["before"], strict=True)],
                "seconds": args.seconds,
                "scale": args.scale,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
