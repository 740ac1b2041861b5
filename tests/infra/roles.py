"""Role definitions: every role assignment in infra/ names a built-in role of infra/builtin-roles.json.

``infra/builtin-roles.json`` is the project's verified list of built-in role IDs (each checked against
several public sources), copied unchanged with its provenance. The Bicep modules read IDs from it by name
(``roles['Azure Service Bus Data Sender']`` over ``loadJsonContent``), so no role ID is typed anywhere
else. This check fails when:

- the name/ID pairs of the file differ from the verified list (``VERIFIED_DIGEST``): an ID edited by
  hand, such as the ``...-1f3c2552ae39`` Data Sender ID that made every deployment fail;
- a GUID is typed in any file of infra/ other than builtin-roles.json;
- a role assignment's ``roleDefinitionId`` is not ``subscriptionResourceId('Microsoft.Authorization/
  roleDefinitions', <roles>['<name>'])`` over that file, or names a role the file does not list.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tests.infra.bicep import Resource
from tests.infra.report import Finding, Report
from tests.infra.trace import Tracer
from tests.infra.units import Unit

ROLES_FILE = "builtin-roles.json"
# sha256 of the sorted [name, id] pairs of the verified reference (shared/reference/azure-builtin-roles.json
# as of 2026-12-01); a new role is added by re-copying the reference and updating this digest with it.
VERIFIED_DIGEST = "4d75c25575807c9645b90a35b6aee5d24b7a6549edb96b0aa8ec5bf77eb3cfd1"
GUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
TEXT_SUFFIXES = {".bicep", ".json", ".sh", ".py", ".md", ".txt", ".yaml", ".yml"}


@dataclass(frozen=True)
class Grant:
    """One role assignment: where it is, the role's name and ID, its scope and principal (as written)."""

    file: str
    symbol: str
    role: str
    role_id: str
    scope: str
    principal: str


def role_table(root: Path) -> dict[str, str]:
    """Role name -> ID from ``root/builtin-roles.json`` (entries starting with ``_`` are notes)."""
    data = json.loads((root / ROLES_FILE).read_text())
    return {name: role_id for name, role_id in data.items() if not name.startswith("_")}


def digest(table: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(table.items())).encode()).hexdigest()


def check_roles(root: Path, units: dict[str, Unit]) -> tuple[Report, list[Grant]]:
    report = Report()
    grants: list[Grant] = []
    try:
        table = role_table(root)
    except (OSError, json.JSONDecodeError) as exc:
        report.errors.append(Finding(ROLES_FILE, 0, "", "", f"unreadable: {exc}"))
        return report, grants
    for name, role_id in table.items():
        if not GUID.fullmatch(role_id):
            report.errors.append(Finding(ROLES_FILE, 0, name, "", f"{role_id!r} is not a GUID"))
    if digest(table) != VERIFIED_DIGEST:
        report.errors.append(
            Finding(
                ROLES_FILE,
                0,
                "",
                "",
                "the name/ID pairs differ from the verified reference: re-copy it, never edit an ID by hand",
            )
        )
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES):
        if path.name == ROLES_FILE:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for guid in GUID.findall(line):
                report.errors.append(
                    Finding(
                        path.relative_to(root).as_posix(),
                        number,
                        "",
                        "",
                        f"GUID {guid} typed here: role IDs come from {ROLES_FILE} by name",
                    )
                )
    tracer = Tracer(units)
    for unit in units.values():
        for res in unit.file.resources:
            if res.type.lower() != "microsoft.authorization/roleassignments" or res.existing:
                continue
            grant = _grant(unit, res, tracer, table, root, report)
            if grant is not None:
                grants.append(grant)
    return report, grants


def _grant(
    unit: Unit, res: Resource, tracer: Tracer, table: dict[str, str], root: Path, report: Report
) -> Grant | None:
    def fail(message: str) -> None:
        report.errors.append(Finding(unit.rel, res.line, res.symbol, "properties.roleDefinitionId", message))

    props = res.body.get("properties", {}) if isinstance(res.body, dict) else {}
    form = tracer.trace(unit, props.get("roleDefinitionId"))
    expected_call = ("call", "subscriptionResourceId", ("lit", "Microsoft.Authorization/roleDefinitions"))
    if form[:3] != expected_call or len(form) != 4:
        shape = "subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['<name>'])"
        fail(f"must be {shape}, is {form}")
        return None
    lookup = form[3]
    # roles['<name>'] over loadJsonContent('<...>/builtin-roles.json')
    if not (
        lookup[0] == "member"
        and lookup[1][:2] == ("call", "loadJsonContent")
        and len(lookup[2]) == 1
        and lookup[2][0][0] in ("index", "prop")
    ):
        fail(f"the role must be looked up by name in {ROLES_FILE}, is {lookup}")
        return None
    source = lookup[1][2]
    step, key = lookup[2][0]
    name = key[1] if step == "index" and key[0] == "lit" else key
    read = os.path.normpath(unit.path.parent / str(source[1]))
    if source[0] != "lit" or read != os.path.normpath(root / ROLES_FILE):
        fail(f"roles must be read from infra/{ROLES_FILE}, not {source}")
        return None
    if name not in table:
        close = [n for n in table if n.lower() == str(name).lower()]
        fail(f"{name!r} is not a role of {ROLES_FILE}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        return None
    scope = res.body.get("scope")
    principal = props.get("principalId")
    return Grant(
        unit.rel,
        res.symbol,
        str(name),
        table[name],
        getattr(scope, "text", str(scope)),
        getattr(principal, "text", str(principal)),
    )
