"""The pinned runtime driven as the host drives it (``devtools.worker.py``), once per test process.

The runtime keeps its function registry and thread pool in module globals, as one worker process does:
one :class:`~devtools.worker.Worker` serves every conformance test of the session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devtools.worker import Worker


@pytest.fixture(scope="session")
def worker() -> Iterator[Worker]:
    driven = Worker()
    init = driven.start()
    assert init.result.status == 1, init.result.exception.message  # StatusResult.Success
    for name in driven.metadata:
        loaded = driven.load(name)
        assert loaded.result.status == 1, f"{name}: {loaded.result.exception.message}"
    yield driven
    driven.close()


# The telemetry suite's recorder (spans in memory) and the hand-off suite's message builders.
from tests.handoff.conftest import flow  # noqa: E402, F401
from tests.telemetry.conftest import otel  # noqa: E402, F401
