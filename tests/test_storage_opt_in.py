"""Storage is opt-in (tests/conftest.py): a test that reaches Table Storage without asking for it fails at
once, naming itself, instead of passing only when another test started Azurite, or waiting on retries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import NO_STORAGE, STORAGE_GUARD, Caller

ROOT = Path(__file__).resolve().parents[1]
KEY = {"tenantId": 1, "scopeId": 4, "entityId": 1, "itemKey": "unit", "itemEntityKey": "invoice"}


def test_a_pure_test_that_reaches_storage_is_refused_at_once_and_would_fail(
    functions: dict[str, Any],
) -> None:
    # given a test that asked for no storage, calling a function that reads a state record
    started = time.monotonic()
    answer = Caller(functions)("state_exists", {"key": KEY})
    refused, STORAGE_GUARD.refused = STORAGE_GUARD.refused, []  # this test provoked it on purpose
    # then storage was never reached: the guard refused the first request, before any retry could wait
    assert refused and all("/Tables" in url or "devstoreaccount1" in url for url in refused), refused
    assert answer.status >= 500, answer.body
    assert time.monotonic() - started < 5.0
    # and the complaint that fails such a test says how to ask for storage
    STORAGE_GUARD.refused = refused[:1]
    complaint = STORAGE_GUARD.complaint()
    STORAGE_GUARD.refused = []
    assert complaint is not None and 'usefixtures("settle_tables")' in complaint


STRAY = """
from tests.conftest import Caller


def test_reads_a_record_without_asking_for_storage(functions):
    answer = Caller(functions)("state_exists", {"key": %r})
    assert answer.status in (200, 404, 500, 503)
"""


@pytest.mark.heavy
def test_the_unit_loop_fails_a_stray_storage_test_loudly_with_no_storage_reachable(tmp_path: Path) -> None:
    # given a test module that reaches storage without asking, run as make test-unit runs, with the test
    # storage pointing at a closed port
    stray = tmp_path / "test_stray.py"
    stray.write_text(STRAY % (KEY,), encoding="utf-8")
    env = {**os.environ, "SETTLE_TEST_AZURITE": NO_STORAGE}
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-c",
            str(ROOT / "pyproject.toml"),
            str(stray),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # then it fails, saying why, in seconds
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "reached Table Storage" in output and 'usefixtures("settle_tables")' in output, output
    assert time.monotonic() - started < 60, output
