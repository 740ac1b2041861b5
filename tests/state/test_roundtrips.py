"""Table round trips per operation, counted by the azure-core policy every client carries.

Every request an operation causes runs on the calling thread or, sent beside it (``common.beside``: a
cold instance's signing-key read), on a thread that adopts the caller's tallies, so the per-thread tally
is complete. The documented figures are read from docs/tables.md and compared with
what is measured here, so the table cannot drift from the code.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from common import runtime
from common.clock import earliest_now, epoch_ms, utcnow
from common.roundtrips import ROUND_TRIPS
from common.tables import Tables
from state import service
from state.keys import EXPIRY_TABLE, LOCK_KIND, RETENTION_KIND, STATE_TABLE, bucket_of, partition_key
from state.store import StateStore
from tests.state.conftest import new_key

DOC = Path(__file__).resolve().parents[2] / "docs" / "tables.md"
PARTITION = partition_key(1, 4, 42)  # new_key()'s partition


def documented() -> dict[str, str]:
    """The state round-trip table of docs/tables.md: operation -> round trips."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Round trips per operation") : text.index("## Hand-off")]
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|", section, flags=re.MULTILINE)
    return {op.strip(): trips.strip() for op, trips in rows if op.strip() not in ("operation", "---")}


@pytest.fixture(autouse=True)
def warm(state):
    """This instance knows the signing key and has prepared the expiry minutes the tests lock into."""
    state.lock(new_key())
    store = service.store()
    now = epoch_ms(utcnow())
    for bucket in range(bucket_of(now) - 1, bucket_of(now + 1900_000) + 2):
        store.index.marker(PARTITION, LOCK_KIND, bucket)


def count(fn: Callable[[], object]) -> int:
    with ROUND_TRIPS.measure() as tally:
        fn()
    return tally.requests


def forget_heads() -> None:
    """Another instance: nothing known about any head (the index preparation stays)."""
    service.store()._hints.clear()


MEASURED: dict[str, Callable[..., int]] = {}


