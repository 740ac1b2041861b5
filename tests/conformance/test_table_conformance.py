"""One conformance suite, two tables: every test runs against Azurite and against the in-memory table
(``tests/support/memory_table.py``), so the in-memory table stands in for storage only where it behaves as
Azurite does: ETags and If-Match, insert conflicts, entity-group transactions (atomic, one partition, the
refused operation named), the filters and continuation tokens Settle's stores use, size limits, and the
property types (Int64, datetimes, binary)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import EdmType, EntityProperty, TableTransactionError, UpdateMode

from common.transactions import insert, merge, refusal, replace
from tests.support.memory_table import MemoryTables

TABLE = "conformance"


@pytest.fixture(params=[pytest.param("azurite", marks=pytest.mark.storage), "memory"])
def table(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The same table protocol over Azurite (a real ``TableClient``) and over the in-memory table."""
    if request.param == "memory":
        yield MemoryTables().table(TABLE)
        return
    request.getfixturevalue("settle_tables")
    from common import runtime

    yield runtime.tables().table(TABLE)


@pytest.fixture
def pk() -> str:
    return "p-" + uuid.uuid4().hex[:12]


def row(pk: str, rk: str, **columns: Any) -> dict[str, Any]:
    return {"PartitionKey": pk, "RowKey": rk, **columns}


def test_a_written_row_reads_back_with_its_types(table: Any, pk: str) -> None:
    at = datetime(2026, 12, 5, 17, 8, 24, 702000, tzinfo=UTC)
    table.create_entity(
        row(
            pk,
            "r",
            Text="héllo|~",
            Small=7,
            Big=EntityProperty(2**40, EdmType.INT64),
            Wide=EntityProperty(5, EdmType.INT64),
            Ratio=0.5,
            Flag=True,
            At=at,
            Data=b"\x00\x01\xff",
        )
    )
    got = table.get_entity(pk, "r")
    assert got["Text"] == "héllo|~" and got["Small"] == 7 and got["Ratio"] == 0.5 and got["Flag"] is True
    assert got["Big"] == EntityProperty(2**40, EdmType.INT64) and got["Wide"] == EntityProperty(
        5, EdmType.INT64
    )
    assert got["At"] == at and got["Data"] == b"\x00\x01\xff"
    assert got.metadata["etag"]


def test_an_insert_of_an_existing_row_is_refused_409(table: Any, pk: str) -> None:
    table.create_entity(row(pk, "r", N=1))
    with pytest.raises(ResourceExistsError) as raised:
        table.create_entity(row(pk, "r", N=2))
    refused = refusal(raised.value)
    assert refused is not None and refused.status == 409
    assert table.get_entity(pk, "r")["N"] == 1


def test_every_write_gives_a_new_etag_and_if_match_refuses_an_old_one(table: Any, pk: str) -> None:
    first = table.create_entity(row(pk, "r", N=1))["etag"]
    assert table.get_entity(pk, "r").metadata["etag"] == first
    second = table.update_entity(
        row(pk, "r", N=2), mode=UpdateMode.MERGE, etag=first, match_condition=MatchConditions.IfNotModified
    )["etag"]
    assert second != first and table.get_entity(pk, "r").metadata["etag"] == second
    with pytest.raises(ResourceModifiedError) as raised:
        table.update_entity(
            row(pk, "r", N=3),
            mode=UpdateMode.REPLACE,
            etag=first,
            match_condition=MatchConditions.IfNotModified,
        )
    refused = refusal(raised.value)
    assert refused is not None and refused.status == 412
    assert table.get_entity(pk, "r")["N"] == 2


def test_if_match_any_writes_over_every_etag_and_needs_the_row(table: Any, pk: str) -> None:
    """``If-Match: *`` (an update or delete "if not modified" from ETag ``*``): any ETag matches; the row
    must exist. The cores pass ``*`` for a row read without its ETag (``plan_transition``, listings)."""
    table.create_entity(row(pk, "s", N=1))
    table.update_entity(row(pk, "s", N=2), mode=UpdateMode.MERGE)  # a new ETag
    table.update_entity(
        row(pk, "s", N=3), mode=UpdateMode.MERGE, etag="*", match_condition=MatchConditions.IfNotModified
    )
    assert table.get_entity(pk, "s")["N"] == 3
    table.submit_transaction([replace(row(pk, "s", N=4), "*")])
    assert table.get_entity(pk, "s")["N"] == 4
    with pytest.raises(TableTransactionError) as raised:
        table.submit_transaction([merge(row(pk, "s", N=5), "*"), merge(row(pk, "missing", N=1), "*")])
    refused = refusal(raised.value)
    assert refused is not None and (refused.index, refused.status) == (1, 404)
    assert table.get_entity(pk, "s")["N"] == 4


