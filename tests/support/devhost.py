"""The environment of a development host (``python -m devtools.host``) that a test starts as a process of
its own: on the test's Azurite and table prefix, projecting what it sends (the loopback transport), and
never with the developer's Service Bus or function key."""

from __future__ import annotations

import os

# Never inherited from the shell that runs the tests: a test that wants one sets it.
UNSET = frozenset(
    {"ServiceBusConnection", "ServiceBusConnection__fullyQualifiedNamespace", "SETTLE_DEV_FUNCTION_KEY"}
)


def host_environment(connection: str, prefix: str, **settings: str) -> dict[str, str]:
    """``os.environ`` without :data:`UNSET`, pointed at ``connection`` with ``prefix``; then ``settings``,
    which may name other tables."""
    environ = {k: v for k, v in os.environ.items() if k not in UNSET}
    environ.update(
        SETTLE_TABLES=connection,
        SETTLE_TABLE_PREFIX=prefix,
        SETTLE_LOOPBACK="true",
        PYTHONUNBUFFERED="1",
    )
    environ.update(settings)  # a test's own settings win, its tables included
    return environ
