"""The smoke benchmark runs in-process against the test Azurite and writes every section's figures; the
benchmark's instruments can see what they measure (the counting proxy, the contention verdict, the
resolver floor's replay) and the docs are what the kept results render to."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest

from bench import report
from bench.__main__ import SECTIONS, run
from bench.contention import Race, _figure
from bench.harness import (
    Figure,
    HttpAnswer,
    interleaved,
    render_table,
    verdict_at_least,
    verdict_at_most,
    verdict_equal,
)
from bench.proxy import CountingProxy
from bench.resolver import FloorMismatch, Recorder, Replica
from common import runtime

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
    # And the seed's read-then-insert baseline ran in every race, and the run says where it ran
    contention = written["details"]["contention"]
    assert all(len(race["naive"]) >= 1 for race in contention.values())
    assert written["machine"]["cpus"] and written["command"]
    names = {f["name"] for figures in written["sections"].values() for f in figures}
    assert "cold start (first invocation)" in names
    # And the cold start's floor did, at the wire, exactly the storage work of Settle's first requests
    assert written["details"]["coldstart"]["equivalent_at_the_wire"] == ""
    wire = written["details"]["coldstart"]["wire"]
    assert wire["equivalent"].keys() == wire["settle"].keys() == {"first lock", "first message"}
    for phase, ours in wire["settle"].items():
        floor = wire["equivalent"][phase]
        for count in ("requests", "entities_written", "written_by_kind", "entities_read"):
            assert floor[count] == ours[count], (phase, count)
        assert 0.7 <= floor["bytes_sent"] / ours["bytes_sent"] <= 1.3, (phase, floor, ours)
    assert any("takeover" in n for n in names)
    catchup = {f["name"] for f in written["sections"]["catchup"]}
    assert any(n.startswith("index:") and n.endswith("live index rows") for n in catchup), catchup
    # And catch-up's own report was collected from the timer's path (drain), and says what storage says
    for kind, measured in written["details"]["catchup"].items():
        assert measured["catchup_reported"], kind
        assert measured["locks_failed_reported"] == measured["locks_failed"], kind


def test_the_verdict_rules_can_miss() -> None:
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


def _answer(acquired: bool, status: int = 200) -> HttpAnswer:
    body = {"acquired": acquired, "lockToken": "t" if acquired else None}
    return HttpAnswer(status, json.dumps(body).encode())


def test_a_takeover_race_misses_on_two_winners_none_a_refused_set_or_a_5xx() -> None:
    # Given one good race and, each on its own, the ways a race can go wrong
    good = Race([_answer(True), _answer(False)], set_status=200)
    bad = {
        "two winners": Race([_answer(True), _answer(True)]),
        "no winner": Race([_answer(False), _answer(False)]),
        "set refused": Race([_answer(True), _answer(False)], set_status=409),
        "a 5xx": Race([_answer(True), _answer(False, 503)], set_status=200),
        "a crash": Race([_answer(True), RuntimeError("boom")], set_status=200),
    }
    # Then the figure is met only when every race is good
    assert _figure("f", [good, good], [3, 4], context=False).verdict == "met"
    for why, race in bad.items():
        assert _figure("f", [good, race], [3, 4], context=False).verdict == "missed", why


def test_the_counting_proxy_counts_requests_of_every_thread_and_waits_for_them(
    azurite_connection: str,
) -> None:
    from azure.data.tables import TableServiceClient

    endpoint = next(
        p.split("=", 1)[1] for p in azurite_connection.split(";") if p.startswith("TableEndpoint")
    )
    with CountingProxy(endpoint.rsplit("/", 1)[0]) as proxy:
        service = TableServiceClient.from_connection_string(proxy.connection_string(azurite_connection))
        table = service.create_table_if_not_exists("proxy" + uuid.uuid4().hex[:10])
        start = proxy.count
        # Given a request on this thread and three from a thread that starts later
        table.upsert_entity({"PartitionKey": "p", "RowKey": "0"})

        def background() -> None:
            threading.Event().wait(0.3)
            for n in range(3):
                table.upsert_entity({"PartitionKey": "p", "RowKey": str(n + 1)})

        threading.Thread(target=background).start()
        # When the count waits for the traffic to drain
        proxy.wait_quiet(0.6)
        # Then all four were received
        assert [s.method for s in proxy.since(start)] == ["PATCH"] * 4


def test_the_resolver_floor_replays_the_recorded_calls_and_notices_a_divergence(settle_tables: str) -> None:
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceNotFoundError

    tables = runtime.tables()
    source = tables.table("floorsrc")
    recorder = Recorder()
    pk = uuid.uuid4().hex
    # Given recorded calls: an insert, a conditional replace with the ETag it returned, a read that misses
    with recorder.installed(), recorder.recording() as calls:
        created = source.create_entity({"PartitionKey": pk, "RowKey": "e", "n": 1})
        source.update_entity(
            {"PartitionKey": pk, "RowKey": "e", "n": 2},
            etag=created["etag"],
            match_condition=MatchConditions.IfNotModified,
        )
        with pytest.raises(ResourceNotFoundError):
            source.get_entity(pk, "missing")
    assert [c.method for c in calls] == ["create_entity", "update_entity", "get_entity"]
    # When they are replayed on a replica
    replica = Replica(tables.settings.table_name(""))
    replica.prepare(calls)
    replica.replay(calls)
    # Then the replica holds what the source holds (the conditional write used the replica's own ETag)
    assert dict(replica.client(source.table_name).get_entity(pk, "e")) == dict(source.get_entity(pk, "e"))
    # And replaying the insert again (a replica in another state) is a divergence, not a silent floor
    with pytest.raises(FloorMismatch):
        replica.replay(calls[:1])


def test_the_docs_are_what_the_kept_results_render_to() -> None:
    # The generated blocks of docs/benchmark.md and docs/reliability.md equal a fresh rendering of
    # docs/results/*.json: no figure in them was edited by hand.
    assert report.check() == []
