"""infra/deploy.sh behaves as documented, driven against a fake `az` that records every call.

The fake answers what the real CLI would (version, account, token, deployment outputs) and keeps the
package handed to `config-zip`, so each test asserts what the script *did*: nothing changes without
--yes or a confirmation, a service principal login works, an old CLI stops it before any change, and the
code package is exactly what .funcignore keeps.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.infra.bicep import INFRA

pytestmark = pytest.mark.heavy  # runs other programs: seconds a test

FAKE_AZ = r"""#!{python}
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_AZ_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
joined = " ".join(args)
if args[:1] == ["version"]:
    print(os.environ.get("FAKE_AZ_VERSION", "2.67.0"))
elif args[:2] == ["account", "show"]:
    if os.environ.get("FAKE_AZ_LOGGED_OUT"):
        sys.exit("Please run 'az login' to setup account.")
    print(os.environ.get("FAKE_AZ_USER_TYPE", "user"))
elif args[:2] == ["account", "get-access-token"]:
    print(os.environ["FAKE_AZ_TOKEN"])
elif args[:2] == ["group", "exists"]:
    print("false" if os.environ.get("FAKE_AZ_NO_GROUP") else "true")
elif args[:2] == ["group", "show"]:
    print(os.environ.get("FAKE_AZ_GROUP_LOCATION", "westeurope"))
elif "--confirm-with-what-if" in args:
    # The real CLI prompts "Are you sure you want to execute the deployment? (y/n)" and, on "n", deploys
    # nothing and still exits 0.
    if not sys.stdin.readline().strip().lower().startswith("y"):
        sys.exit(0)
elif args[:3] == ["deployment", "group", "show"]:
    if "settlementEndpoints" in joined:
        print("Billing\nShipping")
    else:
        print("func-settle-test" if "functionAppName" in joined else "https://func-settle-test.example")
elif args[:4] == ["functionapp", "deployment", "source", "config-zip"]:
    shutil.copy(args[args.index("--src") + 1], os.environ["FAKE_AZ_PACKAGE"])
