"""The hand-off scale-out figure (bench/handoff_scaleout.py): its verdict is computed from what was measured
and misses when the throughput does not scale, and the bench really drives the app's resolver through the
throttle (a short run, read back straight from Azurite)."""

from __future__ import annotations

import pytest

from bench import handoff_scaleout as bench
from bench.throttle import Budget
from handoff.messages.contract import ResolutionStatus
from handoff.storage import keys
from handoff.storage.records import EventRow

PARTITION, ACCOUNT = 10.0, 100.0  # Budget.scaled(): Azure's targets / 200


def _sample(shards: int, multiple: float, *, requests: int = 400, refused: int = 200) -> bench.Sample:
    cost = 39.0
    return bench.Sample(
        shards=shards,
        sessions=bench.sessions_for(shards),
        prefix="t",
        endpoint="E",
        window_s=30.0,
        handoffs_per_s=multiple * PARTITION / cost,
        multiple=multiple,
        entities_per_s=multiple * PARTITION,
        partition_rates=(PARTITION,) * shards,
        requests=requests,
        refused_503=refused - refused // 10,
        refused_500=refused // 10,
        refused_scope={"partition": refused},
        p99_handoff_s=9.0,
        rescheduled=refused,
        poisoned=0,
        waiting_share=0.9,
        cpu_cores=0.3,
    )


@pytest.mark.parametrize(
    ("shards", "multiple", "verdict"),
    [
        (1, 0.97, "met"),
        (1, 0.29, "missed"),  # the budget spent on reads of messages refused afterwards
        (4, 3.9, "met"),
        (4, 1.1, "missed"),  # the first version's run: S = 4 no faster than S = 1
        (4, 3.19, "missed"),  # just under 0.8 x 4
        (16, 9.5, "met"),  # the account's budget (10 partitions' worth) is the ceiling: 8x
        (16, 7.9, "missed"),
    ],
)
def test_the_verdict_is_computed_from_the_multiple(shards: int, multiple: float, verdict: str) -> None:
    judged = bench.judge(shards, multiple, 0.5, PARTITION, ACCOUNT)
    assert judged.verdict == verdict
    assert judged.target == pytest.approx(0.8 * min(shards, ACCOUNT / PARTITION))
    figure = bench.figure(_sample(shards, multiple), 39.0, PARTITION, ACCOUNT)
    assert figure.verdict == verdict and figure.settle == pytest.approx(multiple)
    assert f"bound: {judged.bound}" in figure.note


def test_throughput_that_does_not_scale_misses_and_names_its_bound() -> None:
    # Given the figures of a run where adding shards added nothing (the first version of this bench)
    runs = {1: _sample(1, 0.41), 4: _sample(4, 0.49), 16: _sample(16, 0.5, refused=0)}
    figures = {s: bench.figure(sample, 39.0, PARTITION, ACCOUNT) for s, sample in runs.items()}
    # Then every S misses: the unsharded one below 0.8, S = 4 below 3.2, S = 16 below 8
    assert [f.verdict for f in figures.values()] == ["missed", "missed", "missed"]
    # And the bound says what held each back: the partitions' budgets (storage refused), the account's
    # ceiling never reached, and this machine where storage refused nothing
    assert "bound: 1 partition budget;" in figures[1].note
    assert "bound: 4 partition budgets;" in figures[4].note
    assert "bound: this machine (storage refused 0.0% of requests)" in figures[16].note
    # While a run that reached the account's budget at S = 16 is met, bounded by the account
    assert bench.judge(16, 8.2, 0.4, PARTITION, ACCOUNT).bound.startswith("account budget")


def test_the_bench_drives_the_resolver_through_the_throttle(azurite_connection: str) -> None:
    from azure.data.tables import TableServiceClient

    endpoint = next(
        p.split("=", 1)[1] for p in azurite_connection.split(";") if p.startswith("TableEndpoint")
    ).rsplit("/", 1)[0]
    cost = bench.handoff_cost(azurite_connection, endpoint, handoffs=1)
    # Given the scaled budget (one hand-off costs about 4 s of one partition's) and 8 sessions on 2 shards
    budget = Budget.scaled()
    sample = bench.measure(
        azurite_connection, endpoint, 2, seconds=2.0, sessions=8, cost=cost, budget=budget, warmup_s=0.5
    )
    # Then storage refused requests as Azure throttles (503 ServerBusy and 500 OperationTimedOut), the
    # resolver rescheduled them, and messages were still projected
    assert sample.refused_503 > 0 and sample.requests > sample.refused_503
    assert budget.refusals() >= budget.timeout_every  # so at least one refusal was a 500
    assert sample.rescheduled > 0 and sample.handoffs_per_s > 0 and sample.poisoned == 0
    assert 0 < sample.multiple <= 2 * 1.5  # two partitions' budgets (plus the burst) at most
    # And what the bench counted is in storage, read straight from Azurite (no proxy, no throttle): the
    # endpoint's rows are in its two shards only, one history row per message projected (at least those
    # the window counted) and every event row at the status of its last projected message
    table = TableServiceClient.from_connection_string(azurite_connection).get_table_client(
        sample.prefix + keys.EVENTS_TABLE
    )
    stored = list(table.query_entities("RowKey ge 'ev|' and RowKey lt 'ev}'"))
    assert {str(e["PartitionKey"]) for e in stored} == {
        f"{sample.endpoint}~002-000",
        f"{sample.endpoint}~002-001",
    }
    history = [e for e in stored if "|m|" in str(e["RowKey"])]
    assert len(history) >= round(sample.handoffs_per_s * 4 * sample.window_s) > 0
    rows = [EventRow.from_entity(e) for e in stored if str(e["RowKey"]).endswith("|e")]
    assert {r.resolution_status for r in rows} >= {ResolutionStatus.Pending}
    assert sum(r.history_count for r in rows) == len(history)
