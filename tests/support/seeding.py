"""Many rows at once, written straight into a table, for the tests that check paging over thousands of rows
(tests/operator/test_find_pages.py, test_list_pages.py, tests/console/test_console_more.py): each test pays
for the paging it checks, not for thousands of projections, and seeds in tables of its own module."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import _use_tables, new_prefix

BATCH = 100  # the most operations one entity-group transaction takes


def upsert_all(table: Any, rows: list[dict[str, Any]], threads: int = 16) -> None:
    """Upsert ``rows`` in transactions of at most 100 rows of one partition, ``threads`` at a time."""
    by_partition: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_partition.setdefault(row["PartitionKey"], []).append(row)
    chunks = [group[n : n + BATCH] for group in by_partition.values() for n in range(0, len(group), BATCH)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda c: table.submit_transaction([("upsert", r) for r in c]), chunks))


@pytest.fixture(scope="module", autouse=True)
def tables_of_this_module(azurite_connection: str, settle_tables: str) -> Iterator[None]:
    """Tables of the importing module's own (a new prefix): its seedings of thousands of rows stay out of the
    session's tables, whose overview every later test reads. A module imports it to use it."""
    _use_tables(azurite_connection, new_prefix())
    yield
    _use_tables(azurite_connection, settle_tables)
