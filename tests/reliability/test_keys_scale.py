"""Key encoding at scale: distinct keys never share a Table key, every key round-trips (also via storage).

``tests/state/test_keys.py`` holds the properties at a few hundred examples; here they run at thousands,
for the hand-off keys too, and a sample of hostile keys makes the round trip through Azurite.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from handoff.storage import keys as hk
from state.keys import escape, head_row_key, history_row_key, parse_row_key, partition_key, unescape
from state.model import RecordKey, Scope
from tests.reliability.tally import TALLY, sized

pytestmark = pytest.mark.slow

AREA = "key encoding"
# Unicode of every category (surrogates included: JSON can carry them), plus the characters keys escape.
text = st.text(alphabet=st.characters(codec=None), max_size=24) | st.text(
    alphabet="%|/\\#?~'\x00 a", max_size=12
)
record_keys = st.builds(
    RecordKey,
    tenant_id=st.integers(0, 3),
    scope=st.sampled_from(list(Scope)),
    entity_id=st.integers(0, 3),
    item_entity_key=text,
    item_key=text,
    sub_item_entity_key=text,
    sub_item_key=text,
    entity_execution_id=st.integers(0, 3),
)


def table_key(k: RecordKey) -> tuple[str, str]:
    return partition_key(k.tenant_id, k.scope, k.entity_id), head_row_key(k)


def identity(k: RecordKey) -> tuple[object, ...]:
    execution = k.entity_execution_id if k.scope.is_execution else None
    return (
        k.tenant_id,
        k.scope,
        k.entity_id,
        execution,
        k.item_entity_key,
        k.item_key,
        k.sub_item_entity_key,
        k.sub_item_key,
    )


@settings(max_examples=sized(4000, 400), deadline=None)
@given(record_keys, record_keys)
def test_distinct_state_keys_never_share_a_table_key_and_all_round_trip(a, b):
    TALLY.add(AREA, fuzz_cases=1)
    if identity(a) != identity(b):
        TALLY.check(AREA, table_key(a) != table_key(b), f"{a} and {b} collide")
    for k in (a, b):
        decoded = parse_row_key(head_row_key(k), k.scope)
        got = (
            decoded["item_entity_key"],
            decoded["item_key"],
            decoded["sub_item_entity_key"],
            decoded["sub_item_key"],
        )
        TALLY.check(AREA, got == identity(k)[4:], f"{k} decodes to {decoded}")
        TALLY.check(
            AREA,
            parse_row_key(history_row_key(k, 42), k.scope) == decoded,
            f"{k}: history key decodes differently",
        )


@settings(max_examples=sized(4000, 400), deadline=None)
@given(text, text)
def test_escaping_is_injective_and_reversible(a, b):
    TALLY.add(AREA, fuzz_cases=1)
    TALLY.check(AREA, unescape(escape(a)) == a and hk.decode(hk.encode(a)) == a, f"{a!r} does not round-trip")
    if a != b:
        TALLY.check(AREA, escape(a) != escape(b) and hk.encode(a) != hk.encode(b), f"{a!r} and {b!r} collide")
    TALLY.check(
        AREA, "|" not in escape(a) and not set(hk.encode(a)) & set("|~/\\#?"), f"{a!r}: separator left"
    )


@settings(
    max_examples=sized(150, 25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fields=st.fixed_dictionaries(
        {"itemKey": text.filter(bool), "itemEntityKey": text.filter(bool), "subItemKey": text}
    )
)
@example(fields={"itemKey": "0", "itemEntityKey": "\ud800", "subItemKey": ""})  # found on a busy run
def test_hostile_keys_round_trip_through_storage(faulty_tables, call, fields):
    key = {"tenantId": 9, "scopeId": 7, "entityId": 1, "entityExecutionId": 3, **fields}
    written = call("state_upsert", {"key": key, "data": {"k": fields["itemKey"]}})
    TALLY.add(AREA, operations=1, fuzz_cases=1)
    TALLY.check(AREA, written.status in (200, 400), f"{fields!r}: {written.status} {written.body!r:.200}")
    if written.status != 200:
        # An unpaired surrogate is no character: refused by the body's parser, saying so (I-JSON, RFC 7493)
        unpaired = any(0xD800 <= ord(c) <= 0xDFFF for value in fields.values() for c in value)
        expected = "invalid-json" if unpaired else "key-too-long"
        TALLY.check(AREA, written.json["type"].endswith(expected), f"{fields!r}: {written.body!r:.200}")
        return
    TALLY.check(AREA, not any(0xD800 <= ord(c) <= 0xDFFF for v in fields.values() for c in v), f"{fields!r}")
    got = call("state_get", {"key": key})  # the suite's read-back: not counted as an operation
    TALLY.check(AREA, got.status == 200, f"{fields!r}: get {got.status}")
    record = got.json
    TALLY.check(
        AREA,
        (record["itemKey"], record["itemEntityKey"], record["subItemKey"])
        == (fields["itemKey"], fields["itemEntityKey"], fields["subItemKey"]),
        f"{fields!r} came back as {record}",
    )
