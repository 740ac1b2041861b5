"""The table data's recovery story (ADR-0014) runs against Azurite: export every table of a prefix, lose
the tables, restore, and get every row back with every property's value and EDM type; a restore never
overwrites a row."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from azure.data.tables import EdmType, EntityProperty, TableServiceClient

from devtools import backup
from tests.conftest import new_prefix


def rows_of(client: TableServiceClient, table: str) -> list[dict[str, list[object]]]:
    found: list[dict[str, list[object]]] = []
    for entity in client.get_table_client(table).list_entities():
        found.append({k: backup.encode(v) for k, v in entity.items()})
    return sorted(found, key=lambda e: (str(e["PartitionKey"]), str(e["RowKey"])))


@pytest.fixture
def client(azurite_connection: str) -> TableServiceClient:
    return TableServiceClient.from_connection_string(azurite_connection)


def seed(client: TableServiceClient, prefix: str) -> None:
    state = client.create_table(f"{prefix}state")
    events = client.create_table(f"{prefix}hoevents")
    state.create_entity(
        {
            "PartitionKey": "node-1",
            "RowKey": "state",
            "Version": 3,
            "Big": EntityProperty(2**40, EdmType.INT64),
            "Small64": EntityProperty(7, EdmType.INT64),
            "Ratio": 2.0,
            "Done": True,
            "Body": '{"a": 1}',
            "At": datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
            "Id": uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"),
            "Raw": b"\x00\x01\xff",
        }
    )
    for i in range(150):  # more than a page of a transaction, several partitions
        events.create_entity({"PartitionKey": f"h{i % 3}", "RowKey": f"{i:05d}", "Seq": i})
    client.create_table(f"{prefix}hopoison")  # an empty table is exported too


def test_export_then_restore_gives_back_every_row_with_its_types(
    client: TableServiceClient, tmp_path: Path
) -> None:
    prefix = new_prefix()
    seed(client, prefix)
    before = {t: rows_of(client, f"{prefix}{t}") for t in ("state", "hoevents", "hopoison")}
    # When the tables are exported and then lost
    counts = backup.export(client, prefix, tmp_path / "export")
    assert counts == {"state": 1, "hoevents": 150, "hopoison": 0}
    for table in before:
        client.delete_table(f"{prefix}{table}")
    # and restored
    restored = backup.restore(client, tmp_path / "export")
    # Then every row is back, each property with its value and EDM type (Int64 stays Int64, the
    # timestamp keeps its 7 digits, binary and GUID round-trip)
    assert restored == counts
    after = {t: rows_of(client, f"{prefix}{t}") for t in before}
    assert after == before
    [state] = after["state"]
    assert state["Small64"] == ["Edm.Int64", 7] and state["Raw"] == ["Edm.Binary", "AAH/"]
    assert json.loads((tmp_path / "export" / "manifest.json").read_text())["prefix"] == prefix


def test_restore_into_a_new_prefix_and_never_over_existing_rows(
    client: TableServiceClient, tmp_path: Path
) -> None:
    prefix = new_prefix()
    seed(client, prefix)
    backup.export(client, prefix, tmp_path / "export")
    # Into new tables (the operator then points SETTLE_TABLE_PREFIX at them)
    other = new_prefix()
    backup.restore(client, tmp_path / "export", other)
    assert rows_of(client, f"{other}hoevents") == rows_of(client, f"{prefix}hoevents")
    # Into tables that hold rows: refused before anything is written
    client.get_table_client(f"{prefix}state").update_entity(
        {"PartitionKey": "node-1", "RowKey": "state", "Version": 4}
    )
    with pytest.raises(SystemExit, match="already holds rows"):
        backup.restore(client, tmp_path / "export")
    assert rows_of(client, f"{prefix}state")[0]["Version"] == ["Edm.Int32", 4]


def test_the_command_line_exports_and_restores(
    azurite_connection: str, client: TableServiceClient, tmp_path: Path
) -> None:
    prefix = new_prefix()
    seed(client, prefix)
    out = tmp_path / "cli"
    assert (
        backup.main(["export", str(out), "--prefix", prefix, "--connection-string", azurite_connection]) == 0
    )
    other = new_prefix()
    assert (
        backup.main(["restore", str(out), "--prefix", other, "--connection-string", azurite_connection]) == 0
    )
    assert rows_of(client, f"{other}state") == rows_of(client, f"{prefix}state")
