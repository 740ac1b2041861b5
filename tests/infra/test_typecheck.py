"""The type check (tests/infra/typecheck/): infra/ passes it whole, and each kind of mistake it promises to
catch is caught in a small template of its own (the mutation test does the same on copies of infra/).

The report of the real infra/ is printed (``pytest -s``, or ``make infra-types``), skipped checks included.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.infra.armtypes import type_data
from tests.infra.bicep import INFRA, bicep_files, load
from tests.infra.conftest import SUMMARY
from tests.infra.infracheck import InfraCheck
from tests.infra.report import Report
from tests.infra.typecheck.declarations import type_check


@pytest.fixture(scope="module")
def infra_report(infra_check: InfraCheck) -> Report:
    report = infra_check.report
    SUMMARY.append(f"{report.summary()} (what was skipped and why: make infra-types)")
    return report


def test_infra_passes_every_check_and_shows_what_it_skipped(infra_report: Report) -> None:
    print(infra_report.text())  # the skipped checks, each with its reason
    assert infra_report.errors == [], infra_report.text()


def test_every_resource_and_module_of_every_file_is_checked(infra_report: Report) -> None:
    files = [load(p) for p in bicep_files()]
    assert infra_report.files == len(files) == 12
    assert infra_report.resources == sum(len(f.resources) for f in files) >= 50
    assert infra_report.modules == sum(len(f.modules) for f in files) == 11
    # Skips are the exception, not the rule: most values have a type the check can know.
    assert infra_report.properties >= 500 and infra_report.reads >= 80
    assert len(infra_report.skipped) <= 50, infra_report.text()
    assert all(s.message for s in infra_report.skipped)


def test_every_vendored_type_file_is_used_by_infra() -> None:
    used = {
        (r.type.split("/")[0].lower(), r.api_version) for f in map(load, bicep_files()) for r in f.resources
    }
    vendored = {tuple(v.split("/")[:2]) for v in type_data().vendored()}
    assert vendored == used


def check(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [str(e) for e in type_check(tmp_path, type_data()).errors]


STORAGE = """
param location string = 'westeurope'
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: 'settleexample'
  location: location
  kind: 'StorageV2'
  sku: {
    name: 'Standard_ZRS'
  }
