"""infra/deploy.sh and infra/check.sh are valid bash and deploy in the documented order."""

from __future__ import annotations

import subprocess

import pytest

from tests.infra.bicep import INFRA


def commands(name: str) -> list[str]:
    """The script's lines without comments (a crude but sufficient view of what it runs)."""
    lines = (INFRA / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


@pytest.mark.parametrize("name", ["deploy.sh", "check.sh"])
def test_script_is_valid_bash(name: str) -> None:
    result = subprocess.run(["bash", "-n", str(INFRA / name)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_bash_n_rejects_a_broken_script(tmp_path) -> None:
    broken = tmp_path / "deploy.sh"
    broken.write_text((INFRA / "deploy.sh").read_text().replace("\nfi\n", "\n", 1))
    result = subprocess.run(["bash", "-n", str(broken)], capture_output=True, text=True, check=False)
    assert result.returncode != 0


def test_deploy_runs_group_create_what_if_create_then_code_deployment() -> None:
    script = "\n".join(commands("deploy.sh"))
    steps = [
        "az group create",
        "az deployment group what-if",
        "az deployment group create",
        "az functionapp deployment source config-zip",
    ]
    positions = [script.find(step) for step in steps]
    assert all(p >= 0 for p in positions), dict(zip(steps, positions, strict=True))
    assert positions == sorted(positions)
    assert "--build-remote true" in script
    assert "infra/main.bicep" in script and "infra/main.parameters.json" in script
    assert "set -euo pipefail" in script


def test_deploy_never_pushes_local_settings() -> None:
    # func ... --publish-local-settings would upload FUNCTIONS_WORKER_RUNTIME, which Flex rejects.
    assert not any("--publish-local-settings" in line for line in commands("deploy.sh"))


def test_every_deploy_step_is_explained() -> None:
    text = (INFRA / "deploy.sh").read_text()
    for marker in ("# 1.", "# 2.", "# 3.", "# 4."):
        assert marker in text


def test_check_runs_checkov_offline_in_its_own_venv_and_gates_the_json() -> None:
    script = "\n".join(commands("check.sh"))
    assert "--framework bicep" in script and "--skip-download" in script and "--output json" in script
    assert ".venv-checkov" in script
    assert "infra/checkov_gate.py" in script and "infra/checkov-skips.txt" in script
    assert "--external-checks-dir infra/checkov-checks" in script


def test_settles_own_checkov_checks_cover_what_checkov_lacks() -> None:
    # checkov has no Bicep check for these; infra/checkov-checks/ adds them (graph checks in YAML).
    checks = {p.name: p.read_text() for p in (INFRA / "checkov-checks").glob("*.yaml")}
    ids = [
        line.split(":", 1)[1].strip()
        for text in checks.values()
        for line in text.splitlines()
        if line.strip().startswith("id:")
    ]
    assert sorted(ids) == sorted(set(ids)) and all(i.startswith("CKV2_SETTLE_") for i in ids)
    covered = "\n".join(checks.values())
    for attribute in (
        "properties.disableLocalAuth",
        "properties.allowSharedKeyAccess",
        "properties.DisableLocalAuth",
        "properties.features.disableLocalAuth",
        "properties.allow",
    ):
        assert f"attribute: {attribute}\n" in covered, attribute
