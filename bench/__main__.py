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
import shutil
import signal
import subprocess
import sys
import tempfile
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
    costs,
    find,
    handoff_scaleout,
    keeper,
    latency,
    machine,
    reads,
    resolver,
    roundtrips,
    scaleout,
)
from bench.harness import (
    DEFAULT_OUT,
    ROOT,
    Environment,
    Figure,
    Results,
    Sizes,
    environment,
    log,
    missing,
    render_markdown,
    render_table,
    section_times,
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
    "find": find.run,
    "costs": costs.run,
    "latency": latency.run,
    "contention": contention.run,
    "catchup": catchup.run,
    "resolver": resolver.run,
    "coldstart": coldstart.run,
    "keeper": keeper.run,
    "agents": agents.run,
    "scaleout": _scaleout,
    "reads": reads.run,
}

# Sections bound by the wall clock and nearly idle (the keeper's simulated hour is two minutes of sleeping
# between lock extensions) run in a process of their own, with their own Azurite, beside the others: two
# minutes less of make bench (make bench must stay under 10 minutes). Their figures are counts, not timings.
BESIDE = ("keeper",)


def _start_beside(names: Sequence[str], smoke: bool) -> tuple[subprocess.Popen[bytes], Path]:
    out = Path(tempfile.mkdtemp(prefix="settle-bench-")) / "beside.json"
    command = [sys.executable, "-m", "bench", "--only", *names, "--out", str(out), "--alone"]
    log(f"{', '.join(names)} ... (its own process and Azurite, beside the other sections)")
    return subprocess.Popen(
        command + (["--smoke"] if smoke else []), cwd=ROOT, stdout=subprocess.DEVNULL
    ), out


def _join_beside(child: subprocess.Popen[bytes], out: Path, timeout_s: float) -> Results | None:
    """The beside process's results (None when it failed: its sections are then reported missing)."""
    try:
        code = child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    try:
        if code != 0 or not out.exists():
            return None
        return Results.model_validate_json(out.read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def _run_sections(
    env: Environment, names: Sequence[str], sections: dict[str, list[Figure]], section_s: dict[str, float]
) -> None:
    for name in names:
        section = SECTIONS[name]
        log(f"{name} ...")
        t0 = time.perf_counter()
        try:
            env.use_fresh_prefix()
            sections[name] = section(env)
        except Exception as exc:
            # One section failing (usually the code under test) must not hide the others.
            traceback.print_exc(file=sys.stderr)
            sections[name] = [missing(name, f"{name} (section failed)", "", f"{type(exc).__name__}: {exc}")]
        section_s[name] = round(time.perf_counter() - t0, 1)
        log(f"{name} done in {section_s[name]:.1f} s")


def run(
    *,
    smoke: bool,
    out: Path | None = DEFAULT_OUT,
    only: Sequence[str] = (),
    connection: str | None = None,
    functions: Mapping[str, Any] | None = None,
    command: str = "python -m bench",
    alone: bool = False,
) -> Results:
    """Run the benchmark; ``connection``/``functions`` let a test reuse its Azurite and indexed app."""
    sizes = Sizes.smoke() if smoke else Sizes.full()
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    measured_on = machine.describe()
    sections: dict[str, list[Figure]] = {}
    section_s: dict[str, float] = {}
    chosen = [name for name in SECTIONS if not only or name in only]
    beside = (
        [n for n in BESIDE if n in chosen] if connection is None and len(chosen) > 1 and not alone else []
    )
    child = _start_beside(beside, smoke) if beside else None
    try:
        with environment(sizes, smoke=smoke, connection=connection, functions=functions) as env:
            _run_sections(env, [n for n in chosen if n not in beside], sections, section_s)
            details = env.details
        if child is not None:
            t0 = time.perf_counter()
            joined = _join_beside(child[0], child[1], timeout_s=900)
            log(f"{', '.join(beside)}: waited {time.perf_counter() - t0:.1f} s for the process beside")
            for name in beside:
                if joined is not None and name in joined.sections:
                    sections[name] = joined.sections[name]
                    section_s[name] = joined.section_s.get(name, 0.0)
                    if name in joined.details:
                        details[name] = joined.details[name]
                else:
                    sections[name] = [missing(name, f"{name} (section failed)", "", "its process failed")]
    finally:
        if child is not None and child[0].poll() is None:  # stopped early (SIGTERM): stop it and its Azurite
            child[0].terminate()
            child[0].wait(timeout=60)
    sections = {name: sections[name] for name in SECTIONS if name in sections}  # the usual order
    section_s = {name: section_s[name] for name in SECTIONS if name in section_s}
    if beside:
        details["beside"] = {"sections": beside, "note": "ran in their own process, beside the others"}
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
        section_s=section_s,
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
    parser.add_argument("--alone", action="store_true", help="run every section here (none beside)")
    args = parser.parse_args(argv)
    # A bench stopped with SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so its Azurite is stopped.
    signal.signal(signal.SIGTERM, _terminated)
    # Connection-pool and Settle warnings under 32 racing threads are expected; keep the table readable.
    logging.basicConfig(level=logging.ERROR)
    command = "python -m bench" + (" --smoke" if args.smoke else "")
    results = run(smoke=args.smoke, out=args.out, only=args.only, command=command, alone=args.alone)
    figures = [f for figs in results.sections.values() for f in figs]
    sys.stdout.write((render_markdown(figures) if args.markdown else render_table(figures)) + "\n")
    missed = sum(f.verdict == "missed" for f in figures)
    absent = sum(f.verdict == "missing" for f in figures)
    noisy = sum(f.verdict == "within noise" for f in figures)
    sys.stdout.write(
        f"\n{len(figures)} figures, {missed} missed, {noisy} within noise, {absent} not measured; "
        f"{results.duration_s:.0f} s; results in {args.out}\n"
        f"section times: {section_times(results)}\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