def test_an_update_without_an_etag_needs_the_row(table: Any, pk: str) -> None:
    with pytest.raises(ResourceNotFoundError) as raised:
        table.update_entity(row(pk, "missing", N=1), mode=UpdateMode.MERGE)
    refused = refusal(raised.value)
    assert refused is not None and refused.status == 404


def test_merge_keeps_other_columns_and_replace_drops_them(table: Any, pk: str) -> None:
    table.create_entity(row(pk, "m", A=1, B="b"))
    table.update_entity(row(pk, "m", A=2), mode=UpdateMode.MERGE)
    assert dict(table.get_entity(pk, "m")) == row(pk, "m", A=2, B="b")
    table.update_entity(row(pk, "m", C=3), mode=UpdateMode.REPLACE)
    assert dict(table.get_entity(pk, "m")) == row(pk, "m", C=3)


def test_upsert_inserts_then_merges(table: Any, pk: str) -> None:
    table.upsert_entity(row(pk, "u", A=1))
    table.upsert_entity(row(pk, "u", B=2))
    assert dict(table.get_entity(pk, "u")) == row(pk, "u", A=1, B=2)


def test_a_delete_of_a_missing_row_is_quiet_and_an_old_etag_is_refused(table: Any, pk: str) -> None:
    table.delete_entity(pk, "never")
    etag = table.create_entity(row(pk, "d", N=1))["etag"]
    table.update_entity(row(pk, "d", N=2), mode=UpdateMode.MERGE)
    with pytest.raises(ResourceModifiedError):
        table.delete_entity(pk, "d", etag=etag, match_condition=MatchConditions.IfNotModified)
    fresh = table.get_entity(pk, "d").metadata["etag"]
    table.delete_entity(pk, "d", etag=fresh, match_condition=MatchConditions.IfNotModified)
    with pytest.raises(ResourceNotFoundError):
        table.get_entity(pk, "d")


def test_a_transaction_is_atomic_and_names_the_refused_operation(table: Any, pk: str) -> None:
    etag = table.create_entity(row(pk, "b", N=1))["etag"]
    with pytest.raises(TableTransactionError) as raised:
        table.submit_transaction([insert(row(pk, "a", N=1)), insert(row(pk, "b", N=2)), insert(row(pk, "c"))])
    refused = refusal(raised.value)
    assert refused is not None and (refused.index, refused.status) == (1, 409)
    with pytest.raises(TableTransactionError) as raised:
        table.submit_transaction([insert(row(pk, "a", N=1)), replace(row(pk, "b", N=3), 'W/"other"')])
    refused = refusal(raised.value)
    assert refused is not None and (refused.index, refused.status) == (1, 412)
    with pytest.raises(TableTransactionError) as raised:
        table.submit_transaction([insert(row(pk, "a")), merge(row(pk, "none", N=1))])
    refused = refusal(raised.value)
    assert refused is not None and (refused.index, refused.status) == (1, 404)
    rows = {r["RowKey"] for r in table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})}
    assert rows == {"b"}  # nothing of the refused transactions was written
    answers = table.submit_transaction([insert(row(pk, "a", N=1)), replace(row(pk, "b", N=2), etag)])
    assert len(answers) == 2 and all(a["etag"] for a in answers)
    assert table.get_entity(pk, "b")["N"] == 2


def test_a_transaction_over_two_partitions_is_refused(table: Any, pk: str) -> None:
    with pytest.raises((TableTransactionError, ValueError, HttpResponseError)):
        table.submit_transaction([insert(row(pk, "a")), insert(row(pk + "x", "a"))])
    assert list(table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})) == []


def test_a_transaction_may_hold_100_operations(table: Any, pk: str) -> None:
    table.submit_transaction([insert(row(pk, f"r{n:03d}", N=n)) for n in range(100)])
    assert len(list(table.query_entities("PartitionKey eq @pk", parameters={"pk": pk}))) == 100


