"""Every check of infra/ in one call: syntax, names, types, role IDs, deployment rules, wiring, app
settings, Azure's value rules, dependencies and the deploy script's prompt.

``make test`` runs it (tests/infra/test_typecheck.py) and the mutation test runs it on edited copies of
infra/, naming for each edit the check that must catch it; ``make infra-types`` prints its full report,
skipped checks included:

    python -m tests.infra.infracheck [INFRA_DIR]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.infra.armtypes import TypeData, type_data
from tests.infra.bicep import INFRA
from tests.infra.dependencies import check_dependencies
from tests.infra.deployscript import check_deploy_script
from tests.infra.firststart import check_first_start
from tests.infra.references import unresolved
from tests.infra.report import Finding, Report
from tests.infra.roles import Grant, check_roles
from tests.infra.rules import check_rules
from tests.infra.settings import check_settings
from tests.infra.typecheck.declarations import Checker
from tests.infra.units import load_units
from tests.infra.values import check_values
from tests.infra.wiring import check_wiring

# Each check, by the name the mutation test uses: what it catches.
CHECKS = {
    "syntax": "files that do not parse; names used but not declared",
    "types": "Azure's resource types: API versions, property names, value types, closed sets, reads",
    "roles": "role IDs from the verified list, by name",
    "rules": "Flex Consumption shape, deployment URL, Service Bus 409 ordering, duplicate-detection flag",
    "wiring": "principal ids, client ids, endpoints, connection strings and role scopes traced to their "
    "resource",
    "settings": "every app setting the deployed code reads is set (or deliberately not)",
    "values": "values Azure enforces that the type data does not (tests/infra/values.py, with sources)",
    "dependencies": "no dependency cycle; the app waits for its identity's role assignments",
    "deploy-script": "deploy.sh deploys nothing on Enter, on EOF or after a failing what-if",
    "first-start": "six-field NCRONTAB schedules, storage the app can reach, connection settings that "
    "match the indexed bindings",
}


@dataclass
class InfraCheck:
    report: Report
    grants: list[Grant]
    by_check: dict[str, Report] = field(default_factory=dict)


def check_infra(root: Path = INFRA, types: TypeData | None = None) -> InfraCheck:
    """Run every check over the Bicep files, parameter file, role list and deploy script under ``root``."""
    by_check = {name: Report() for name in CHECKS}
    units = load_units(root, by_check["syntax"])  # reports files that do not parse
    for rel, unit in units.items():
        by_check["syntax"].errors += [Finding(rel, 0, "", "", p) for p in unresolved(unit.source)]
    by_check["types"] = Checker(root, types or type_data(), units).run()
    by_check["roles"], grants = check_roles(root, units)
    by_check["rules"] = check_rules(units)
    by_check["wiring"] = check_wiring(root, units)
    by_check["settings"] = check_settings(units)
    by_check["values"] = check_values(units)
    by_check["dependencies"] = check_dependencies(units)
    by_check["deploy-script"] = check_deploy_script(root)
    by_check["first-start"] = check_first_start(units, root)
    report = Report()
    for part in by_check.values():
        report.merge(part)
    return InfraCheck(report, grants, by_check)


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
