"""App settings, read from the environment with the same names everywhere.

The names are the contract between the code, ``local.settings.json.example`` and ``infra/`` Bicep:
``SETTLE_TABLES`` (connection string) or ``SETTLE_TABLES__tableServiceUri`` (+ ``__clientId``) for a
managed identity; ``SETTLE_TABLE_PREFIX``. Reading is cheap and does no I/O.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

DEVELOPMENT_STORAGE = "UseDevelopmentStorage=true"
# The well-known Azurite account; not a secret (it is published in Azure's documentation).
AZURITE_ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_TABLES = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    f"AccountKey={AZURITE_ACCOUNT_KEY};TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;"
)

_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,29}$")


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_flag(name: str, default: bool = False) -> bool:
    value = env(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class TableSettings:
    """Where Settle's tables live."""

    connection_string: str | None
    service_uri: str | None
    client_id: str | None
    prefix: str

    @classmethod
    def from_env(cls) -> TableSettings:
        conn = env("SETTLE_TABLES")
        uri = env("SETTLE_TABLES__tableServiceUri")
        if conn == DEVELOPMENT_STORAGE:
            conn = AZURITE_TABLES
        if conn is None and uri is None:
            conn = AZURITE_TABLES  # local default: Azurite on its standard port
        prefix = env("SETTLE_TABLE_PREFIX", "settle") or "settle"
        if not _PREFIX_RE.match(prefix):
            raise ValueError(
                "SETTLE_TABLE_PREFIX must start with a letter and hold 1-30 letters or digits "
                f"(Table names are alphanumeric); got {prefix!r}"
            )
        return cls(
            connection_string=None if uri and not env("SETTLE_TABLES") else conn,
            service_uri=uri,
            client_id=env("SETTLE_TABLES__clientId"),
            prefix=prefix,
        )

    def table_name(self, name: str) -> str:
        return f"{self.prefix}{name}"
