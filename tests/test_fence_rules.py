"""The key fence's rules (``common.fence``, ADR-0020), one example each, on the in-memory table: a creation
claims the key in every earlier partition, a record found there is the key's record, a claim of a newer
layout means this process is behind, an older layout's claim is replaced, and one at home is cleared."""

from __future__ import annotations

from typing import Any

import pytest
from azure.data.tables import UpdateMode

from common.fence import ERA, MOVED_TO, Fence, LayoutBehind, claim_row, era_of, is_claim, moved_to
from tests.support.memory_table import MemoryTables

RK = "invoice|INV-1"
HOME, EARLY, EARLIER = "p-home", "p-early", "p-earlier"


class Forgotten:
    def __init__(self) -> None:
        self.times = 0

    def __call__(self) -> None:
        self.times += 1


def fence(era: int = 2, *, earlier: tuple[str, ...] = (EARLY, EARLIER)) -> tuple[Fence, Forgotten]:
    forget = Forgotten()
    return Fence("state", HOME, earlier, era, forget), forget


def table() -> Any:
    return MemoryTables().table("state")


def row(t: Any, pk: str) -> dict[str, Any] | None:
    found = t.rows.get((pk, RK))
    return (
        None
        if found is None
        else {k: found[k] for k in ("PartitionKey", "RowKey", MOVED_TO, ERA) if k in found}
    )


def test_a_claim_row_names_where_the_key_lives_and_by_which_layout() -> None:
    claim = claim_row(EARLY, RK, HOME, 2)

    assert claim == {"PartitionKey": EARLY, "RowKey": RK, MOVED_TO: HOME, ERA: 2}
    assert is_claim(claim) and moved_to(claim) == HOME and era_of(claim) == 2
    assert not is_claim({"PartitionKey": EARLY, "RowKey": RK, "Status": 1})
    assert not is_claim(None)
    assert era_of({MOVED_TO: HOME}) == 0  # a claim written before eras were recorded


def test_a_creation_claims_the_key_in_every_earlier_partition() -> None:
    t, (f, forget) = table(), fence()

    assert f.claim_earlier(t, RK) is None

    for pk in (EARLY, EARLIER):
        assert row(t, pk) == claim_row(pk, RK, HOME, 2)
    assert row(t, HOME) is None and forget.times == 0
    assert f.known == (HOME, EARLY, EARLIER)


def test_a_record_found_in_an_earlier_partition_is_the_keys_record() -> None:
    t, (f, _) = table(), fence()
    t.create_entity({"PartitionKey": EARLIER, "RowKey": RK, "Status": 2})

    found = f.claim_earlier(t, RK)

    assert found is not None and found["PartitionKey"] == EARLIER and found["Status"] == 2
    assert row(t, EARLY) == claim_row(EARLY, RK, HOME, 2)


def test_a_claim_of_our_own_layout_is_ours() -> None:
    t, (f, forget) = table(), fence()
    t.create_entity(claim_row(EARLY, RK, HOME, 2))

    assert f.claim_earlier(t, RK) is None
    assert forget.times == 0


@pytest.mark.parametrize(
    "claim",
    [
        claim_row(EARLY, RK, HOME, 3),  # a newer layout's
        claim_row(EARLY, RK, EARLIER, 2),  # our layout's, elsewhere: our copy is not the layout in force
        claim_row(EARLY, RK, "p-unknown", 1),  # naming a partition we do not know
    ],
)
def test_a_claim_this_process_cannot_follow_means_its_layout_is_behind(claim: dict[str, Any]) -> None:
    t, (f, forget) = table(), fence()
    t.create_entity(claim)

    with pytest.raises(LayoutBehind) as behind:
        f.claim_earlier(t, RK)

    assert forget.times == 1 and behind.value.status == 503
    assert f"partition {claim[MOVED_TO]!r}" in str(behind.value)
    assert row(t, EARLY) == claim  # left as it was


