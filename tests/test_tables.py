"""``common.tables.Tables`` makes sure each table exists at its first use in a process, with one listing of
the deployment's tables instead of one create per table (a cold instance's first requests stay few).

Each ``Tables`` here stands for a new process: it knows nothing of what an earlier one created.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common.errors import StorageTableMissing
from common.settings import TableSettings
from common.tables import Tables


class Recorder(SansIOHTTPPolicy[Any, Any]):
    """Records each request as ``(method, what)``: ``list`` / ``create`` for table management, else the
    table name; ``refuse_listing`` answers the listing with an error as storage would (403)."""

    def __init__(self, *, refuse_listing: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.refuse_listing = refuse_listing

    def on_request(self, request: Any) -> None:
        http = request.http_request
        path = http.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        what = path.split("(", 1)[0]
        if path == "Tables":
            what = "list" if http.method == "GET" else "create"
        self.sent.append((http.method, what))
        if what == "list" and self.refuse_listing:
            # Storage itself refuses it: a signature that does not match answers 403 AuthenticationFailed.
            http.headers["Authorization"] = "SharedKey devstoreaccount1:" + "A" * 44


def process(connection: str, prefix: str, recorder: Recorder) -> Tables:
    settings = TableSettings(connection_string=connection, service_uri=None, client_id=None, prefix=prefix)
    return Tables(settings, policies=[recorder])


@pytest.fixture
def prefix() -> str:
    return "f" + uuid.uuid4().hex[:12]


def insert_and_read(tables: Tables, name: str) -> None:
    row = {"PartitionKey": "p", "RowKey": uuid.uuid4().hex}
    tables.table(name).create_entity(row)
    assert tables.table(name).get_entity("p", row["RowKey"])["RowKey"] == row["RowKey"]


def test_a_process_lists_the_tables_once_and_creates_only_the_missing_ones(
    azurite_connection: str, prefix: str
) -> None:
    first = Recorder()
    tables = process(azurite_connection, prefix, first)
    insert_and_read(tables, "state")
    insert_and_read(tables, "statelocks")
    # Nothing existed: one listing, then one create per table as each is first used.
    assert first.sent[0] == ("GET", "list")
    assert [s for s in first.sent if s[1] in ("list", "create")] == [
        ("GET", "list"),
        ("POST", "create"),
        ("POST", "create"),
    ]
    tables.close()

    second = Recorder()
    tables = process(azurite_connection, prefix, second)
    insert_and_read(tables, "state")
    insert_and_read(tables, "statelocks")
    insert_and_read(tables, "hoevents")  # not there yet: the one create of this process
    assert [s for s in second.sent if s[1] in ("list", "create")] == [("GET", "list"), ("POST", "create")]
    assert len(second.sent) == 1 + 1 + 3 * 2  # list, create hoevents, an insert and a read per table
    tables.close()

    third = Recorder()
    tables = process(azurite_connection, prefix, third)
    for name in ("hoevents", "state", "statelocks"):
        tables.table(name)
    assert third.sent == [("GET", "list")]  # every table known from one request
    tables.close()


def test_another_deployments_tables_are_not_taken_for_ours(azurite_connection: str, prefix: str) -> None:
    """A prefix that another deployment's prefix extends (``settle`` and ``settle2``) lists its tables too;
    ours are still created."""
    longer = Recorder()
    insert_and_read(process(azurite_connection, prefix + "2", longer), "state")
    shorter = Recorder()
    tables = process(azurite_connection, prefix, shorter)
    insert_and_read(tables, "state")
    assert ("POST", "create") in shorter.sent


def test_a_listing_storage_refuses_falls_back_to_creating_each_table(
    azurite_connection: str, prefix: str
) -> None:
    """A role without Query Tables (or an emulator without a filter on tables) must not stop Settle."""
    insert_and_read(process(azurite_connection, prefix, Recorder()), "state")
    refused = Recorder(refuse_listing=True)
    tables = process(azurite_connection, prefix, refused)
    insert_and_read(tables, "state")
    insert_and_read(tables, "statelocks")
    assert [s for s in refused.sent if s[1] in ("list", "create")] == [
        ("GET", "list"),
        ("POST", "create"),  # exists already: create-if-not-exists answers the conflict quietly
        ("POST", "create"),
    ]


def test_a_table_deleted_after_its_first_use_is_still_a_missing_table_not_an_empty_one(
    azurite_connection: str, prefix: str
) -> None:
    """Listing at first use changes nothing after it: a table gone later is reported (503), never
    recreated behind the caller's back nor read as holding no rows."""
    tables = process(azurite_connection, prefix, Recorder())
    insert_and_read(tables, "state")
    from azure.data.tables import TableServiceClient

    TableServiceClient.from_connection_string(azurite_connection).delete_table(prefix + "state")
    with pytest.raises(StorageTableMissing):
        tables.table("state").get_entity("p", "missing")
