"""Export Settle's tables to files and restore them: the recovery story of the data account (ADR-0014).

Table Storage has no point-in-time restore, and the data account's delete lock (infra/) guards the account,
not its rows: an operator's mistake, or a bug that overwrites rows, is recovered from an export. This tool
writes every table of one prefix (``SETTLE_TABLE_PREFIX``: ``settlestate``, ``settlehoevents``, ...) to a
directory, one JSON-lines file per table with every property's EDM type kept, and restores such a directory
into tables that hold nothing yet (insert-only: a restore never overwrites a row; a table that already
holds one stops the restore before anything is written).

    python -m devtools.backup export DIR [--prefix settle] (--connection-string CS | --endpoint URL)
    python -m devtools.backup restore DIR [--prefix NEW] (--connection-string CS | --endpoint URL)

With ``--endpoint`` (``https://<data account>.table.core.windows.net/``) it signs in with
DefaultAzureCredential (``az login``); the data account has shared-key access disabled, so that is the
way in Azure, and the principal needs Storage Table Data Reader (export) or Contributor (restore) on the
data account. An export of a running system is consistent per row, not across rows: stop the function
app (or accept that rows written during the export may be missing) for a consistent copy. ``restore
--prefix NEW`` restores into new tables; point ``SETTLE_TABLE_PREFIX`` at them to use them.

Azure SDK imports are inside the functions that use them, so importing this module (the development tools, the
tests) does not load them.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from azure.data.tables import TableServiceClient

MANIFEST = "manifest.json"
FORMAT = "settle-tables-export/1"


def service(connection_string: str | None, endpoint: str | None) -> TableServiceClient:
    from azure.data.tables import TableServiceClient

    if connection_string:
        return TableServiceClient.from_connection_string(connection_string)
    if not endpoint:
        raise SystemExit("give --connection-string or --endpoint")
    from azure.identity import DefaultAzureCredential

    return TableServiceClient(endpoint=endpoint, credential=DefaultAzureCredential())


def encode(value: Any) -> list[Any]:
    """One property as [EDM type, JSON value]: what a restore needs to write it back with its type."""
    from azure.data.tables import EntityProperty

    if isinstance(value, EntityProperty):
        edm = value.edm_type.value if hasattr(value.edm_type, "value") else str(value.edm_type)
        return [edm, _json_value(value.value)]
    if isinstance(value, bool):
        return ["Edm.Boolean", value]
    if isinstance(value, int):
        return ["Edm.Int32", value]
    if isinstance(value, float):
        return ["Edm.Double", value]
    if isinstance(value, datetime):
        exact = getattr(value, "tables_service_value", "") or value.isoformat()
        return ["Edm.DateTime", exact]
    if isinstance(value, uuid.UUID):
        return ["Edm.Guid", str(value)]
    if isinstance(value, bytes):
        return ["Edm.Binary", base64.b64encode(value).decode()]
    if isinstance(value, str):
        return ["Edm.String", value]
    raise TypeError(f"cannot export a property of type {type(value).__name__}")


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (uuid.UUID, datetime)):
        return str(value)
    return value


def decode(edm: str, value: Any) -> Any:
    """The value to write for [EDM type, JSON value] (the SDK's own types, so it keeps the EDM type)."""
    from azure.data.tables import EdmType, EntityProperty

    if edm == "Edm.Boolean" or edm == "Edm.Double" or edm == "Edm.String" or edm == "Edm.Int32":
        return EntityProperty(value, EdmType(edm))
    if edm == "Edm.Int64":
        return EntityProperty(int(value), EdmType.INT64)
    if edm == "Edm.DateTime":
        return EntityProperty(str(value), EdmType.DATETIME)  # the service's own text, 7 digits kept
    if edm == "Edm.Guid":
        return EntityProperty(uuid.UUID(str(value)), EdmType.GUID)
    if edm == "Edm.Binary":
        return EntityProperty(base64.b64decode(str(value)), EdmType.BINARY)
    raise ValueError(f"unknown EDM type {edm!r}")


def tables_of(client: TableServiceClient, prefix: str) -> list[str]:
    return sorted(t.name for t in client.list_tables() if t.name.startswith(prefix))


def export(client: TableServiceClient, prefix: str, out: Path) -> dict[str, int]:
    """Write every table of ``prefix`` to ``out``; returns rows per table (also in the manifest)."""
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for name in tables_of(client, prefix):
        rows = 0
        with (out / f"{name[len(prefix) :]}.jsonl").open("w", encoding="utf-8") as file:
            for entity in client.get_table_client(name).list_entities():
                properties = {k: encode(v) for k, v in entity.items() if k not in ("PartitionKey", "RowKey")}
                line = {
                    "PartitionKey": entity["PartitionKey"],
                    "RowKey": entity["RowKey"],
                    "properties": properties,
                }
                file.write(json.dumps(line, sort_keys=True) + "\n")
                rows += 1
        counts[name[len(prefix) :]] = rows
    manifest = {
        "format": FORMAT,
        "prefix": prefix,
        "exportedAt": datetime.now().astimezone().isoformat(),
        "tables": counts,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return counts


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as file:
        for line in file:
            if line.strip():
                yield json.loads(line)


def restore(client: TableServiceClient, source: Path, prefix: str | None = None) -> dict[str, int]:
    """Insert every exported row into the tables of ``prefix`` (default: the exported prefix).

    Refuses, before writing anything, when a target table already holds a row; rows are inserted, never
    upserted, so nothing that exists is overwritten."""
    manifest = json.loads((source / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise SystemExit(f"{source}: not a Settle table export ({manifest.get('format')!r})")
    target = prefix or str(manifest["prefix"])
    logical = sorted(manifest["tables"])
    for name in logical:
        table = client.create_table_if_not_exists(f"{target}{name}")
        if next(iter(table.list_entities(results_per_page=1, select=["PartitionKey"])), None) is not None:
            raise SystemExit(f"table {target}{name} already holds rows: restore into empty tables (--prefix)")
    counts: dict[str, int] = {}
    for name in logical:
        table = client.get_table_client(f"{target}{name}")
        rows = 0
        for row in _rows(source / f"{name}.jsonl"):
            entity = {"PartitionKey": row["PartitionKey"], "RowKey": row["RowKey"]}
            entity.update({k: decode(edm, v) for k, (edm, v) in row["properties"].items()})
            table.create_entity(entity)
            rows += 1
        if rows != manifest["tables"][name]:
            raise SystemExit(f"{name}: {rows} rows in the file, the manifest says {manifest['tables'][name]}")
        counts[name] = rows
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.backup", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("export", "restore"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--prefix", default=None, help="table prefix (export default: settle)")
    parser.add_argument("--connection-string", default=None)
    parser.add_argument("--endpoint", default=None, help="https://<data account>.table.core.windows.net/")
    args = parser.parse_args(argv)
    client = service(args.connection_string, args.endpoint)
    if args.action == "export":
        counts = export(client, args.prefix or "settle", args.directory)
    else:
        counts = restore(client, args.directory, args.prefix)
    for name, rows in sorted(counts.items()):
        print(f"{args.action}ed {rows} rows of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