def test_an_older_layouts_claim_is_replaced_by_ours_once_no_earlier_partition_holds_the_record() -> None:
    t, (f, _) = table(), fence()
    t.create_entity(claim_row(EARLY, RK, EARLIER, 1))

    assert f.claim_earlier(t, RK) is None

    assert row(t, EARLY) == claim_row(EARLY, RK, HOME, 2)
    assert row(t, EARLIER) == claim_row(EARLIER, RK, HOME, 2)


def test_an_older_layouts_claim_stays_when_an_earlier_partition_holds_the_record() -> None:
    t, (f, _) = table(), fence()
    t.create_entity(claim_row(EARLY, RK, EARLIER, 1))
    t.create_entity({"PartitionKey": EARLIER, "RowKey": RK, "Status": 1})

    found = f.claim_earlier(t, RK)

    assert found is not None and found["PartitionKey"] == EARLIER
    assert row(t, EARLY) == claim_row(EARLY, RK, EARLIER, 1)


def test_an_older_claim_at_home_naming_an_earlier_partition_is_cleared() -> None:
    t, (f, forget) = table(), fence()
    t.create_entity(claim_row(HOME, RK, EARLY, 1))

    f.clear_home(t, t.get_entity(HOME, RK))

    assert row(t, HOME) is None and forget.times == 0


@pytest.mark.parametrize(
    "claim",
    [claim_row(HOME, RK, EARLY, 2), claim_row(HOME, RK, EARLY, 3), claim_row(HOME, RK, "p-unknown", 1)],
)
def test_a_claim_at_home_of_our_layout_or_a_newer_one_or_elsewhere_means_behind(
    claim: dict[str, Any],
) -> None:
    t, (f, forget) = table(), fence()
    t.create_entity(claim)

    with pytest.raises(LayoutBehind):
        f.clear_home(t, t.get_entity(HOME, RK))

    assert row(t, HOME) == claim and forget.times == 1


def test_a_claim_at_home_cleared_meanwhile_by_another_writer_is_no_error() -> None:
    t, (f, _) = table(), fence()
    t.create_entity(claim_row(HOME, RK, EARLY, 1))
    found = t.get_entity(HOME, RK)
    t.delete_entity(HOME, RK)

    f.clear_home(t, found)

    assert row(t, HOME) is None


def test_behind_drops_the_layout_copy_and_asks_for_a_retry() -> None:
    f, forget = fence()

    refusal = f.behind("p-new")

    assert forget.times == 1
    assert str(refusal) == (
        "The state shard layout changed: a record of this key belongs in partition 'p-new' by a layout "
        "newer than this instance's copy. Retry: the next call reads the layout again."
    )
    assert refusal.headers.get("Retry-After") == "1"


def test_an_older_claim_changed_meanwhile_is_read_again_not_overwritten() -> None:
    """The replacement is If-Match the claim as read: a newer layout's claim written in between stands, and
    this process learns it is behind."""
    tables = MemoryTables()
    t, (f, forget) = tables.table("state"), fence()
    t.create_entity(claim_row(EARLY, RK, EARLIER, 1))

    def a_newer_writer_first(call: str, args: tuple[Any, ...]) -> None:
        if call == "update_entity":
            tables.gate = None
            t.update_entity(claim_row(EARLY, RK, "p-newer", 3), mode=UpdateMode.REPLACE)

    tables.gate = a_newer_writer_first

    with pytest.raises(LayoutBehind):
        f.claim_earlier(t, RK)

    assert row(t, EARLY) == claim_row(EARLY, RK, "p-newer", 3) and forget.times == 1


def test_an_older_claim_is_replaced_with_one_write_each() -> None:
    tables = MemoryTables()
    t, (f, _) = tables.table("state"), fence()
    t.create_entity(claim_row(EARLY, RK, EARLIER, 1))
    calls: list[str] = []
    tables.gate = lambda call, args: calls.append(call)

    assert f.claim_earlier(t, RK) is None

    # each earlier partition: the insert, a read of what stood there (EARLY only), one replacement
    assert calls == ["create_entity", "get_entity", "create_entity", "update_entity"]