"""


def token(oid: str) -> str:
    def part(data: dict[str, str]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'oid': oid, 'tid': 't'})}.signature"


class Run:
    def __init__(self, result: subprocess.CompletedProcess[str], log: Path, package: Path) -> None:
        self.code = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        self.calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        self.package = package

    def called(self, *prefix: str) -> list[list[str]]:
        return [c for c in self.calls if c[: len(prefix)] == list(prefix)]


Deploy = Callable[..., Run]


@pytest.fixture
def deploy(tmp_path: Path) -> Deploy:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "az"
    fake.write_text(FAKE_AZ.replace("{python}", sys.executable))
    fake.chmod(0o755)

    def run(*args: str, answer: str | None = None, **env: str) -> Run:
        """Run deploy.sh; with ``answer``, on a terminal that has that typed in already."""
        log, package = tmp_path / "calls.jsonl", tmp_path / "package.zip"
        log.unlink(missing_ok=True)
        environment = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_AZ_LOG": str(log),
            "FAKE_AZ_PACKAGE": str(package),
            "FAKE_AZ_TOKEN": token("11111111-2222-3333-4444-555555555555"),
            **env,
        }
        terminal = None
        if answer is not None:
            terminal = pty.openpty()
            os.write(terminal[0], answer.encode())  # type-ahead: read by the first prompt
        try:
            result = subprocess.run(
                ["bash", str(INFRA / "deploy.sh"), *args],
                capture_output=True,
                text=True,
                env=environment,
                # Without an answer no terminal: confirmation impossible.
                stdin=subprocess.DEVNULL if terminal is None else terminal[1],
                timeout=120,
                check=False,
            )
        finally:
            if terminal is not None:
                os.close(terminal[0])
                os.close(terminal[1])
        return Run(result, log, package)

    return run


def test_script_is_valid_bash() -> None:
    for name in ("deploy.sh", "check.sh"):
        result = subprocess.run(
            ["bash", "-n", str(INFRA / name)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr


def test_without_yes_and_without_a_terminal_nothing_is_touched(deploy: Deploy) -> None:
    run = deploy("rg-settle", "westeurope", "prod")
    assert run.code == 2 and "--what-if" in run.stderr and "--yes" in run.stderr
    assert run.calls == []


def test_what_if_previews_and_changes_nothing(deploy: Deploy) -> None:
    run = deploy("--what-if", "rg-settle", "westeurope", "prod")
    assert run.code == 0, run.stderr
    assert run.called("deployment", "group", "what-if")
    changing = [
        c for c in run.calls if c[:2] == ["group", "create"] or "create" in c[:3] or "config-zip" in c
    ]
    assert changing == []


def changes(run: Run) -> list[list[str]]:
    """The calls that create or change something in Azure."""
    return [
        c
        for c in run.calls
        if c[:2] == ["group", "create"] or c[:3] == ["deployment", "group", "create"] or "config-zip" in c
    ]


def test_declining_the_confirmation_changes_nothing(deploy: Deploy) -> None:
    # Given a terminal on which the operator answers "n" after reading the what-if
    run = deploy("rg-settle", "westeurope", "prod", answer="n\n")
    # Then the what-if was shown, and neither the infrastructure nor the code was touched
    assert run.called("deployment", "group", "what-if"), run.stderr
    assert changes(run) == [], run.calls
    assert run.code != 0 and "nothing was deployed" in run.stderr


def test_confirming_deploys_infrastructure_then_code(deploy: Deploy) -> None:
    run = deploy("rg-settle", "westeurope", "prod", answer="y\n")
    assert run.code == 0, run.stderr
    assert run.called("deployment", "group", "what-if")
    # The group exists: it is not re-created (that would clear its tags)
    assert [c[:3] for c in changes(run)] == [
        ["deployment", "group", "create"],
        ["functionapp", "deployment", "source"],
    ]


def test_a_new_resource_group_is_created_only_after_the_confirmation(deploy: Deploy) -> None:
    # what-if needs an existing group, so for a new one the script says everything would be created
    declined = deploy("rg-new", "westeurope", "prod", answer="n\n", FAKE_AZ_NO_GROUP="1")
    assert changes(declined) == [] and "does not exist yet" in declined.stderr
    assert not declined.called("deployment", "group", "what-if")
    confirmed = deploy("rg-new", "westeurope", "prod", answer="y\n", FAKE_AZ_NO_GROUP="1")
    assert confirmed.code == 0, confirmed.stderr
    assert [c[:2] for c in changes(confirmed)][:2] == [["group", "create"], ["deployment", "group"]]


def test_yes_deploys_infrastructure_then_the_code_package(deploy: Deploy) -> None:
    run = deploy("--yes", "rg-settle", "westeurope", "prod", "alertEmail=ops@example.com")
    assert run.code == 0, run.stderr
    verbs = [" ".join(c[:4]) for c in run.calls if c[0] != "version"]
    assert verbs.index("deployment group create --resource-group") < verbs.index(
        "functionapp deployment source config-zip"
    )
    assert "group create --name rg-settle" not in verbs  # it exists: `az group create` would clear its tags
    [deployment] = run.called("deployment", "group", "create")
    assert "--confirm-with-what-if" not in deployment
    assert "environmentName=prod" in deployment and "alertEmail=ops@example.com" in deployment
    assert deployment[deployment.index("--template-file") + 1] == "infra/main.bicep"
    [push] = run.called("functionapp", "deployment", "source", "config-zip")
    assert (
        push[push.index("--build-remote") + 1] == "true"
        and push[push.index("--name") + 1] == "func-settle-test"
    )
    # The code package is the app and nothing else (tests/infra/test_package.py pins the list).
    names = zipfile.ZipFile(run.package).namelist()
    assert {"function_app.py", "host.json", "requirements.txt", "handoff/settlement/settler.py"} <= set(names)
    assert not [n for n in names if n.startswith(("tests/", "infra/", ".venv", "bench/"))]
    # Its only pycs are the shipped modules' own, compiled by infra/package.py for the app's Python.
    shipped = {n for n in names if n.endswith(".py")}
    pycs = {n for n in names if n.endswith(".pyc")}
    assert pycs == {
        n.rsplit("/", 1)[0] + "/__pycache__/" + n.rsplit("/", 1)[-1][:-3] + ".cpython-313.pyc"
        if "/" in n
        else "__pycache__/" + n[:-3] + ".cpython-313.pyc"
        for n in shipped
    }


def test_yes_creates_a_missing_resource_group_first(deploy: Deploy) -> None:
    run = deploy("--yes", "rg-new", "westeurope", "prod", FAKE_AZ_NO_GROUP="1")
    assert run.code == 0, run.stderr
    assert [c[:4] for c in changes(run)][:2] == [
        ["group", "create", "--name", "rg-new"],
        ["deployment", "group", "create", "--resource-group"],
    ]


def test_a_service_principal_login_gets_developer_access_as_a_service_principal(deploy: Deploy) -> None:
    run = deploy(
        "--yes", "rg-settle", "westeurope", SETTLE_DEVELOPER_ACCESS="1", FAKE_AZ_USER_TYPE="servicePrincipal"
    )
    assert run.code == 0, run.stderr
    [deployment] = run.called("deployment", "group", "create")
    assert "developerPrincipalId=11111111-2222-3333-4444-555555555555" in deployment
    assert "developerPrincipalType=ServicePrincipal" in deployment
    assert not run.called("ad")  # no Microsoft Graph call (az ad signed-in-user fails for a principal)


def test_an_old_cli_or_no_login_stops_before_any_change(deploy: Deploy) -> None:
    old = deploy("--yes", "rg-settle", "westeurope", FAKE_AZ_VERSION="2.59.1")
    assert old.code == 1 and "older than 2.60.0" in old.stderr
    logged_out = deploy("--yes", "rg-settle", "westeurope", FAKE_AZ_LOGGED_OUT="1")
    assert logged_out.code == 1 and "az login" in logged_out.stderr
    for run in (old, logged_out):
        assert not [c for c in run.calls if c[:2] in (["group", "create"], ["deployment", "group"])]


def test_skip_code_deploys_the_infrastructure_only(deploy: Deploy) -> None:
    run = deploy("--yes", "rg-settle", "westeurope", SETTLE_SKIP_CODE="1")
    assert run.code == 0 and run.called("deployment", "group", "create")
    assert not run.called("functionapp")


def test_deploy_never_pushes_local_settings() -> None:
    # func ... --publish-local-settings would upload FUNCTIONS_WORKER_RUNTIME, which Flex rejects.
    commands = [
        line for line in (INFRA / "deploy.sh").read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    assert not any("--publish-local-settings" in line for line in commands)


def test_check_runs_the_infra_checks_and_checkov_offline_in_its_own_venv() -> None:
    script = (INFRA / "check.sh").read_text()
    assert "tests.infra.infracheck" in script
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


@pytest.mark.parametrize("name", ["Prod_EU", "dev-", "-dev", "test--eu", "prod eu", "1prod", "a" * 17])
def test_a_bad_environment_name_stops_the_script_before_any_call(deploy: Deploy, name: str) -> None:
    # Such names failed part-way through a deployment (container and resource names).
    run = deploy("--yes", "rg-settle", "westeurope", name)
    assert run.code == 2 and "invalid environment name" in run.stderr, run.stderr
    assert run.calls == []


@pytest.mark.parametrize("name", ["dev", "prod", "test-eu1", "a" * 16])
def test_good_environment_names_pass_the_check(name: str) -> None:
    result = subprocess.run(
        ["bash", str(INFRA / "environment-name.sh"), name], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_azd_checks_the_environment_name_before_it_provisions() -> None:
    # azd's preprovision hook runs before any resource is created; the same script as deploy.sh.
    azure = (INFRA.parent / "azure.yaml").read_text()
    hook = azure.split("preprovision:", 1)[1].split("services:", 1)[0]
    assert 'run: bash infra/environment-name.sh "$AZURE_ENV_NAME"' in hook
    result = subprocess.run(
        ["sh", "-c", 'bash infra/environment-name.sh "$AZURE_ENV_NAME"'],
        cwd=INFRA.parent,
        env={**os.environ, "AZURE_ENV_NAME": "Prod_EU"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "invalid environment name" in result.stderr


def test_the_deployment_says_which_endpoints_settlement_may_send_to(deploy: Deploy) -> None:
    # Data Sender is granted per listed endpoint topic; a settlement to another endpoint is
    # refused by Service Bus, so the deployment names the endpoints it covers.
    run = deploy("--yes", "rg-settle", "westeurope", SETTLE_SKIP_CODE="1")
    assert run.code == 0, run.stderr
    assert "settlement may send to these endpoints only: Billing Shipping" in run.stdout
    assert "add it to the endpoints parameter" in run.stdout


def test_a_resource_group_in_another_location_stops_the_deploy_saying_where_it_is(deploy: Deploy) -> None:
    run = deploy("--yes", "rg-settle", "northeurope", "prod", FAKE_AZ_GROUP_LOCATION="westeurope")
    assert run.code == 1
    assert "rg-settle is in westeurope, not northeurope" in run.stderr
    assert changes(run) == []
    # Azure's location names ignore case and spaces ("West Europe" is westeurope).
    same = deploy("--yes", "rg-settle", "West Europe", "prod", FAKE_AZ_GROUP_LOCATION="westeurope")
    assert same.code == 0, same.stderr


def test_each_deployment_has_its_own_name_and_the_outputs_come_from_it(deploy: Deploy) -> None:
    names = []
    for _ in range(2):
        run = deploy("--yes", "rg-settle", "westeurope", "prod")
        assert run.code == 0, run.stderr
        [create] = run.called("deployment", "group", "create")
        name = create[create.index("--name") + 1]
        assert re.fullmatch(r"settle-\d{8}-\d{6}-[0-9a-f]{4}", name), name
        shows = run.called("deployment", "group", "show")
        assert shows and {show[show.index("--name") + 1] for show in shows} == {name}
        names.append(name)
    assert names[0] != names[1]
