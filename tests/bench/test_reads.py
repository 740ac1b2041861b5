"""Every operator read keeps its documented request count at one busy endpoint (bench/reads.py, issue 46):
1,200 events seeded through the production projection rules in one partition, then each read called through
its HTTP function behind the counting proxy. A read that starts scanning the partition (about 7,500 rows
here: a scan is at least 8 pages of 1,000) fails here until ``bench.reads.READS`` says why it may."""

from __future__ import annotations

from typing import Any

from bench import reads
from bench.harness import Sizes, environment
from bench.proxy import entities_in

EVENTS = 1_200
PAGE = 10  # every status has a second page at 1,200 events (2% of them is 24)


def test_each_operator_read_costs_its_documented_requests_at_one_busy_endpoint(
    azurite_connection: str, functions: dict[str, Any]
) -> None:
    # Given one endpoint holding 1,200 events of the benchmark's mix, in one partition
    with environment(Sizes.smoke(), smoke=True, connection=azurite_connection, functions=functions) as env:
        # When each operator read runs alone behind the counting proxy
        seeded, measured = reads.seeded_and_measured(env, EVENTS, page=PAGE, quiet_s=0.1)

    # Then the seed is the mix (its counts were checked against it before any read)
    assert seeded.events == EVENTS and seeded.overdue == 36 and seeded.failed == 84
    # And every read was measured, each costing exactly its documented requests
    assert measured.why_not == {}
    assert {r.name: measured.costs[r.name].requests for r in reads.READS} == {
        r.name: r.requests(seeded) for r in reads.READS
    }
    # And none read more than a page of each status's range, the open events' keys (the open counts,
    # ADR-0022), a count's keys and the tallies: never the closed events' rows
    counts = seeded.expected_counts()
    open_events = sum(counts[s] for s in ("Pending", "Deferred", "Failed", "DeadLettered", "Unsupported"))
    assert open_events < counts["Completed"] / 2  # the closed events are the bulk a scan would read
    for read in reads.READS:
        cost = measured.costs[read.name]
        assert cost.read <= 7 * (PAGE + 1) + open_events + seeded.overdue + 4, (read.name, cost.as_dict())
        assert cost.writes == 0, (read.name, cost.as_dict())


def test_the_proxy_counts_the_rows_of_a_keys_only_answer() -> None:
    # Given a count's answer (only RowKey selected: its rows carry no PartitionKey), a keys-only point read
    # and a Query Tables answer
    count = b'{"value": [{"odata.etag": "W/1", "RowKey": "ex|a"}, {"odata.etag": "W/2", "RowKey": "ex|b"}]}'
    point = b'{"odata.metadata": "m", "odata.etag": "W/3", "RowKey": "ct|0"}'
    tables = b'{"value": [{"TableName": "hoevents"}]}'

    # When the proxy counts the entities read, then each row is one entity, and a table is none
    assert entities_in("GET", 200, count) == 2
    assert entities_in("GET", 200, point) == 1
    assert entities_in("GET", 200, tables) == 0
