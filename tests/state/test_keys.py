"""Key encoding: any Unicode round-trips, distinct keys never collide, limits are enforced."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from state.keys import escape, head_row_key, history_row_key, parse_row_key, unescape
from state.model import RecordKey, Scope
from tests.state.conftest import new_key

FORBIDDEN = set("/\\#?") | {chr(c) for c in range(0x20)} | {chr(c) for c in range(0x7F, 0xA0)}
text = st.text(alphabet=st.characters(codec=None), max_size=20)
keys = st.builds(
    RecordKey,
    tenant_id=st.integers(0, 5),
    scope=st.sampled_from(list(Scope)),
    entity_id=st.integers(0, 5),
    item_entity_key=text,
    item_key=text,
    sub_item_entity_key=text,
    sub_item_key=text,
    entity_execution_id=st.integers(0, 5),
)


@given(text)
def test_escape_round_trips_and_leaves_no_forbidden_character(value):
    escaped = escape(value)
    assert unescape(escaped) == value
    assert not (set(escaped) & FORBIDDEN) and "|" not in escaped


@given(keys)
def test_row_keys_decode_back_to_the_key(key):
    decoded = parse_row_key(head_row_key(key), key.scope)
    assert decoded["item_key"] == key.item_key
    assert decoded["item_entity_key"] == key.item_entity_key
    assert decoded["sub_item_key"] == key.sub_item_key
    assert decoded["sub_item_entity_key"] == key.sub_item_entity_key
    assert parse_row_key(history_row_key(key, 7), key.scope) == decoded


@settings(max_examples=300)
@given(keys, keys)
def test_distinct_keys_never_share_a_row_key(a, b):
    from state.keys import partition_key

    table_a = (partition_key(a.tenant_id, a.scope, a.entity_id), head_row_key(a))
    table_b = (partition_key(b.tenant_id, b.scope, b.entity_id), head_row_key(b))
    identity_a = (
        a.tenant_id,
        a.scope,
        a.entity_id,
        a.entity_execution_id if a.scope.is_execution else None,
        a.item_entity_key,
        a.item_key,
        a.sub_item_entity_key,
        a.sub_item_key,
    )
    identity_b = (
        b.tenant_id,
        b.scope,
        b.entity_id,
        b.entity_execution_id if b.scope.is_execution else None,
        b.item_entity_key,
        b.item_key,
        b.sub_item_entity_key,
        b.sub_item_key,
    )
    assert (table_a == table_b) == (identity_a == identity_b)


def test_history_rows_sort_newest_first_right_after_the_head():
    key = RecordKey(1, Scope.ELEMENT, 1, "invoice", "INV-1")
    rows = sorted([history_row_key(key, v) for v in (1, 2, 10, 11)] + [head_row_key(key)])
    assert rows == [head_row_key(key)] + [history_row_key(key, v) for v in (11, 10, 2, 1)]


def test_hostile_unicode_keys_round_trip_through_the_api(state):
    weird = "a/b\\c#d?e%f|g\x00h\x1fi\x7fj\x9fk😀l\u2028m'n\"o"
    key = new_key(itemKey=weird, itemEntityKey="ent/" + weird, subItemKey="?", subItemEntityKey="#")
    lock = state.lock(key).json
    assert lock["acquired"] is True
    record = state.set(key, status="Processed", lockToken=lock["lockToken"]).json
    assert (record["itemKey"], record["itemEntityKey"]) == (weird, "ent/" + weird)
    assert (record["subItemKey"], record["subItemEntityKey"]) == ("?", "#")
    assert state.exists(key).json["exists"] is True
    similar = dict(key, itemKey=weird.replace("%", "%25"))
    assert state.exists(similar).json["exists"] is False
