"""Every Bicep file parses with the real Bicep grammar (tree-sitter-bicep), and the check can fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.bicep import INFRA, bicep_files, load, syntax_errors

EXPECTED_FILES = {
    "main.bicep",
    "modules/identity.bicep",
    "modules/monitoring.bicep",
    "modules/storage.bicep",
    "modules/servicebus-namespace.bicep",
    "modules/servicebus.bicep",
    "modules/servicebus-rbac.bicep",
    "modules/rbac.bicep",
    "modules/functionapp.bicep",
    "modules/alerts.bicep",
    "modules/stateaccounts.bicep",
    "modules/workbook.bicep",
}


def test_infra_holds_main_and_one_module_per_concern() -> None:
    found = {p.relative_to(INFRA).as_posix() for p in bicep_files()}
    assert found == EXPECTED_FILES


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_bicep_file_parses_without_error_or_missing_nodes(path: Path) -> None:
    # Given a Bicep file of infra/, when it is parsed with the Bicep grammar, then no node is ERROR/MISSING.
    assert syntax_errors(path.read_bytes()) == []


def test_a_deliberately_broken_copy_fails_the_same_check(tmp_path: Path) -> None:
    # Given main.bicep with its last closing brace removed (an unclosed module block)
    source = (INFRA / "main.bicep").read_bytes()
    cut = source.rindex(b"}")
    broken = tmp_path / "main.bicep"
    broken.write_bytes(source[:cut] + source[cut + 1 :])
    # When it is checked, then the check reports the damage
    assert syntax_errors(broken.read_bytes()) != []


@pytest.mark.parametrize(
    "snippet",
    [
        b"param location string = 'westeurope\n",  # unterminated string
        b"resource st 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: 'x'\n",  # unclosed object
        b"var x = [for t in tables 'a']\n",  # malformed loop
        b"output o string = \n",  # missing value
    ],
)
def test_typical_syntax_errors_are_reported(snippet: bytes) -> None:
    assert syntax_errors(snippet) != []


def test_module_references_resolve_to_files_in_infra() -> None:
    main = load(INFRA / "main.bicep")
    assert {m.path for m in main.modules} == EXPECTED_FILES - {"main.bicep"}
    for module in main.modules:
        assert (INFRA / module.path).is_file(), module.path