def case(label: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    def register(fn: Callable[..., int]) -> Callable[..., int]:
        MEASURED[label] = fn
        return fn

    return register


@case("exists, get")
def _exists_and_get(state, key) -> int:
    state.set(key, status="Processed")
    forget_heads()
    assert count(lambda: state.exists(key)) == count(lambda: state.get(key))
    return count(lambda: state.get(key))


@case("lock, new key")
def _lock_new(state, key) -> int:
    return count(lambda: state.lock(key))


@case("lock, refused")
def _lock_refused(state, key) -> int:
    state.lock(key)
    forget_heads()
    return count(lambda: state.lock(key))


@case("lock, refused, head known to this instance")
def _lock_refused_known(state, key) -> int:
    state.lock(key)
    return count(lambda: state.lock(key))


@case("lock, Failed/Expired/expired record known to this instance")
def _lock_again_known(state, key) -> int:
    token = state.lock(key).json["lockToken"]
    state.release(key, error="x", lockToken=token)
    return count(lambda: state.lock(key))


@case("lock, Failed/Expired/expired record new to this instance")
def _lock_again_cold(state, key) -> int:
    token = state.lock(key).json["lockToken"]
    state.release(key, error="x", lockToken=token)
    forget_heads()
    return count(lambda: state.lock(key))


@case("lock, take over an expired lock known to this instance")
def _takeover(state, key) -> int:
    until = datetime.fromisoformat(state.lock(key, lockSeconds=1).json["lockedUntil"].replace("Z", "+00:00"))
    # Expired for certain: by the earliest the storage clock may read, with a second to spare, since a later
    # reading of the storage clock may move that bound back (a fixed 2 s sleep was not enough on a loaded
    # machine, where the clock's bounds widen and the instance rightly confirms with a read first).
    deadline = time.monotonic() + 20
    while earliest_now() <= until + timedelta(seconds=1) and time.monotonic() < deadline:
        time.sleep(0.1)
    return count(lambda: state.lock(key))


@case("set / release with the lock token")
def _fenced(state, key) -> int:
    other = new_key()
    ta, tb = state.lock(key).json["lockToken"], state.lock(other).json["lockToken"]
    forget_heads()  # the token is enough
    assert count(lambda: state.release(other, error="x", lockToken=tb)) == 1
    return count(lambda: state.set(key, status="Processed", lockToken=ta))


@case("extend with the lock token")
def _extend(state, key) -> int:
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    return count(lambda: state.extend(key, lockToken=token, lockSeconds=120))


@case("set / release without a token")
def _unfenced(state, key) -> int:
    other = new_key()
    state.lock(key)
    state.lock(other)
    assert count(lambda: state.release(other, error="x")) == 2
    return count(lambda: state.set(key, status="Processed"))


@case("upsert, even when this instance knows the head")
def _upsert(state, key) -> int:
    state.set(key, status="Processed", data={"v": 1})
    assert count(lambda: state.upsert(key, data={"v": 2})) == 2
    forget_heads()
    return count(lambda: state.upsert(key, data={"v": 3}))


@case("history, query (one page)")
def _pages(state, key, call) -> int:
    state.set(key, status="Processed")
    query = {"tenantId": 1, "scopeId": 4, "entityId": 42, "pageSize": 5}
    assert count(lambda: call("state_query", query)) == 1
    return count(lambda: state.history(key))


@case("+ first lock of an instance in a partition and expiry minute")
def _first_in_minute(state, key) -> int:
    fresh = new_key(entityId=1000 + uuid.uuid4().int % 1_000_000)
    return count(lambda: state.lock(fresh)) - 1


@case("+ the same when another instance made the minute's level-1 row")
def _first_in_minute_second_instance(state, key) -> int:
    fresh = new_key(entityId=1000 + uuid.uuid4().int % 1_000_000)
    state.lock(fresh)
    other = StateStore(runtime.tables())  # another instance: its own marker, the level-1 row exists
    other.signer()
    pk = partition_key(1, 4, fresh["entityId"])
    bucket = bucket_of(epoch_ms(utcnow() + timedelta(seconds=1800)))
    return count(lambda: other.index.marker(pk, LOCK_KIND, bucket))


@case("+ first write with retention of an instance in a partition and deadline minute")
def _first_retention(state, key) -> int:
    fresh = new_key(entityId=1000 + uuid.uuid4().int % 1_000_000)
    handler = {"options": {"retentionSeconds": 7200}}
    return count(lambda: state.set(fresh, status="Processed", handler=handler)) - 2  # read + EGT


@case("+ first token an instance issues or checks")
def _first_token(state, key) -> int:
    token = state.lock(key).json["lockToken"]
    service.store()._signer = None  # a new instance: the key is read once
    return count(lambda: state.set(key, status="Processed", lockToken=token)) - 1


@case("+ first use of the recorded layouts by an instance")
def _first_layouts(state, key) -> int:
    from common.layouts import LAYOUT_TABLE, STATE, LayoutBook

    state.lock(key)  # the deployment's layout is recorded
    book = LayoutBook(runtime.tables())  # another instance: nothing read yet
    count(lambda: runtime.tables().table(LAYOUT_TABLE))  # the table is known to this process (row below)
    measured = count(lambda: book.recorded(STATE, lambda: [(1, 1)]))
    assert count(lambda: [book.recorded(STATE, lambda: [(1, 1)]) for _ in range(50)]) == 0  # kept
    return measured


@case("+ first use of Settle's tables by an instance")
def _first_tables(state, key) -> int:
    state.lock(key)  # the tables exist
    other = Tables(runtime.tables().settings)  # another instance: no table known yet
    try:
        with ROUND_TRIPS.measure() as tally:
            for name in (STATE_TABLE, EXPIRY_TABLE):
                other.table(name)
        return tally.requests
    finally:
        other.close()


@pytest.mark.parametrize("label", sorted(MEASURED))
def test_the_documented_round_trips_are_the_measured_ones(state, key, call, label):
    fn = MEASURED[label]
    args = {"state": state, "key": key, "call": call}
    measured = fn(**{name: args[name] for name in fn.__code__.co_varnames[: fn.__code__.co_argcount]})
    figure = documented().get(label)
    assert figure is not None, f"docs/tables.md has no row {label!r}"
    assert figure.lstrip("+") == str(measured), f"{label}: documented {figure}, measured {measured}"


def test_the_seed_pattern_exists_then_lock_then_set_is_three(state, key):
    state.set(key, status="Failed", error="earlier")
    forget_heads()
    assert count(lambda: state.exists(key)) == 1
    with ROUND_TRIPS.measure() as tally:
        token = state.lock(key).json["lockToken"]
        state.set(key, status="Processed", lockToken=token)
    assert tally.requests == 2


def test_catch_up_costs_what_the_table_says(state, fresh_tables):
    keys = [new_key() for _ in range(3)]
    for k in keys:
        state.lock(k, lockSeconds=1)
    # and 2 locks of the same minutes that finished (ADR-0021: their entries stay until the minute closes)
    for k in [new_key() for _ in range(2)]:
        state.set(k, status="Processed", lockToken=state.lock(k, lockSeconds=1).json["lockToken"])
    now = utcnow() + timedelta(seconds=2)
    with ROUND_TRIPS.measure() as tally:
        result = service.catchup().run(now=now)
    assert result.locks_failed == 3 and result.locks_ended == 2 and result.minutes_closed == 0
    assert tally.requests == 2 + 2 * result.minutes_visited + 5 + 3
    documented_as = "2 + 2 per minute visited + 1 per due lock of those minutes + 1 per expired lock"
    assert documented_as in documented()["catch-up"]


def test_retention_markers_are_prepared_like_lock_markers(state):
    store = service.store()
    fresh = partition_key(1, 4, 2_000_000 + uuid.uuid4().int % 1_000_000)
    bucket = bucket_of(epoch_ms(utcnow()))
    assert count(lambda: store.index.marker(fresh, RETENTION_KIND, bucket)) == 2
    assert count(lambda: store.index.marker(fresh, RETENTION_KIND, bucket)) == 0
