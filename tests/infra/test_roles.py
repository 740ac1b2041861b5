"""Role IDs: infra/builtin-roles.json is the verified list, and nothing else in the repository types one.

The Bicep modules read each role by name from that file; tests/infra/roles.py (part of the infra checks)
resolves every role assignment to its name and ID. Here: the file itself, and the whole repository.
"""

from __future__ import annotations

import json
import subprocess

from tests.infra.bicep import INFRA, REPO
from tests.infra.infracheck import InfraCheck
from tests.infra.roles import GUID, ROLES_FILE, VERIFIED_DIGEST, digest, role_table


def test_the_role_list_is_the_verified_one_with_its_provenance() -> None:
    data = json.loads((INFRA / ROLES_FILE).read_text())
    assert "verified" in data["_about"] or "checked against" in data["_about"]
    assert "sha256" in data["_provenance"]
    table = role_table(INFRA)
    assert digest(table) == VERIFIED_DIGEST
    assert all(GUID.fullmatch(role_id) for role_id in table.values())
    assert len(set(table.values())) == len(table)  # one ID per name


def test_every_role_assignment_resolves_to_a_listed_name_and_its_id(infra_check: InfraCheck) -> None:
    table = role_table(INFRA)
    grants = infra_check.grants
    assert len(grants) == 12
    for grant in grants:
        assert table[grant.role] == grant.role_id, grant
    # The ID that made every deployment fail is nowhere.
    assert all(not g.role_id.endswith("1f3c2552ae39") for g in grants)


def test_no_role_id_is_typed_anywhere_else_in_the_repository() -> None:
    role_ids = {role_id.lower() for role_id in role_table(INFRA).values()}
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    found = []
    for name in filter(None, tracked):
        path = REPO / name
        if name == f"infra/{ROLES_FILE}" or not path.is_file():
            continue
        text = path.read_text(errors="replace").lower()
        found += [f"{name}: {role_id}" for role_id in role_ids if role_id in text]
        # Outside the tests (whose GUIDs are made-up principals and keys), no GUID at all: a role ID typed
        # in a doc or a script, right or wrong (the ...-1f3c2552ae39 one was copied from a sample), is a
        # second copy.
        if not name.startswith("tests/"):
            found += [f"{name}: {guid}" for guid in GUID.findall(text)]
    assert found == []
