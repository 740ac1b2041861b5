"""One record per key across a layout change, whatever a write's delay (common/fence.py, ADR-0024).

Writers that route by different layouts (a copy that is behind a switch, a paused process) race on one new
key against Azurite, with their requests held in the table client's pipeline at chosen points (a slow
network, a resend, a paused instance): never two records of a key, never two holders of its lock. A
property test draws the layouts, the holds and their lengths; the examples pin the interleavings that broke
before the fence (a write decided before a switch landing after a writer of the new layout)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from azure.core.pipeline import PipelineRequest, PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.fence import LayoutBehind
from common.settings import TableSettings
from common.tables import Tables
from state.keys import STATE_TABLE, Layout, node_partition_range
from state.lifecycle import LockOutcome, WriteContext
from state.model import RecordKey, Scope, Status
from state.store import StateStore

# The layouts of one deployment, oldest first: 1 shard, then 4, back to 1 (a return), then 2.
ERAS = [
    Layout(1),
    Layout.of_eras((4, 1), [(1, 1)]),
    Layout.of_eras((1, 1), [(1, 1), (4, 1)]),
    Layout.of_eras((2, 1), [(1, 1), (4, 1), (1, 1)]),
]
TENANT, SCOPE = 9, Scope(4)
CTX = WriteContext()


class Hold(HTTPPolicy[Any, Any]):
    """Holds this store's requests in its pipeline: ``pause(seconds)`` delays every request by a drawn
    time; ``arm(predicate)`` holds the next matching request until ``release()`` (a write in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []
        self._predicate: Callable[[Any], bool] | None = None
        self.entered = threading.Event()
        self._release = threading.Event()

    def arm(self, predicate: Callable[[Any], bool]) -> None:
        self.entered.clear()
        self._release.clear()
        self._predicate = predicate

    def release(self) -> None:
        self._release.set()

    def send(self, request: PipelineRequest[Any]) -> PipelineResponse[Any, Any]:
        predicate = self._predicate
        if predicate is not None and predicate(request.http_request):
            self._predicate = None
            self.entered.set()
            assert self._release.wait(20), "a held request was never released"
        elif self.delays:
            time.sleep(self.delays.pop(0))
        return self.next.send(request)


def is_write(request: Any) -> bool:
    """A write of the state table's rows (a transaction, an insert, an update or a delete)."""
    url = str(request.url)
    return request.method in ("POST", "PUT", "PATCH", "MERGE", "DELETE") and (
        "$batch" in url or f"{STATE_TABLE}" in url.split("?")[0].rsplit("/", 1)[-1]
    )


def writer(era: int, hold: Hold | None = None) -> StateStore:
    tables = Tables(TableSettings.from_env(), policies=[hold] if hold is not None else [])
    return StateStore(tables, layout=ERAS[era])


def rows_of(entity: int, item: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(heads, claims) of one key in every partition of its node, straight from storage."""
    low, high = node_partition_range(TENANT, SCOPE, entity)
    table = writer(0)._tables.table(STATE_TABLE)
    rows = table.query_entities(
        "PartitionKey ge @low and PartitionKey lt @high", parameters={"low": low, "high": high}
    )
    mine = [dict(r) for r in rows if str(r["RowKey"]).endswith("|c") and f"|{item}|" in str(r["RowKey"])]
    return [r for r in mine if "MovedTo" not in r], [r for r in mine if "MovedTo" in r]


def lock_or_behind(store: StateStore, key: RecordKey) -> LockOutcome | None:
    """The lock's answer; None when the store's layout was behind (a 503: the caller retries)."""
    try:
        return store.lock(key, CTX, 60)
    except LayoutBehind:
        return None


def new_key(entity: int) -> RecordKey:
    return RecordKey(TENANT, SCOPE, entity, "invoice", f"INV-{uuid.uuid4().hex[:10]}")


def test_a_lock_decided_before_a_switch_and_landing_after_a_new_writer_makes_no_second_record(
    fresh_tables: str,
) -> None:
    # Given instance B still routing by S = 1, its lock of a new key decided and its write in flight
    hold = Hold()
    late, current = writer(0, hold), writer(1)
    key = new_key(8101)
    late.lock(new_key(8101), CTX, 60)  # its signing key and expiry minute are ready: the next is one write
    hold.arm(is_write)
    answers: list[LockOutcome | None] = []
    thread = threading.Thread(target=lambda: answers.append(lock_or_behind(late, key)))
    thread.start()
    assert hold.entered.wait(10)
    # When instance A, routing by S = 4, locks the same key, and only then B's write lands
    first = current.lock(key, CTX, 60)
    hold.release()
    thread.join(20)
    # Then A holds the lock, B does not (it is told to retry, its layout behind), and the key has one record
    assert first.acquired
    assert answers == [None]
    heads, claims = rows_of(8101, key.item_key)
    assert [h["PartitionKey"] for h in heads] == [ERAS[1].partition(key)]
    assert [(c["PartitionKey"], c["MovedTo"]) for c in claims] == [
        (ERAS[0].partition(key), heads[0]["PartitionKey"])
    ]
    # And B, once it reads the layout again, finds A's lock (refused), and so does every reader
    again = writer(1).lock(key, CTX, 60)
    assert not again.acquired and again.status is Status.PROCESSING
    assert late.read_head(key) is not None  # a reader behind the switch follows the claim


def test_a_new_writers_fence_held_until_an_earlier_layouts_lock_lands_finds_that_record(
    fresh_tables: str,
) -> None:
    # Given instance A, routing by S = 4, whose claim in the earlier partition is in flight
    hold = Hold()
    current, late = writer(1, hold), writer(0)
    key = new_key(8102)
    current.lock(new_key(8102), CTX, 60)
    hold.arm(is_write)
    answers: list[LockOutcome | None] = []
    thread = threading.Thread(target=lambda: answers.append(lock_or_behind(current, key)))
    thread.start()
    assert hold.entered.wait(10)
    # When B, routing by S = 1, creates the key first, then A's claim lands
    assert late.lock(key, CTX, 60).acquired
    hold.release()
    thread.join(20)
    # Then A found B's record and was refused: one record, in the earlier layout's partition
    assert len(answers) == 1 and answers[0] is not None and not answers[0].acquired
    heads, claims = rows_of(8102, key.item_key)
    assert [h["PartitionKey"] for h in heads] == [ERAS[0].partition(key)] and claims == []


def test_a_return_to_an_earlier_shard_count_never_forgets_a_processed_key(fresh_tables: str) -> None:
    # Given instance A under S = 1 that asked for a key (absent: remembered as a hint)
    a, b = writer(0), writer(1)
    key = new_key(8103)
    assert a.read_head(key) is None
    # When B, under S = 4, locks the key and sets it Processed
    token = b.lock(key, CTX, 60).token
    assert token is not None
    b.record(
        key, CTX, status=Status.PROCESSED, envelope_props=None, substatus=None, error=None, token_text=token
    )
    # And the layout returns to S = 1 (1 -> 4 -> 1), A following it
    a._layouts._fixed = ERAS[2]
    # Then A sees the key Processed and refuses a second lock, and so does a fresh instance of S = 1 again
    refused = a.lock(key, CTX, 60)
    assert not refused.acquired and refused.status is Status.PROCESSED
    head = writer(2).read_head(key)
    assert head is not None and head.status is Status.PROCESSED
    heads, _ = rows_of(8103, key.item_key)
    assert len(heads) == 1


def test_a_claim_left_by_a_crashed_writer_of_a_later_layout_is_cleared_by_a_return(fresh_tables: str) -> None:
    # Given a writer under S = 4 that fenced a key in S = 1's partition and died before creating it
    key = new_key(8104)
    crashed = writer(1)
    fence = crashed.fence_of(key)
    assert fence is not None and fence.claim_earlier(crashed.table, f"invoice|{key.item_key}|||c") is None
    # When the layout returns to S = 1 and a writer locks the key
    outcome = writer(2).lock(key, CTX, 60)
    # Then it is acquired in S = 1's partition and the S = 4 partition is fenced against the dead writer
    assert outcome.acquired
    heads, claims = rows_of(8104, key.item_key)
    assert [h["PartitionKey"] for h in heads] == [ERAS[2].partition(key)]
    assert [(c["PartitionKey"], c["MovedTo"]) for c in claims] == [
        (ERAS[1].partition(key), ERAS[2].partition(key))
    ]
    # And the dead writer's layout, were it to come back, is told it is behind rather than twin the key
    assert lock_or_behind(writer(1), key) is not None  # it finds the record through the claim
    assert len(rows_of(8104, key.item_key)[0]) == 1


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    eras=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    delays=st.lists(
        st.lists(st.sampled_from([0.0, 0.0, 0.003, 0.01, 0.04]), max_size=8), min_size=2, max_size=2
    ),
)
def test_two_writers_of_any_two_layouts_racing_on_a_new_key_make_one_record_and_one_holder(
    fresh_tables: str, eras: tuple[int, int], delays: list[list[float]]
) -> None:
    holds = [Hold(), Hold()]
    stores = [writer(era, hold) for era, hold in zip(eras, holds, strict=True)]
    key = new_key(8200 + sum(eras))
    for hold, drawn in zip(holds, delays, strict=True):
        hold.delays = list(drawn)
    answers: list[LockOutcome | None] = [None, None]
    start = threading.Barrier(2)

    def run(n: int) -> None:
        start.wait()
        answer = lock_or_behind(stores[n], key)
        if answer is None:  # told its layout is behind: it reads the newest one and asks again
            answer = lock_or_behind(writer(3), key)
        answers[n] = answer

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    heads, _ = rows_of(8200 + sum(eras), key.item_key)
    assert len(heads) == 1, heads
    assert sum(1 for a in answers if a is not None and a.acquired) == 1, answers
    # Every layout finds that one record
    for era in range(4):
        found = writer(era).read_head(key)
        assert found is not None and found.entity["PartitionKey"] == heads[0]["PartitionKey"]