def test_filters_compare_strings_numbers_and_datetimes(table: Any, pk: str) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(6):
        table.create_entity(
            row(
                pk,
                f"r{n}",
                Status=n,
                At=base + timedelta(hours=n),
                Kind="odd" if n % 2 else "even",
                Big=EntityProperty(2**40 + n, EdmType.INT64),
            )
        )
    table.create_entity(row(pk, "~idx", Other=1))

    def keys(query: str, **params: Any) -> list[str]:
        found = table.query_entities(query, parameters={"pk": pk, **params})
        return [r["RowKey"] for r in found]

    assert keys("PartitionKey eq @pk and Status ne 5 and Status ge 3") == ["r3", "r4"]
    assert keys("PartitionKey eq @pk and ( RowKey lt @idx or RowKey ge @idxend )", idx="~", idxend="~~") == [
        f"r{n}" for n in range(6)
    ]
    assert keys("PartitionKey eq @pk and At lt @at", at=base + timedelta(hours=2)) == ["r0", "r1"]
    assert keys("PartitionKey eq @pk and ( Kind eq 'odd' or Status eq 0 )") == ["r0", "r1", "r3", "r5"]
    assert keys("PartitionKey eq @pk and Big ge @big", big=2**40 + 4) == ["r4", "r5"]
    assert keys("PartitionKey eq @pk and Status eq 1 and not ( Kind eq 'odd' )") == []
    # A row without the property satisfies no comparison of it
    assert "~idx" not in keys("PartitionKey eq @pk and Status ne 1")
    assert keys("PartitionKey eq @pk and RowKey ge @low and RowKey lt @high", low="r2", high="r4") == [
        "r2",
        "r3",
    ]


def test_a_datetime_literal_before_a_millisecond_is_compared_alike(table: Any, pk: str) -> None:
    # The overdue filter (ADR-0022 change 5: ``ExpectedBy lt datetime'...'`` as written by
    # handoff.storage.store.due_filter): Azurite compares DateTime values at millisecond precision, Azure at
    # 100 ns; ``lt`` a bound cut to the millisecond is answered alike, to the microsecond around it.
    from common.tables import before_ms, datetime_literal
    from handoff.storage.store import due_filter

    bound = datetime(2026, 12, 6, 5, 4, 27, 123000, tzinfo=UTC)
    offsets = {"a": -1000, "b": -1, "c": 0, "d": 1, "e": 999, "f": 1000}
    for name, micros in offsets.items():
        table.create_entity(row(pk, name, ExpectedBy=bound + timedelta(microseconds=micros)))
    table.create_entity(row(pk, "g", Other=1))  # no ExpectedBy: never due

    def keys(where: str, **select: Any) -> list[str]:
        return [r["RowKey"] for r in table.query_entities(f"PartitionKey eq '{pk}' and {where}", **select)]

    assert datetime_literal(bound) == "datetime'2026-12-06T05:04:27.123000Z'"
    assert keys(f"ExpectedBy lt {datetime_literal(bound)}") == ["a", "b"]
    assert keys(f"ExpectedBy ge {datetime_literal(bound)}") == ["c", "d", "e", "f"]
    # "Due at now": cut to its millisecond, then lt; keys only, as the counts read
    now = bound + timedelta(microseconds=456)
    assert before_ms(now) == bound
    assert keys(due_filter(now), select=["RowKey"]) == ["a", "b"]
    assert keys(due_filter(bound + timedelta(milliseconds=1))) == ["a", "b", "c", "d", "e"]


def test_a_quote_in_a_value_is_escaped(table: Any, pk: str) -> None:
    table.create_entity(row(pk, "q", Name="O'Brien"))
    found = table.query_entities(
        "PartitionKey eq @pk and Name eq @name", parameters={"pk": pk, "name": "O'Brien"}
    )
    assert [r["RowKey"] for r in found] == ["q"]


def test_pages_continue_where_the_last_one_stopped(table: Any, pk: str) -> None:
    table.submit_transaction([insert(row(pk, f"r{n:02d}")) for n in range(25)])
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        pager = table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": pk}, results_per_page=10
        ).by_page(continuation_token=token)
        seen += [r["RowKey"] for r in next(pager, [])]
        pages += 1
        token = pager.continuation_token
        if not token:
            break
    assert seen == [f"r{n:02d}" for n in range(25)] and pages == 3


def test_select_returns_only_the_named_columns_and_the_etag(table: Any, pk: str) -> None:
    table.create_entity(row(pk, "s", A=1, B=2))
    got = table.get_entity(pk, "s", select=["RowKey", "A"])
    assert got["A"] == 1 and "B" not in got and got.metadata["etag"]


def test_a_text_or_binary_property_over_64_kib_is_refused_400(table: Any, pk: str) -> None:
    # (An entity over 1 MiB is refused by Azure but not by Azurite: Settle checks sizes before it writes,
    # lifecycle.check_size and the hand-off records' limits, and the in-memory table refuses it as Azure.)
    for name, value in (("Text", "x" * 32_769), ("Data", b"x" * 65_537)):
        with pytest.raises(HttpResponseError) as raised:
            table.create_entity(row(pk, name, **{name: value}))
        assert raised.value.status_code == 400
        with pytest.raises(ResourceNotFoundError):
            table.get_entity(pk, name)
    table.create_entity(row(pk, "fits", Text="x" * 32_768, Data=b"x" * 65_536))
    assert len(table.get_entity(pk, "fits")["Text"]) == 32_768
