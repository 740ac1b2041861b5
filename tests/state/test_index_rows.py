"""A head write whose expiry-index row is already gone (removed under an older layout, or by hand) still
applies: the transaction's delete of that row is refused 404, the store drops it and sends the rest again."""

from __future__ import annotations

import pytest

from state import service
from state.schemas import KeyIn
from tests.state.conftest import State, new_key

pytestmark = pytest.mark.usefixtures("settle_tables")


def test_a_set_whose_lock_index_row_is_already_gone_still_records_its_outcome(call) -> None:
    # Given a locked record whose lock index row was removed behind the store's back
    state = State(call)
    key = new_key()
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    store = service.store()
    head = store.read_head(KeyIn.model_validate(key).record_key())
    assert head is not None
    store.table.delete_entity(head.entity["PartitionKey"], head.entity["LockIndexKey"])
    # When the holder records its outcome (the transaction deletes the index row the head names)
    answer = state.set(key, status="Processed", lockToken=token)
    # Then it is recorded once, and the record reads Processed
    assert answer.status == 200, answer.body
    assert state.get(key).json["status"] == "Processed"
    assert [r["version"] for r in state.history(key).json["items"]] == [2, 1]
