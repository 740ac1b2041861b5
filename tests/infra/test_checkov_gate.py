"""infra/checkov_gate.py: the CI judgement of checkov's JSON report, and the accepted-findings list."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.infra.bicep import INFRA


def gate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checkov_gate", INFRA / "checkov_gate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def report(failed: list[tuple[str, str]], passed: int = 3, parsing_errors: list[str] | None = None) -> Any:
    return {
        "check_type": "bicep",
        "summary": {
            "passed": passed,
            "failed": len(failed),
            "parsing_errors": len(parsing_errors or []),
            "resource_count": 5,
        },
        "results": {
            "passed_checks": [{"check_id": "CKV_AZURE_3"}] * passed,
            "failed_checks": [
                {"check_id": c, "resource": r, "check_name": "n", "file_path": "/modules/x.bicep"}
                for c, r in failed
            ],
            "parsing_errors": parsing_errors or [],
        },
    }


SKIPS = "# comment\nCKV_AZURE_35 * no VNet\nCKV_AZURE_78 Microsoft.Web/sites.site Flex has no ftpsState\n"


def test_accepted_failures_pass() -> None:
    g = gate()
    verdict = g.evaluate(
        report(
            [
                ("CKV_AZURE_35", "Microsoft.Storage/storageAccounts.a"),
                ("CKV_AZURE_78", "Microsoft.Web/sites.site"),
            ]
        ),
        g.load_skips(SKIPS),
    )
    assert verdict.ok and len(verdict.accepted) == 2


def test_an_unaccepted_failure_fails() -> None:
    g = gate()
    verdict = g.evaluate(
        report(
            [("CKV_AZURE_35", "x.a"), ("CKV_AZURE_78", "Microsoft.Web/sites.site"), ("CKV_AZURE_44", "x.a")]
        ),
        g.load_skips(SKIPS),
    )
    assert not verdict.ok and len(verdict.unaccepted) == 1 and "CKV_AZURE_44" in verdict.unaccepted[0]


def test_a_skip_for_one_resource_does_not_cover_another() -> None:
    g = gate()
    verdict = g.evaluate(
        report([("CKV_AZURE_35", "x.a"), ("CKV_AZURE_78", "Microsoft.Web/sites.other")]), g.load_skips(SKIPS)
    )
    assert not verdict.ok and verdict.stale == ["CKV_AZURE_78 Microsoft.Web/sites.site"]


def test_a_parsing_error_fails_even_though_checkov_exits_zero() -> None:
    g = gate()
    verdict = g.evaluate(
        report(
            [("CKV_AZURE_35", "x.a"), ("CKV_AZURE_78", "Microsoft.Web/sites.site")],
            parsing_errors=["/x.bicep"],
        ),
        g.load_skips(SKIPS),
    )
    assert not verdict.ok and verdict.parsing_errors == ["/x.bicep"]


def test_an_empty_run_fails() -> None:
    g = gate()
    empty = report([], passed=0)
    empty["summary"]["resource_count"] = 0
    assert not g.evaluate(empty, []).ok


def test_a_skip_without_reason_is_rejected() -> None:
    with pytest.raises(ValueError):
        gate().load_skips("CKV_AZURE_35 *\n")


def test_main_reads_files_and_returns_the_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    g = gate()
    skips = tmp_path / "skips.txt"
    skips.write_text(SKIPS)
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps([report([("CKV_AZURE_35", "x.a"), ("CKV_AZURE_78", "Microsoft.Web/sites.site")])])
    )
    assert g.main(["gate", str(good), str(skips)]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text("")
    assert g.main(["gate", str(bad), str(skips)]) == 1
    assert "checkov:" in capsys.readouterr().out


def test_the_projects_skip_list_loads_and_every_entry_has_a_reason() -> None:
    skips = gate().load_skips((INFRA / "checkov-skips.txt").read_text())
    assert skips
    assert all(len(s.reason.split()) >= 4 for s in skips)
    # Service Bus has no checkov Bicep checks at all; its policy lives in tests/infra/test_policy.py.
    assert not any("ServiceBus" in s.resource for s in skips)
