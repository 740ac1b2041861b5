"""``make mutation``: do the unit tier's tests notice when a rule is broken?

mutmut (configured in ``pyproject.toml``, ``[tool.mutmut]``) copies the app into ``mutants/``, makes small
changes ("mutants") to the cores and the services' loops, and runs, for each mutant, the unit-tier tests
that reach the changed function. A mutant is killed when a test fails. This runner picks what is
mutated (every function of the cores; in the services only the functions that decide: the read-decide-
write loops), runs mutmut, and prints the score and the mutants that survived. Not part of CI: a full
run takes tens of minutes. ``docs/mutation.md`` records the last run and why each survivor is harmless.

    python -m devtools.mutation               # run (2 processes), then report
    python -m devtools.mutation --report      # report the last run only
    python -m devtools.mutation --again       # run again only the mutants the last run did not kill
    python -m devtools.mutation --jobs 1 'handoff.projection.guard.*'   # only these (mutmut's names, globs)
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# mutmut names a mutant ``module.x_function__mutmut_N`` or ``module.xǁClassǁmethod__mutmut_N``.
CORES = (
    "state.lifecycle.*",
    "handoff.settlement.claims.*",
    "handoff.receive.leases.*",
    "handoff.settlement.unconfirmed_rules.*",
    "handoff.projection.rules.*",
    "handoff.projection.guard.*",
    "handoff.projection.status_map.*",
    "common.fence.*",
)
# The services' decision points: where a loop reads, asks its core, submits and decides again.
LOOPS = (
    # the lock: "a refusal is always confirmed by storage", then decide, write, re-decide on a refusal
    "state.store.xǁStateStoreǁ_lock__mutmut_*",
    # the fenced write (a token's set, upsert, release, extension) and its replay of a lost answer
    "state.store.xǁStateStoreǁ_fenced__mutmut_*",
    "state.store.xǁStateStoreǁ_concluded_by__mutmut_*",
    "state.store.xǁStateStoreǁ_check_token__mutmut_*",
    # the hand-off's settlement: coordinates check, the claim loop, the send deadline
    "handoff.settlement.settler.xǁSettlementServiceǁ_check__mutmut_*",
    "handoff.settlement.settler.xǁSettlementServiceǁ_complete_coordinates__mutmut_*",
    "handoff.settlement.settler.xǁSettlementServiceǁ_claim__mutmut_*",
    "handoff.settlement.settler.xǁSettlementServiceǁ_held_queue_row__mutmut_*",
    "handoff.settlement.settler.xǁSettlementServiceǁ_send_claimed__mutmut_*",
)
TARGETS = CORES + LOOPS

KILLED = {1, 3, 36}  # a test failed, pytest's internal error, a timeout (an endless loop)
SURVIVED = 0
NO_TESTS = {5, 33}


def _results() -> dict[str, int | None]:
    """Every mutant's exit code from the last run (mutmut's ``mutants/<file>.py.meta``)."""
    found: dict[str, int | None] = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        found.update(json.loads(meta.read_text("utf-8")).get("exit_code_by_key", {}))
    return found


def _selected(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def report(patterns: tuple[str, ...] = TARGETS) -> int:
    """Print the score of the mutants ``patterns`` select and list those not killed; 1 when none ran."""
    results = {k: v for k, v in _results().items() if _selected(k, patterns)}
    checked = {k: v for k, v in results.items() if v is not None}
    if not checked:
        print("No mutant was checked: run `make mutation` first.")
        return 1
    killed = sum(1 for v in checked.values() if v in KILLED)
    kinds = Counter(
        "killed" if v in KILLED else "survived" if v == SURVIVED else f"exit {v}" for v in checked.values()
    )
    print(
        f"mutants checked: {len(checked)} of {len(results)}; "
        + ", ".join(f"{n} {k}" for k, n in kinds.items())
    )
    print(f"score: {killed}/{len(checked)} = {100 * killed / len(checked):.1f} % killed")
    for name, code in sorted(checked.items()):
        if code not in KILLED:
            status = (
                "survived"
                if code == SURVIVED
                else "no test reaches it"
                if code in NO_TESTS
                else f"exit {code}"
            )
            print(f"  {status}: {name}   (see: python -m mutmut show '{name}')")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.mutation", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="processes (the machine is shared: 1-2)")
    parser.add_argument("--report", action="store_true", help="only report the last run")
    parser.add_argument("--again", action="store_true", help="run only the mutants the last run did not kill")
    parser.add_argument("patterns", nargs="*", help="mutmut mutant names or globs (default: all targets)")
    args = parser.parse_args(argv)
    patterns = tuple(args.patterns) or TARGETS
    if not args.report:
        chosen = patterns
        if args.again:
            last = _results()
            chosen = tuple(k for k, v in sorted(last.items()) if _selected(k, patterns) and v not in KILLED)
            if not chosen:
                return report(patterns)
        command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.jobs), *chosen]
        subprocess.run(command, cwd=ROOT, check=False)
    return report(patterns)


if __name__ == "__main__":
    sys.exit(main())
