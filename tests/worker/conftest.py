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
    failures = driven.start_and_load()
    assert not failures, failures
    yield driven
    driven.close()


# The telemetry suite's recorder (spans in memory) and the hand-off suite's message builders.
from tests.handoff.conftest import flow  # noqa: E402, F401
from tests.telemetry.conftest import otel  # noqa: E402, F401
