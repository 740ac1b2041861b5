"""The calls Settle's stores make of one table: the protocol that Azure's ``TableClient`` and the in-memory
table of the tests (``tests/support/memory_table.py``) both meet, held to the same behaviour by one
conformance suite (``tests/conformance/test_table_conformance.py``) run against Azurite and the in-memory
table alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from common.settings import TableSettings


class Table(Protocol):
    """One table: point reads, writes (insert-only, conditional, upsert, delete), entity-group transactions
    and filtered queries (an iterable of entities with ``by_page(continuation_token)``). Entities are
    mappings with a ``metadata`` attribute carrying ``etag``."""

    def get_entity(self, partition_key: str, row_key: str, **kwargs: Any) -> Any: ...

    def create_entity(self, entity: Mapping[str, Any], **kwargs: Any) -> Mapping[str, Any]: ...

    def update_entity(
        self, entity: Mapping[str, Any], mode: Any = ..., **kwargs: Any
    ) -> Mapping[str, Any]: ...

    def upsert_entity(
        self, entity: Mapping[str, Any], mode: Any = ..., **kwargs: Any
    ) -> Mapping[str, Any]: ...

    def delete_entity(self, *args: Any, **kwargs: Any) -> None: ...

    def submit_transaction(self, operations: Sequence[Any], **kwargs: Any) -> list[Mapping[str, Any]]: ...

    def query_entities(self, query_filter: str, **kwargs: Any) -> Any: ...


class TableSource(Protocol):
    """Where a store finds its tables: ``common.tables.Tables`` over Azure or Azurite, or the tests'
    in-memory tables. ``settings`` names them (prefix, table names)."""

    @property
    def settings(self) -> TableSettings: ...

    def table(self, name: str) -> Any: ...
