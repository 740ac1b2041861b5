"""The wiring check (tests/infra/wiring.py) beyond the mutations of test_mutations.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.infra.bicep import INFRA
from tests.infra.report import Report
from tests.infra.units import load_units
from tests.infra.wiring import check_wiring


def wiring_errors(root: Path) -> list[str]:
    return [str(e) for e in check_wiring(root, load_units(root, Report())).errors]


def test_the_infra_is_wired_right() -> None:
    assert wiring_errors(INFRA) == []


def test_the_data_account_given_the_host_account_s_name_in_the_storage_module_call(tmp_path: Path) -> None:
    # The other way to give the data account the host account's name (test_mutations.py has the rbac one).
    root = tmp_path / "infra"
    shutil.copytree(INFRA, root)
    main = root / "main.bicep"
    text = main.read_text()
    assert "dataStorageName: take('std${resourceToken}', 24)" in text
    main.write_text(text.replace("take('std${resourceToken}', 24)", "take('sth${resourceToken}', 24)", 1))
    errors = wiring_errors(root)
    assert any("dataStorage name: the same name as hostStorage" in e for e in errors), errors
