"""The infra checks are themselves checked: each edit below breaks a copy of infra/ the way a real change
could, and the checks (tests/infra/infracheck.py: syntax, names, types, role IDs, deployment rules) must
report it, for the right reason.

The first eight are the edits that kept the old infra tests passing while `az deployment group create`
failed (issue 12); the rest are ours. The vendored type data is parsed once and shared by every mutant.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.infra.armtypes import type_data
from tests.infra.bicep import INFRA
from tests.infra.infracheck import check_infra
from tests.infra.roles import role_table

# Never typed here: read from the verified list, like the Bicep does.
SENDER = role_table(INFRA)["Azure Service Bus Data Sender"]


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    edits: tuple[tuple[str, str], ...]  # (text, replacement), each applied to its first occurrence
    expect: str  # a fragment of the error the checks must report


def edit(id: str, file: str, old: str, new: str, expect: str) -> Mutation:
    return Mutation(id, file, ((old, new),), expect)


MUTATIONS = [
    # -- the edits of issue 12 --
    edit(
        "sender-role-id-with-the-wrong-ending",
        "builtin-roles.json",
        SENDER,
        SENDER[:-12] + "1f3c2552ae39",  # the ID of the failed deployments
        "differ from the verified reference",
    ),
    edit(
        "site-api-version-that-does-not-exist",
        "modules/functionapp.bicep",
        "'Microsoft.Web/sites@2024-04-01' = {",
        "'Microsoft.Web/sites@2024-13-01' = {",
        "API version 2024-13-01 does not exist for Microsoft.Web/sites",
    ),
    edit(
        "deployment-storage-url-with-a-double-slash",
        "modules/functionapp.bicep",
        "value: '${hostBlobEndpoint}${deploymentContainerName}'",
        "value: '${hostBlobEndpoint}/${deploymentContainerName}'",
        "deployment.storage.value: must be <account blob endpoint><container name>",
    ),
    edit(
        "lockDurration-on-the-resolver-subscription",
        "modules/servicebus.bicep",
        "    lockDuration: lockDuration\n",
        "    lockDurration: lockDuration\n",
        "resolverSubscription properties.lockDurration: unknown property (did you mean lockDuration?)",
    ),
    edit(
        "site-publicNetworkAccess-Enable",
        "modules/functionapp.bicep",
        "publicNetworkAccess: 'Enabled'",
        "publicNetworkAccess: 'Enable'",
        'site properties.publicNetworkAccess: "Enable" is not one of',
    ),
    edit(
        "string-where-an-integer-belongs",
        "modules/servicebus.bicep",
        "    maxDeliveryCount: maxDeliveryCount\n",
        "    maxDeliveryCount: '10'\n",
        'properties.maxDeliveryCount: "10" is a string, but an int belongs here',
    ),
    edit(
        "flex-plan-of-kind-elastic",
        "modules/functionapp.bicep",
        "  kind: 'functionapp'\n",
        "  kind: 'elastic'\n",
        "a Flex Consumption (FC1) plan is kind functionapp",
    ),
    edit(
        "primaryEndpoints-tables",
        "modules/storage.bicep",
        "dataStorage.properties.primaryEndpoints.table\n",
        "dataStorage.properties.primaryEndpoints.tables\n",
        "dataStorage.properties.primaryEndpoints has no property tables (did you mean table?)",
    ),
    # -- ours --
    edit(
        "storage-publicNetworkAccess-Enable",
        "modules/storage.bicep",
        "publicNetworkAccess: 'Enabled'",
        "publicNetworkAccess: 'Enable'",
        'hostStorage properties.publicNetworkAccess: "Enable" is not a known value',
    ),
    edit(
        "servicebus-publicNetworkAccess-Enable",
        "modules/servicebus-namespace.bicep",
        "publicNetworkAccess: 'Enabled'",
        "publicNetworkAccess: 'Enable'",
        'namespace properties.publicNetworkAccess: "Enable" is not a known value',
    ),
    edit(
        "role-id-typed-in-a-module",
        "modules/servicebus-rbac.bicep",
        "roles['Azure Service Bus Data Sender'])",
        f"'{SENDER}')",
        "typed here: role IDs come from builtin-roles.json by name",
    ),
    edit(
        "role-name-misspelt",
        "modules/rbac.bicep",
        "roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', "
        "roles['Storage Blob Data Owner'])",
        "roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', "
        "roles['Storage Blob Data Owners'])",
        "'Storage Blob Data Owners' is not a role of builtin-roles.json",
    ),
    edit(
        "unknown-property-on-the-site",
        "modules/functionapp.bicep",
        "    httpsOnly: true\n",
        "    httpsOnlyy: true\n",
        "site properties.httpsOnlyy: unknown property (did you mean httpsOnly?)",
    ),
    Mutation(
        "functionAppConfig-nested-in-siteConfig",
        "modules/functionapp.bicep",
        (
            ("      ]\n    }\n    functionAppConfig: {", "      ]\n    functionAppConfig: {"),
            ("    }\n  }\n}\n\n// FTP and basic-auth", "    }\n    }\n  }\n}\n\n// FTP and basic-auth"),
        ),
        "site properties.siteConfig.functionAppConfig: unknown property",
    ),
    edit(
        "bool-as-a-string",
        "modules/servicebus-namespace.bicep",
        "disableLocalAuth: true",
        "disableLocalAuth: 'true'",
        'properties.disableLocalAuth: "true" is a string, but a bool belongs here',
    ),
    edit(
        "required-principalId-missing",
        "modules/rbac.bicep",
        "  properties: {\n    principalId: principalId\n",
        "  properties: {\n",
        "hostBlobOwner properties.principalId: required property is missing",
    ),
    edit(
        "unknown-module-output",
        "main.bicep",
        "identityClientId: identity.outputs.clientId",
        "identityClientId: identity.outputs.clientID",
        "has no output clientID (did you mean clientId?",
    ),
    edit(
        "unknown-resource-property-read",
        "modules/identity.bicep",
        "identity.properties.principalId",
        "identity.properties.principalID",
        "identity.properties has no property principalID",
    ),
    edit(
        "read-only-property-set",
        "modules/functionapp.bicep",
        "    httpsOnly: true\n",
        "    httpsOnly: true\n    defaultHostName: 'settle.example'\n",
        "properties.defaultHostName: read-only property",
    ),
    edit(
        "allowed-sku-that-does-not-exist",
        "modules/storage.bicep",
        "  'Standard_LRS'\n",
        "  'Standard_LRSS'\n",
        '"Standard_LRSS" is not a known value',
    ),
    edit(
        "container-under-the-table-service",
        "modules/storage.bicep",
        "  parent: hostBlobs\n",
        "  parent: dataTableService\n",
        "must be a Microsoft.Storage/storageAccounts/blobServices, not a",
    ),
    edit(
        "metric-criteria-discriminator-typo",
        "modules/alerts.bicep",
        "'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'",
        "'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriterion'",
        "criteria.odata.type: 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriterion' is not one of",
    ),
    edit(
        "metric-alert-severity-as-a-string",
        "modules/alerts.bicep",
        "    severity: 1\n",
        "    severity: 'Error'\n",
        'properties.severity: "Error" is a string, but an int belongs here',
    ),
    edit(
        "lock-level-typo",
        "modules/storage.bicep",
        "level: 'CanNotDelete'",
        "level: 'CannotDelete'",
        'properties.level: "CannotDelete" is not a known value',
    ),
    edit(
        "diagnostic-settings-api-version-that-does-not-exist",
        "modules/servicebus.bicep",
        "'Microsoft.Insights/diagnosticSettings@2021-05-01-preview'",
        "'Microsoft.Insights/diagnosticSettings@2021-05-01'",
        "API version 2021-05-01 does not exist for Microsoft.Insights/diagnosticSettings",
    ),
    edit(
        "rules-of-one-subscription-in-parallel",
        "modules/servicebus.bicep",
        "      endpointContinuationRules[i]\n",
        "      endpointSubscriptions[i]\n",
        "are created in parallel (Service Bus answers 409)",
    ),
    edit(
        "subscriptions-of-one-topic-in-parallel",
        "modules/servicebus.bicep",
        "      resolverTopic\n      endpointRetryRules[i]\n",
        "      resolverTopic\n",
        "endpointSubscriptions and fanoutSubscriptions, children of endpointTopics, are created in parallel",
    ),
    edit(
        "duplicate-detection-setting-not-from-the-topic-flag",
        "modules/functionapp.bicep",
        "HANDOFF_DUPLICATE_DETECTION: duplicateDetection ? 'true' : 'false'",
        "HANDOFF_DUPLICATE_DETECTION: 'true'",
        "HANDOFF_DUPLICATE_DETECTION: must be <flag> ? 'true' : 'false'",
    ),
    edit(
        "module-parameter-misspelt",
        "main.bicep",
        "    lockDataAccount: lockDataAccount\n",
        "    lockDataAcount: lockDataAccount\n",
        "has no parameter lockDataAcount (did you mean lockDataAccount?)",
    ),
    edit(
        "parameter-file-value-of-the-wrong-type",
        "main.parameters.json",
        '"value": "settle"',
        '"value": 5',
        "tablePrefix: 5 is an int, but a string belongs here",
    ),
    edit(
        "alwaysReady-count-as-a-string",
        "modules/functionapp.bicep",
        "    instanceCount: httpAlwaysReadyInstances\n",
        "    instanceCount: '1'\n",
        'alwaysReady[0].instanceCount: "1" is a string, but an int belongs here',
    ),
    edit(
        "existing-resource-with-a-body",
        "modules/rbac.bicep",
        "existing = {\n  name: hostStorageName\n",
        "existing = {\n  name: hostStorageName\n  location: 'westeurope'\n",
        "hostStorage location: an existing resource takes only name, parent and scope",
    ),
    edit(
        "output-of-the-wrong-type",
        "modules/storage.bicep",
        "output tableEndpoint string = ",
        "output tableEndpoint int = ",
        "(dataStorage.properties.primaryEndpoints.table) is a string, but an int belongs here",
    ),
    edit(
        "deployment-url-from-the-data-account",
        "modules/storage.bicep",
        "output hostBlobEndpoint string = hostStorage.properties.primaryEndpoints.blob",
        "output hostBlobEndpoint string = dataStorage.properties.primaryEndpoints.blob",
        "must be a blob container of dataStorage",
    ),
    # -- issue 16: the log search alerts on Settle's own metrics --
    edit(
        "log-alert-api-version-that-does-not-exist",
        "modules/alerts.bicep",
        "'Microsoft.Insights/scheduledQueryRules@2023-12-01'",
        "'Microsoft.Insights/scheduledQueryRules@2023-12-02'",
        "API version 2023-12-02 does not exist for Microsoft.Insights/scheduledQueryRules",
    ),
    edit(
        "log-alert-failing-periods-typo",
        "modules/alerts.bicep",
        "            failingPeriods: {",
        "            failingPeriod: {",
        "criteria.allOf[0].failingPeriod: unknown property (did you mean failingPeriods?)",
    ),
    edit(
        "log-alert-frequency-as-minutes",
        "modules/alerts.bicep",
        "      evaluationFrequency: 'PT5M'\n      windowSize: alert.windowSize",
        "      evaluationFrequency: 5\n      windowSize: alert.windowSize",
        "properties.evaluationFrequency: 5 is an int, but a string belongs here",
    ),
    edit(
        "log-alert-without-a-location",
        "modules/alerts.bicep",
        "    location: location\n    tags: tags\n    kind: 'LogAlert'",
        "    tags: tags\n    kind: 'LogAlert'",
        "settleSignals location: required property is missing",
    ),
]


def apply(mutation: Mutation, root: Path) -> None:
    path = root / mutation.file
    text = path.read_text()
    for old, new in mutation.edits:
        assert old in text, f"{mutation.id}: {old!r} no longer occurs in infra/{mutation.file}"
        text = text.replace(old, new, 1)
    path.write_text(text)


@pytest.fixture
def infra_copy(tmp_path: Path) -> Path:
    root = tmp_path / "infra"
    shutil.copytree(INFRA, root)
    return root


def test_the_unmutated_copy_passes_every_check(infra_copy: Path) -> None:
    report = check_infra(infra_copy, type_data()).report
    assert report.errors == [], report.text()


def test_there_are_the_issues_eight_edits_and_at_least_ten_more() -> None:
    assert len(MUTATIONS) >= 18
    assert len({m.id for m in MUTATIONS}) == len(MUTATIONS)


def test_the_readme_and_the_adr_state_how_many_mistakes_the_checks_catch() -> None:
    readme = (INFRA.parent / "README.md").read_text()
    [adr] = (INFRA.parent / "docs" / "adr").glob("0010-*.md")
    assert f"with {len(MUTATIONS)} deliberate mistakes" in readme
    assert f"{len(MUTATIONS)} realistic edits of a copy of `infra/`" in adr.read_text()


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_each_mutation_is_caught_for_its_reason(mutation: Mutation, infra_copy: Path) -> None:
    # Given a copy of infra/ with one realistic mistake
    apply(mutation, infra_copy)
    # When every infra check runs on it
    report = check_infra(infra_copy, type_data()).report
    # Then it fails, and one of its errors names the mistake
    messages = [str(e) for e in report.errors]
    assert messages, f"{mutation.id} went unnoticed"
    assert any(mutation.expect in m for m in messages), "\n".join(messages)