def test_a_claim_at_home_changed_meanwhile_is_left_as_the_other_writer_left_it() -> None:
    t, (f, _) = table(), fence()
    t.create_entity(claim_row(HOME, RK, EARLY, 1))
    found = t.get_entity(HOME, RK)
    t.update_entity(claim_row(HOME, RK, EARLY, 1), mode=UpdateMode.REPLACE)  # another writer: a new ETag

    f.clear_home(t, found)

    assert row(t, HOME) == claim_row(HOME, RK, EARLY, 1)


def test_a_claim_at_home_this_process_cannot_clear_names_where_it_points() -> None:
    t, (f, _) = table(), fence()
    t.create_entity(claim_row(HOME, RK, "p-unknown", 1))

    with pytest.raises(LayoutBehind, match="partition 'p-unknown'"):
        f.clear_home(t, t.get_entity(HOME, RK))


OLDER = claim_row(EARLY, RK, HOME, 1)  # an older layout's claim: the key was meant for HOME then too


class Meddler:
    """Another writer acting on (``pk``, RK) just before this process's calls there: ``before[call]`` is
    what it does before each such call, in order (one action per call; then nothing)."""

    def __init__(self, tables: MemoryTables, t: Any, **before: list[str]) -> None:
        self.t, self.tables, self.before = t, tables, {k: list(v) for k, v in before.items()}
        self.calls: list[str] = []
        tables.gate = self

    def __call__(self, call: str, args: tuple[Any, ...]) -> None:
        self.calls.append(call)
        actions = self.before.get(call)
        if not actions:
            return
        action = actions.pop(0)
        gate, self.tables.gate = self.tables.gate, None
        try:
            if action == "delete":
                self.t.delete_entity(EARLY, RK)
            elif action == "older":  # an older layout's claim, written again (a new ETag)
                self.t.upsert_entity(OLDER, mode=UpdateMode.REPLACE)
            elif action == "record":  # the record itself, created by an earlier layout's writer
                self.t.delete_entity(EARLY, RK)
                self.t.create_entity({"PartitionKey": EARLY, "RowKey": RK, "Status": 7})
        finally:
            self.tables.gate = gate


def test_a_claim_deleted_between_our_insert_and_our_read_is_claimed_again() -> None:
    tables = MemoryTables()
    t, (f, forget) = tables.table("state"), fence(earlier=(EARLY,))
    t.create_entity(OLDER)
    meddler = Meddler(tables, t, get_entity=["delete"])

    assert f.claim_earlier(t, RK) is None

    assert row(t, EARLY) == claim_row(EARLY, RK, HOME, 2) and forget.times == 0
    assert meddler.calls == ["create_entity", "get_entity", "create_entity"]


def test_a_claim_that_keeps_vanishing_under_our_reads_is_a_retry_after_three_attempts() -> None:
    tables = MemoryTables()
    t, (f, forget) = tables.table("state"), fence(earlier=(EARLY,))
    t.create_entity(OLDER)
    meddler = Meddler(tables, t, get_entity=["delete"] * 3, create_entity=["", "older", "older"])

    with pytest.raises(LayoutBehind) as again:
        f.claim_earlier(t, RK)

    assert str(again.value) == f"The claim of {RK!r} in {EARLY!r} kept changing; retry."
    assert again.value.headers.get("Retry-After") == "1" and again.value.status == 503
    assert meddler.calls == ["create_entity", "get_entity"] * 3 and forget.times == 0
    assert row(t, EARLY) is None