%s}
"""


def test_a_clean_template_passes(tmp_path: Path) -> None:
    assert check(tmp_path, {"main.bicep": STORAGE % ""}) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "  properties: {\n    allowSharedKeyAcess: false\n  }\n",
            "unknown property (did you mean allowSharedKeyAccess?)",
        ),
        ("  properties: {\n    AllowSharedKeyAccess: false\n  }\n", "property names are case-sensitive"),
        ("  properties: {\n    allowSharedKeyAccess: 'false'\n  }\n", "is a string, but a bool belongs here"),
        (
            "  properties: {\n    accessTier: 'Warm'\n  }\n",
            "is not one of ['Hot', 'Cool', 'Premium', 'Cold']",
        ),
        ("  properties: {\n    minimumTlsVersion: 'TLS1_4'\n  }\n", "is not a known value"),
        ("  properties: {\n    primaryLocation: 'westeurope'\n  }\n", "read-only property"),
        (
            "  properties: {\n    keyPolicy: {}\n  }\n",
            "keyPolicy.keyExpirationPeriodInDays: required property is missing",
        ),
        ("  properties: {\n    networkAcls: {\n      ipRules: {}\n    }\n  }\n", "an object where array of"),
    ],
)
def test_property_mistakes_are_caught(tmp_path: Path, body: str, expected: str) -> None:
    errors = check(tmp_path, {"main.bicep": STORAGE % body})
    assert any(expected in e for e in errors), errors


def test_a_missing_required_top_level_property_and_a_bad_literal_name(tmp_path: Path) -> None:
    template = (
        STORAGE.replace("  kind: 'StorageV2'\n", "").replace("'settleexample'", "'Settle_Example'") % ""
    )
    errors = check(tmp_path, {"main.bicep": template})
    assert any("account kind: required property is missing" in e for e in errors), errors
    assert any("does not match ^[a-z0-9]+$" in e for e in errors), errors


def test_nested_resources_loops_conditions_and_existing_are_checked(tmp_path: Path) -> None:
    template = STORAGE % (
        "  resource blobs 'blobServices' = {\n"
        "    name: 'default'\n"
        "    resource containers 'containers' = [for c in ['a', 'b']: if (true) {\n"
        "      name: c\n"
        "      properties: {\n"
        "        publicAccess: 'Nobody'\n"
        "      }\n"
        "    }]\n"
        "  }\n"
    )
    template += (
        "resource old 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {\n"
        "  name: 'other'\n"
        "  sku: {\n"
        "    name: 'Standard_LRS'\n"
        "  }\n"
        "}\n"
        "output blobId string = account::blobs.id\n"
        "output lastSync string = account::blobs.properties.lastSyncTime\n"
    )
    errors = check(tmp_path, {"main.bicep": template})
    # the nested loop's body, typed as storageAccounts/blobServices/containers with the parent's API version
    assert any("account::blobs::containers properties.publicAccess" in e for e in errors), errors
    assert any("old sku: an existing resource takes only name, parent and scope" in e for e in errors), errors
    assert any("account::blobs.properties has no property lastSyncTime" in e for e in errors), errors
    assert not any("blobId" in e for e in errors), errors


def test_a_child_with_the_wrong_parent_or_name(tmp_path: Path) -> None:
    template = STORAGE % "" + (
        "resource tables 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {\n"
        "  parent: account\n"
        "  name: 'default/extra'\n"
        "}\n"
        "resource queue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {\n"
        "  parent: tables\n"
        "  name: 'q'\n"
        "}\n"
    )
    errors = check(tmp_path, {"main.bicep": template})
    assert any("takes only its own name segment" in e for e in errors), errors
    assert any("must be a Microsoft.Storage/storageAccounts/queueServices, not a" in e for e in errors), (
        errors
    )


def test_parameters_feed_closed_sets_through_allowed(tmp_path: Path) -> None:
    template = STORAGE.replace("name: 'Standard_ZRS'", "name: sku").replace(
        "param location",
        "@allowed([\n  'Standard_ZRS'\n  'Standard_ZRX'\n])\nparam sku string\nparam location",
    )
    errors = check(tmp_path, {"main.bicep": template % ""})
    assert any('"Standard_ZRX" is not a known value' in e for e in errors), errors
    # Without @allowed the closed set cannot be verified: skipped, and the report says so.
    free = STORAGE.replace("name: 'Standard_ZRS'", "name: sku").replace(
        "param location", "param sku string\nparam location"
    )
    report = type_check(_write(tmp_path / "free", {"main.bicep": free % ""}), type_data())
    assert report.errors == []
    assert any("not verifiable without @allowed" in str(s) for s in report.skipped), report.text()


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_both_branches_of_a_conditional_and_variables_are_checked(tmp_path: Path) -> None:
    body = "  properties: {\n    accessTier: hot ? 'Hot' : 'Warm'\n    encryption: enc\n  }\n"
    template = (
        "param hot bool\nvar enc = {\n  keySource: 'Microsoft.Keyvault'\n  bogus: 1\n}\n" + STORAGE % body
    )
    errors = check(tmp_path, {"main.bicep": template})
    assert any('"Warm" is not one of' in e for e in errors), errors
    assert any("properties.encryption.bogus: unknown property" in e for e in errors), errors


def test_discriminated_objects_pick_their_variant(tmp_path: Path) -> None:
    template = """
