"""The smoke benchmark runs in-process against the test Azurite and writes every section's figures."""

from __future__ import annotations

import json
from typing import Any

from bench.__main__ import SECTIONS, run
from bench.harness import Figure, interleaved, render_table, verdict_at_least, verdict_at_most, verdict_equal

COLUMNS = {"section", "name", "settle", "baseline", "ratio", "target", "verdict", "unit", "note"}


def test_smoke_run_writes_every_section(tmp_path, azurite_connection: str, functions: dict[str, Any]) -> None:
    # Given the test session's Azurite and the app's indexed functions
    out = tmp_path / "results.json"

    # When the smoke benchmark runs in-process
    results = run(smoke=True, out=out, connection=azurite_connection, functions=functions)

    # Then the JSON holds every section, each with figures carrying the table's columns
    written = json.loads(out.read_text())
    assert written["smoke"] is True
    assert set(written["sections"]) == set(SECTIONS)
    for name, figures in written["sections"].items():
        assert figures, f"section {name} has no figures"
        for figure in figures:
            assert set(figure) == COLUMNS
            # A section that crashed is a benchmark bug (missing Settle code is reported per figure instead)
            assert not figure["name"].endswith("(section failed)"), figure
    assert results.sections.keys() == written["sections"].keys()
    # And the seed's read-then-insert baseline ran at every K
    contention = written["details"]["contention"]
    assert all(len(race["naive"]) >= 1 for race in contention.values())


def test_a_lock_race_other_than_one_winner_is_a_missed_target() -> None:
    # Given the verdict rules used by the table
    # When values are judged against their targets
    # Then equality, upper and lower bounds decide met / missed, and no value is "missing"
    assert verdict_equal(1, 1) == "met"
    assert verdict_equal(2, 1) == "missed"
    assert verdict_at_most(1.31, 1.3) == "missed"
    assert verdict_at_most(1.3, 1.3) == "met"
    assert verdict_at_least(0.49, 0.5) == "missed"
    assert verdict_at_most(None, 1.0) == "missing"


def test_interleaved_timing_alternates_operations_call_by_call() -> None:
    # Given two operations that record the order they ran in
    calls: list[str] = []
    ops = {name: (lambda name=name: lambda: calls.append(name)) for name in ("a", "b")}

    # When they are timed interleaved for two rounds of three calls
    per_round = interleaved(ops, rounds=2, reps=3)

    # Then each round has one median per operation and neither always goes first
    assert {k: len(v) for k, v in per_round.items()} == {"a": 2, "b": 2}
    firsts = calls[0::2]
    assert set(firsts) == {"a", "b"}
    assert len(calls) == 12


def test_table_shows_every_column_and_flags_misses() -> None:
    # Given a met and a missed figure
    figures = [
        Figure(section="s", name="ok", settle=1, baseline=1, ratio=1, target="<= 1", verdict="met"),
        Figure(section="s", name="slow", settle=2, baseline=1, ratio=2, target="<= 1.3x", verdict="missed"),
    ]

    # When rendered
    text = render_table(figures)

    # Then the header names the columns and the miss stands out
    assert text.splitlines()[0].split() == ["figure", "Settle", "baseline", "ratio", "target", "verdict"]
    assert "MISSED" in text
