"""State over several storage accounts (ADR-0015): the ``state`` table of each account, chosen by the key.

Account 0 is the one every table uses (``SETTLE_TABLES`` / ``SETTLE_TABLES__tableServiceUri``). Account
*i* ≥ 1 is ``SETTLE_TABLES_{i}`` (a connection string, e.g. a second Azurite) or
``SETTLE_TABLES_{i}__tableServiceUri`` (the same managed identity, ``SETTLE_TABLES__clientId``); numbering
stops at the first gap. A sharded state PartitionKey names its account (``state/keys.py``,
:func:`~state.keys.account_of`), so the map is fixed and read from the key: :class:`RoutedTable` sends
every call on a partition to that partition's account. Only the ``state`` table is spread; level 1 of the
expiry index and the signing key stay in account 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.settings import AZURITE_TABLES, DEVELOPMENT_STORAGE, TableSettings, env
from common.table_protocol import TableSource
from state.keys import STATE_TABLE, account_of

MAX_ACCOUNTS = 64
# The app settings of account i >= 1, declared once as patterns (tests/infra/codescan.py reads
# ``PATTERN.format(i=...)`` as the numbered setting, checked against what infra/ sets for i = 1..N-1).
ACCOUNT_CONNECTION_SETTING = "SETTLE_TABLES_{i}"
ACCOUNT_URI_SETTING = "SETTLE_TABLES_{i}__tableServiceUri"
ACCOUNT_CLIENT_ID_SETTING = "SETTLE_TABLES_{i}__clientId"


def extra_accounts(prefix: str) -> list[TableSettings]:
    """Settings of accounts 1, 2, ... from the environment (none when ``SETTLE_TABLES_1`` is unset)."""
    found: list[TableSettings] = []
    for i in range(1, MAX_ACCOUNTS):
        conn = env(ACCOUNT_CONNECTION_SETTING.format(i=i))
        uri = env(ACCOUNT_URI_SETTING.format(i=i))
        if conn is None and uri is None:
            break
        if conn == DEVELOPMENT_STORAGE:
            conn = AZURITE_TABLES
        found.append(
            TableSettings(
                connection_string=conn,
                service_uri=uri,
                client_id=env(ACCOUNT_CLIENT_ID_SETTING.format(i=i)) or env("SETTLE_TABLES__clientId"),
                prefix=prefix,
            )
        )
    return found


class RoutedTable:
    """The ``state`` table over several accounts: each call goes to the account its partition names.

    Only partition-scoped calls are routed (every state read and write is: a point read, a transaction,
    a range read with ``PartitionKey eq @pk``); a query across partitions goes through
    :meth:`state.store.StateStore.query_page`, which reads account after account.
    """

    def __init__(self, accounts: Sequence[TableSource]) -> None:
        self._accounts = list(accounts)

    def client(self, partition: str) -> Any:
        index = account_of(partition)
        if index >= len(self._accounts):
            raise LookupError(
                f"state partition {partition!r} lives in storage account {index}, but only "
                f"{len(self._accounts)} are configured (SETTLE_TABLES_{index} is missing)"
            )
        return self._accounts[index].table(STATE_TABLE)

    def clients(self) -> list[Any]:
        return [tables.table(STATE_TABLE) for tables in self._accounts]

    def get_entity(self, partition_key: str, row_key: str, **kwargs: Any) -> Any:
        return self.client(partition_key).get_entity(partition_key, row_key, **kwargs)

    def create_entity(self, entity: dict[str, Any], **kwargs: Any) -> Any:
        return self.client(str(entity["PartitionKey"])).create_entity(entity, **kwargs)

    def update_entity(self, entity: dict[str, Any], **kwargs: Any) -> Any:
        return self.client(str(entity["PartitionKey"])).update_entity(entity, **kwargs)

    def upsert_entity(self, entity: dict[str, Any], **kwargs: Any) -> Any:
        return self.client(str(entity["PartitionKey"])).upsert_entity(entity, **kwargs)

    def delete_entity(self, partition_key: str, row_key: str, **kwargs: Any) -> Any:
        return self.client(partition_key).delete_entity(partition_key, row_key, **kwargs)

    def submit_transaction(self, operations: Sequence[Any], **kwargs: Any) -> Any:
        partition = str(operations[0][1]["PartitionKey"])
        return self.client(partition).submit_transaction(operations, **kwargs)

    def query_entities(self, query_filter: str, **kwargs: Any) -> Any:
        parameters = kwargs.get("parameters") or {}
        if "pk" not in parameters or not query_filter.startswith("PartitionKey eq @pk"):
            raise ValueError("a query across state partitions must read each account (StateStore.query_page)")
        return self.client(str(parameters["pk"])).query_entities(query_filter, **kwargs)
