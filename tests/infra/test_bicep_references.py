"""The reference check (tests/infra/references.py) passes on infra/ and catches a misspelt name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.bicep import INFRA, bicep_files
from tests.infra.references import unresolved


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_name_and_function_used_exists(path: Path) -> None:
    assert unresolved(path.read_bytes()) == []


@pytest.mark.parametrize(
    ("typo", "fixed"),
    [
        ("scope: hostStorage\n", "scope: hostStorag\n"),
        ("subscriptionResourceId(", "subscriptionResourceID("),
        ("principalId: principalId\n", "principalId: principalID\n"),
    ],
)
def test_a_typo_in_a_reference_is_caught(typo: str, fixed: str) -> None:
    # Given rbac.bicep with one reference misspelt (it still parses)
    source = (INFRA / "modules" / "rbac.bicep").read_text()
    assert typo in source
    broken = source.replace(typo, fixed, 1).encode()
    # Then the reference check reports it
    assert unresolved(broken) != []


def test_a_loop_variable_is_only_known_inside_its_loop() -> None:
    source = b"param xs array\nvar a = [for x in xs: x]\nvar b = x\n"
    assert unresolved(source) == ["3:9 unknown name x"]