resource alert 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'a'
  location: 'global'
  properties: {
    severity: 2
    enabled: true
    scopes: []
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.WebtestLocationAvailabilityCriteria'
      webTestId: 'x'
      componentId: 'y'
      allOf: []
    }
  }
}
"""
    errors = check(tmp_path, {"main.bicep": template})
    assert any("criteria.failedLocationCount: required property is missing" in e for e in errors), errors
    assert any("criteria.allOf: unknown property" in e for e in errors), errors


def test_modules_parameters_and_outputs(tmp_path: Path) -> None:
    files = {
        "main.bicep": (
            "module m 'mod.bicep' = {\n"
            "  name: 'm'\n"
            "  params: {\n"
            "    count: '3'\n"
            "    colour: 'red'\n"
            "  }\n"
            "}\n"
            "output a string = m.outputs.size\n"
            "output b string = m.outputs.sizes\n"
        ),
        "mod.bicep": "@minValue(1)\nparam count int\nparam mode string\noutput size int = count\n",
        "main.parameters.json": json.dumps({"parameters": {"nothing": {"value": 1}}}),
    }
    errors = check(tmp_path, files)
    assert any('params.count: "3" is a string, but an int belongs here' in e for e in errors), errors
    assert any("mod.bicep has no parameter colour" in e for e in errors), errors
    assert any("params.mode: required parameter of mod.bicep is missing" in e for e in errors), errors
    assert any("output a: m.outputs.size is an int, but a string belongs here" in e for e in errors), errors
    assert any("has no output sizes (did you mean size?)" in e for e in errors), errors
    assert any("main.bicep has no parameter nothing" in e for e in errors), errors


def test_json_lookups_and_loops_over_resources(tmp_path: Path) -> None:
    files = {
        "roles.json": json.dumps({"Reader": "not-a-real-role-id"}),
        "main.bicep": (
            "var roles = loadJsonContent('roles.json')\n"
            "var ok = roles['Reader']\n"
            "var typo = roles['Raeder']\n"
            "resource ids 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = [\n"
            "  for n in ['a', 'b']: {\n"
            "    name: n\n"
            "    location: 'westeurope'\n"
            "  }\n"
            "]\n"
            "output first string = ids[0].properties.clientId\n"
            "output all string = ids.properties.clientId\n"
        ),
    }
    errors = check(tmp_path, files)
    assert any("roles has no key 'Raeder' (did you mean Reader?)" in e for e in errors), errors
    assert any("ids is a resource loop: index it" in e for e in errors), errors
    assert not any("first" in e for e in errors), errors


def test_types_that_do_not_exist_or_are_not_vendored(tmp_path: Path) -> None:
    files = {
        "main.bicep": (
            "resource a 'Microsoft.Web/sitez@2024-04-01' = {\n  name: 'a'\n}\n"
            "resource b 'Microsoft.Web/sites@2025-03-01' = {\n  name: 'b'\n  location: 'x'\n}\n"
        )
    }
    errors = check(tmp_path, files)
    assert any("resource type Microsoft.Web/sitez does not exist" in e for e in errors), errors
    assert any("Microsoft.Web/sites@2025-03-01 exists but its type data is not vendored" in e for e in errors)


def test_members_of_a_literal_array_a_loop_iterates_are_type_checked(tmp_path: Path) -> None:
    # `for alert in settleLogAlerts: { severity: alert.severity }` was skipped as "loop variable".
    root = tmp_path / "infra"
    shutil.copytree(INFRA, root)
    alerts = root / "modules" / "alerts.bicep"
    text = alerts.read_text()
    assert "    severity: 2\n    windowSize: 'PT15M'\n" in text
    alerts.write_text(
        text.replace(
            "    severity: 2\n    windowSize: 'PT15M'\n", "    severity: 'High'\n    windowSize: 'PT15M'\n", 1
        )
    )
    report = type_check(root, type_data())
    assert any(
        "settleSignals properties.severity" in str(e)
        and '"High" (alert.severity, item 1) is a string, but an int belongs here' in str(e)
        for e in report.errors
    ), report.text()
    # and the unmutated alert list is checked, not skipped
    clean = type_check(INFRA, type_data())
    assert not [s for s in clean.skipped if "alert." in str(s) and "loop variable" in str(s)]
