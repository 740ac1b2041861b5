"""Every check of infra/ in one call: syntax, names, types, role IDs and deployment rules.

``make test`` runs it (tests/infra/test_infracheck.py) and the mutation test runs it on edited copies of
infra/; ``make infra-types`` prints its full report, skipped checks included:

    python -m tests.infra.infracheck [INFRA_DIR]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tests.infra.armtypes import TypeData, type_data
from tests.infra.bicep import INFRA
from tests.infra.references import unresolved
from tests.infra.report import Finding, Report
from tests.infra.roles import Grant, check_roles
from tests.infra.rules import check_rules
from tests.infra.typecheck import Checker
from tests.infra.units import load_units


@dataclass
class InfraCheck:
    report: Report
    grants: list[Grant]


def check_infra(root: Path = INFRA, types: TypeData | None = None) -> InfraCheck:
    """Run every check over the Bicep files, parameter file and role list under ``root``."""
    report = Report()
    units = load_units(root, report)  # reports files that do not parse
    for rel, unit in units.items():
        report.errors += [Finding(rel, 0, "", "", problem) for problem in unresolved(unit.source)]
    report.merge(Checker(root, types or type_data(), units).run())
    roles_report, grants = check_roles(root, units)
    report.merge(roles_report)
    report.merge(check_rules(units))
    return InfraCheck(report, grants)


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else INFRA
    result = check_infra(root)
    print(result.report.text())
    print(f"role assignments: {len(result.grants)}")
    for grant in result.grants:
        where = f"{grant.file} {grant.symbol}"
        print(f"  {where}: {grant.role} ({grant.role_id}) on {grant.scope} to {grant.principal}")
    return 0 if result.report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
