"""``python -m bench [--smoke] [--out PATH] [--only SECTION ...]``: the side-by-side benchmark.

Starts its own Azurite (tables only, in memory), runs every section, prints one table and writes
``bench/results.json``. Exit status 0 unless the benchmark itself crashed: a missed target is a finding,
never a CI failure.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    agents,
    catchup,
    coldstart,
    contention,
    handoff_scaleout,
    keeper,
    latency,
    machine,
    resolver,
    roundtrips,
    scaleout,
)
from bench.harness import (
    DEFAULT_OUT,
    Environment,
    Figure,
    Results,
    Sizes,
    environment,
    log,
    missing,
    render_markdown,
    render_table,
    write_results,
)


def _scaleout(env: Environment) -> list[Figure]:
    """The ``scaleout`` section: one hot node (bench/scaleout.py), then one busy endpoint's hand-offs
    (bench/handoff_scaleout.py); a part that fails is reported and does not hide the other's figures."""
    figures: list[Figure] = []
    for part, run_part in (("state", scaleout.run), ("hand-offs", handoff_scaleout.run)):
        try:
            figures += run_part(env)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            why = f"{type(exc).__name__}: {exc}"
            figures.append(missing("scaleout", f"scaleout {part} (section failed)", "", why))
    return figures


SECTIONS: dict[str, Callable[[Environment], list[Figure]]] = {
    "roundtrips": roundtrips.run,
    "latency": latency.run,
    "contention": contention.run,
    "catchup": catchup.run,
    "resolver": resolver.run,
    "coldstart": coldstart.run,
    "keeper": keeper.run,
    "agents": agents.run,
    "scaleout": _scaleout,
}


def run(
    *,
    smoke: bool,
    out: Path | None = DEFAULT_OUT,
    only: Sequence[str] = (),
    connection: str | None = None,
    functions: Mapping[str, Any] | None = None,
    command: str = "python -m bench",
) -> Results:
    """Run the benchmark; ``connection``/``functions`` let a test reuse its Azurite and indexed app."""
    sizes = Sizes.smoke() if smoke else Sizes.full()
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    measured_on = machine.describe()
    sections: dict[str, list[Figure]] = {}
    with environment(sizes, smoke=smoke, connection=connection, functions=functions) as env:
        for name, section in SECTIONS.items():
            if only and name not in only:
                continue
            log(f"{name} ...")
            t0 = time.perf_counter()
            try:
                env.use_fresh_prefix()
                sections[name] = section(env)
            except Exception as exc:
                # One section failing (usually the code under test) must not hide the others.
                traceback.print_exc(file=sys.stderr)
                sections[name] = [
                    missing(name, f"{name} (section failed)", "", f"{type(exc).__name__}: {exc}")
                ]
            log(f"{name} done in {time.perf_counter() - t0:.1f} s")
        details = env.details
    if hasattr(os, "getloadavg"):
        details["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results = Results(
        started_at=started_at,
        duration_s=round(time.perf_counter() - started, 1),
        smoke=smoke,
        command=command,
        python=platform.python_version(),
        machine=measured_on,
        sections=sections,
        details=details,
    )
    if out is not None:
        write_results(results, out)
    return results


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), to keep it working in CI")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results (default: %(default)s)")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), default=[], help="run these sections")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    # A bench stopped with SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so its Azurite is stopped.
    signal.signal(signal.SIGTERM, _terminated)
    # Connection-pool and Settle warnings under 32 racing threads are expected; keep the table readable.
    logging.basicConfig(level=logging.ERROR)
    command = "python -m bench" + (" --smoke" if args.smoke else "")
    results = run(smoke=args.smoke, out=args.out, only=args.only, command=command)
    figures = [f for figs in results.sections.values() for f in figs]
    sys.stdout.write((render_markdown(figures) if args.markdown else render_table(figures)) + "\n")
    missed = sum(f.verdict == "missed" for f in figures)
    absent = sum(f.verdict == "missing" for f in figures)
    sys.stdout.write(
        f"\n{len(figures)} figures, {missed} missed, {absent} not measured; "
        f"{results.duration_s:.0f} s; results in {args.out}\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