def test_an_older_claim_rewritten_meanwhile_is_read_again_and_then_replaced() -> None:
    tables = MemoryTables()
    t, (f, forget) = tables.table("state"), fence(earlier=(EARLY,))
    t.create_entity(OLDER)
    meddler = Meddler(tables, t, update_entity=["older"])

    assert f.claim_earlier(t, RK) is None

    assert row(t, EARLY) == claim_row(EARLY, RK, HOME, 2) and forget.times == 0
    assert meddler.calls == [
        "create_entity", "get_entity", "update_entity",  # refused: another ETag now
        "create_entity", "get_entity", "update_entity",  # read again, replaced
    ]  # fmt: skip


def test_an_older_claim_deleted_meanwhile_leaves_the_partition_to_our_claim() -> None:
    tables = MemoryTables()
    t, (f, _) = tables.table("state"), fence(earlier=(EARLY,))
    t.create_entity(OLDER)
    meddler = Meddler(tables, t, update_entity=["delete"])

    assert f.claim_earlier(t, RK) is None

    assert row(t, EARLY) == claim_row(EARLY, RK, HOME, 2)
    assert meddler.calls == ["create_entity", "get_entity", "update_entity", "create_entity"]


def test_an_older_claim_that_became_the_record_meanwhile_answers_that_record() -> None:
    tables = MemoryTables()
    t, (f, _) = tables.table("state"), fence(earlier=(EARLY,))
    t.create_entity(OLDER)
    Meddler(tables, t, update_entity=["record"])

    found = f.claim_earlier(t, RK)

    assert found is not None and found["PartitionKey"] == EARLY and found["Status"] == 7
    assert row(t, EARLY) == {"PartitionKey": EARLY, "RowKey": RK}  # the record, left as it is


def test_an_older_claim_that_keeps_changing_is_a_retry_after_three_replacements() -> None:
    tables = MemoryTables()
    t, (f, forget) = tables.table("state"), fence(earlier=(EARLY,))
    t.create_entity(OLDER)
    meddler = Meddler(tables, t, update_entity=["older"] * 3)

    with pytest.raises(LayoutBehind) as again:
        f.claim_earlier(t, RK)

    assert str(again.value) == f"The claim of {RK!r} in {EARLY!r} kept changing; retry."
    assert again.value.headers.get("Retry-After") == "1" and forget.times == 0
    assert meddler.calls.count("update_entity") == 3
    assert row(t, EARLY) == OLDER


def test_a_claim_of_our_own_layout_is_left_as_it_is() -> None:
    tables = MemoryTables()
    t, (f, _) = tables.table("state"), fence(earlier=(EARLY,))
    t.create_entity(claim_row(EARLY, RK, HOME, 2))
    etag = t.get_entity(EARLY, RK).metadata["etag"]
    calls: list[str] = []
    tables.gate = lambda call, args: calls.append(call)

    assert f.claim_earlier(t, RK) is None

    assert calls == ["create_entity", "get_entity"]  # no rewrite
    assert t.get_entity(EARLY, RK).metadata["etag"] == etag


def test_older_claims_in_every_earlier_partition_are_all_replaced() -> None:
    tables = MemoryTables()
    t, (f, _) = tables.table("state"), fence()
    for pk in (EARLY, EARLIER):
        t.create_entity(claim_row(pk, RK, HOME, 1))

    assert f.claim_earlier(t, RK) is None

    assert row(t, EARLY) == claim_row(EARLY, RK, HOME, 2)
    assert row(t, EARLIER) == claim_row(EARLIER, RK, HOME, 2)


def test_an_older_claim_deleted_meanwhile_does_not_end_the_fencing_of_the_next_partition() -> None:
    tables = MemoryTables()
    t, (f, _) = tables.table("state"), fence()
    for pk in (EARLY, EARLIER):
        t.create_entity(claim_row(pk, RK, HOME, 1))
    Meddler(tables, t, update_entity=["delete"])  # the first replacement (EARLY) meets no row

    assert f.claim_earlier(t, RK) is None

    assert row(t, EARLY) == claim_row(EARLY, RK, HOME, 2)
    assert row(t, EARLIER) == claim_row(EARLIER, RK, HOME, 2)
