"""The infra checks are themselves checked: each edit below breaks a copy of infra/ the way a real change
could, and the checks (tests/infra/infracheck.py: syntax, names, types, role IDs, deployment rules) must
report it, for the right reason.

The first eight are the edits that kept the old infra tests passing while `az deployment group create`
failed; then ours, the log alerts', and the 19 an outside review found that the checks of
shape let through (wrong values and wiring), and 6 of the state accounts 1..N-1.
Each names the check (infracheck.CHECKS) that must
catch it, so an edit that no check catches fails here. The vendored type data is parsed once and shared
by every mutant.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.infra.armtypes import type_data
from tests.infra.bicep import INFRA
from tests.infra.infracheck import CHECKS, check_infra
from tests.infra.roles import role_table

pytestmark = pytest.mark.heavy  # checks a whole copy of infra/ per test: seconds a test

# Never typed here: read from the verified list, like the Bicep does.
SENDER = role_table(INFRA)["Azure Service Bus Data Sender"]


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    edits: tuple[tuple[str, str], ...]  # (text, replacement), each applied to its first occurrence
    expect: str  # a fragment of the error the checks must report
    check: str  # the check (infracheck.CHECKS) that must report it


def edit(id: str, file: str, old: str, new: str, expect: str, check: str) -> Mutation:
    return Mutation(id, file, ((old, new),), expect, check)


MUTATIONS = [
    # -- the edits that kept the old checks passing while a deployment failed --
    edit(
        "sender-role-id-with-the-wrong-ending",
        "builtin-roles.json",
        SENDER,
        SENDER[:-12] + "1f3c2552ae39",  # the ID of the failed deployments
        "differ from the verified reference",
        "roles",
    ),
    edit(
        "site-api-version-that-does-not-exist",
        "modules/functionapp.bicep",
        "'Microsoft.Web/sites@2024-04-01' = {",
        "'Microsoft.Web/sites@2024-13-01' = {",
        "API version 2024-13-01 does not exist for Microsoft.Web/sites",
        "types",
    ),
    edit(
        "deployment-storage-url-with-a-double-slash",
        "modules/functionapp.bicep",
        "value: '${hostBlobEndpoint}${deploymentContainerName}'",
        "value: '${hostBlobEndpoint}/${deploymentContainerName}'",
        "deployment.storage.value: must be <account blob endpoint><container name>",
        "rules",
    ),
    edit(
        "lockDurration-on-the-resolver-subscription",
        "modules/servicebus.bicep",
        "    lockDuration: lockDuration\n",
        "    lockDurration: lockDuration\n",
        "resolverSubscription properties.lockDurration: unknown property (did you mean lockDuration?)",
        "types",
    ),
    edit(
        "site-publicNetworkAccess-Enable",
        "modules/functionapp.bicep",
        "publicNetworkAccess: 'Enabled'",
        "publicNetworkAccess: 'Enable'",
        'site properties.publicNetworkAccess: "Enable" is not one of',
        "types",
    ),
    edit(
        "string-where-an-integer-belongs",
        "modules/servicebus.bicep",
        "    maxDeliveryCount: maxDeliveryCount\n",
        "    maxDeliveryCount: '10'\n",
        'properties.maxDeliveryCount: "10" is a string, but an int belongs here',
        "types",
    ),
    edit(
        "flex-plan-of-kind-elastic",
        "modules/functionapp.bicep",
        "  kind: 'functionapp'\n",
        "  kind: 'elastic'\n",
        "a Flex Consumption (FC1) plan is kind functionapp",
        "rules",
    ),
    edit(
        "primaryEndpoints-tables",
        "modules/storage.bicep",
        "dataStorage.properties.primaryEndpoints.table\n",
        "dataStorage.properties.primaryEndpoints.tables\n",
        "dataStorage.properties.primaryEndpoints has no property tables (did you mean table?)",
        "types",
    ),
    # -- ours --
    edit(
        "storage-publicNetworkAccess-Enable",
        "modules/storage.bicep",
        "publicNetworkAccess: 'Enabled'",
        "publicNetworkAccess: 'Enable'",
        'hostStorage properties.publicNetworkAccess: "Enable" is not a known value',
        "types",
    ),
    edit(
        "servicebus-publicNetworkAccess-Enable",
        "modules/servicebus-namespace.bicep",
        "publicNetworkAccess: 'Enabled'",
        "publicNetworkAccess: 'Enable'",
        'namespace properties.publicNetworkAccess: "Enable" is not a known value',
        "types",
    ),
    edit(
        "role-id-typed-in-a-module",
        "modules/servicebus-rbac.bicep",
        "roles['Azure Service Bus Data Sender'])",
        f"'{SENDER}')",
        "typed here: role IDs come from builtin-roles.json by name",
        "roles",
    ),
    edit(
        "role-name-misspelt",
        "modules/rbac.bicep",
        "roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', "
        "roles['Storage Blob Data Owner'])",
        "roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', "
        "roles['Storage Blob Data Owners'])",
        "'Storage Blob Data Owners' is not a role of builtin-roles.json",
        "roles",
    ),
    edit(
        "unknown-property-on-the-site",
        "modules/functionapp.bicep",
        "    httpsOnly: true\n",
        "    httpsOnlyy: true\n",
        "site properties.httpsOnlyy: unknown property (did you mean httpsOnly?)",
        "types",
    ),
    Mutation(
        "functionAppConfig-nested-in-siteConfig",
        "modules/functionapp.bicep",
        (
            (
                "      appSettings: concat(namedSettings, stateAccountSettings)\n"
                "    }\n    functionAppConfig: {",
                "      appSettings: concat(namedSettings, stateAccountSettings)\n    functionAppConfig: {",
            ),
            ("    }\n  }\n}\n\n// FTP and basic-auth", "    }\n    }\n  }\n}\n\n// FTP and basic-auth"),
        ),
        "site properties.siteConfig.functionAppConfig: unknown property",
        "types",
    ),
    edit(
        "bool-as-a-string",
        "modules/servicebus-namespace.bicep",
        "disableLocalAuth: true",
        "disableLocalAuth: 'true'",
        'properties.disableLocalAuth: "true" is a string, but a bool belongs here',
        "types",
    ),
    edit(
        "required-principalId-missing",
        "modules/rbac.bicep",
        "  properties: {\n    principalId: principalId\n",
        "  properties: {\n",
        "hostBlobOwner properties.principalId: required property is missing",
        "types",
    ),
    edit(
        "unknown-module-output",
        "main.bicep",
        "identityClientId: identity.outputs.clientId",
        "identityClientId: identity.outputs.clientID",
        "has no output clientID (did you mean clientId?",
        "types",
    ),
    edit(
        "unknown-resource-property-read",
        "modules/identity.bicep",
        "identity.properties.principalId",
        "identity.properties.principalID",
        "identity.properties has no property principalID",
        "types",
    ),
    edit(
        "read-only-property-set",
        "modules/functionapp.bicep",
        "    httpsOnly: true\n",
        "    httpsOnly: true\n    defaultHostName: 'settle.example'\n",
        "properties.defaultHostName: read-only property",
        "types",
    ),
    edit(
        "allowed-sku-that-does-not-exist",
        "modules/storage.bicep",
        "  'Standard_LRS'\n",
        "  'Standard_LRSS'\n",
        '"Standard_LRSS" is not a known value',
        "types",
    ),
    edit(
        "container-under-the-table-service",
        "modules/storage.bicep",
        "  parent: hostBlobs\n",
        "  parent: dataTableService\n",
        "must be a Microsoft.Storage/storageAccounts/blobServices, not a",
        "types",
    ),
    edit(
        "metric-criteria-discriminator-typo",
        "modules/alerts.bicep",
        "'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'",
        "'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriterion'",
        "criteria.odata.type: 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriterion' is not one of",
        "types",
    ),
    edit(
        "metric-alert-severity-as-a-string",
        "modules/alerts.bicep",
        "    severity: 1\n",
        "    severity: 'Error'\n",
        'properties.severity: "Error" is a string, but an int belongs here',
        "types",
    ),
    edit(
        "lock-level-typo",
        "modules/storage.bicep",
        "level: 'CanNotDelete'",
        "level: 'CannotDelete'",
        'properties.level: "CannotDelete" is not a known value',
        "types",
    ),
    edit(
        "diagnostic-settings-api-version-that-does-not-exist",
        "modules/servicebus.bicep",
        "'Microsoft.Insights/diagnosticSettings@2021-05-01-preview'",
        "'Microsoft.Insights/diagnosticSettings@2021-05-01'",
        "API version 2021-05-01 does not exist for Microsoft.Insights/diagnosticSettings",
        "types",
    ),
    edit(
        "rules-of-one-subscription-in-parallel",
        "modules/servicebus.bicep",
        "      endpointContinuationRules[i]\n",
        "      endpointSubscriptions[i]\n",
        "are created in parallel (Service Bus answers 409)",
        "rules",
    ),
    edit(
        "subscriptions-of-one-topic-in-parallel",
        "modules/servicebus.bicep",
        "      resolverTopic\n      endpointRetryRules[i]\n",
        "      resolverTopic\n",
        "endpointSubscriptions and fanoutSubscriptions, children of endpointTopics, are created in parallel",
        "rules",
    ),
    edit(
        "duplicate-detection-setting-not-from-the-topic-flag",
        "modules/functionapp.bicep",
        "HANDOFF_DUPLICATE_DETECTION: duplicateDetection ? 'true' : 'false'",
        "HANDOFF_DUPLICATE_DETECTION: 'true'",
        "HANDOFF_DUPLICATE_DETECTION: must be <flag> ? 'true' : 'false'",
        "rules",
    ),
    edit(
        "module-parameter-misspelt",
        "main.bicep",
        "    lockDataAccount: lockDataAccount\n",
        "    lockDataAcount: lockDataAccount\n",
        "has no parameter lockDataAcount (did you mean lockDataAccount?)",
        "types",
    ),
    edit(
        "parameter-file-value-of-the-wrong-type",
        "main.parameters.json",
        '"value": "settle"',
        '"value": 5',
        "tablePrefix: 5 is an int, but a string belongs here",
        "types",
    ),
    edit(
        "alwaysReady-count-as-a-string",
        "modules/functionapp.bicep",
        "    instanceCount: httpAlwaysReadyInstances\n",
        "    instanceCount: '1'\n",
        'alwaysReady[0].instanceCount: "1" is a string, but an int belongs here',
        "types",
    ),
    edit(
        "existing-resource-with-a-body",
        "modules/rbac.bicep",
        "existing = {\n  name: hostStorageName\n",
        "existing = {\n  name: hostStorageName\n  location: 'westeurope'\n",
        "hostStorage location: an existing resource takes only name, parent and scope",
        "types",
    ),
    edit(
        "output-of-the-wrong-type",
        "modules/storage.bicep",
        "output tableEndpoint string = ",
        "output tableEndpoint int = ",
        "(dataStorage.properties.primaryEndpoints.table) is a string, but an int belongs here",
        "types",
    ),
    edit(
        "deployment-url-from-the-data-account",
        "modules/storage.bicep",
        "output hostBlobEndpoint string = hostStorage.properties.primaryEndpoints.blob",
        "output hostBlobEndpoint string = dataStorage.properties.primaryEndpoints.blob",
        "must be a blob container of dataStorage",
        "rules",
    ),
    # -- the log search alerts on Settle's own metrics --
    edit(
        "log-alert-api-version-that-does-not-exist",
        "modules/alerts.bicep",
        "'Microsoft.Insights/scheduledQueryRules@2023-12-01'",
        "'Microsoft.Insights/scheduledQueryRules@2023-12-02'",
        "API version 2023-12-02 does not exist for Microsoft.Insights/scheduledQueryRules",
        "types",
    ),
    edit(
        "log-alert-failing-periods-typo",
        "modules/alerts.bicep",
        "            failingPeriods: {",
        "            failingPeriod: {",
        "criteria.allOf[0].failingPeriod: unknown property (did you mean failingPeriods?)",
        "types",
    ),
    edit(
        "log-alert-frequency-as-minutes",
        "modules/alerts.bicep",
        "      evaluationFrequency: 'PT5M'\n      windowSize: alert.windowSize",
        "      evaluationFrequency: 5\n      windowSize: alert.windowSize",
        "properties.evaluationFrequency: 5 is an int, but a string belongs here",
        "types",
    ),
    edit(
        "log-alert-without-a-location",
        "modules/alerts.bicep",
        "    location: location\n    tags: tags\n    kind: 'LogAlert'",
        "    tags: tags\n    kind: 'LogAlert'",
        "settleSignals location: required property is missing",
        "types",
    ),
    # -- wrong values and wiring, not only wrong shapes --
    edit(
        "role-assignment-to-the-identity-s-client-id",
        "main.bicep",
        "    principalId: identity.outputs.principalId\n",
        "    principalId: identity.outputs.clientId\n",
        "must be the principalId (object id) of a managed identity",
        "wiring",
    ),
    edit(
        "tenant-id-as-the-client-id",
        "main.bicep",
        "identityClientId: identity.outputs.clientId",
        "identityClientId: tenant().tenantId",
        "must be the clientId of the identity assigned to the app",
        "wiring",
    ),
    edit(
        "instrumentation-key-as-the-connection-string",
        "modules/monitoring.bicep",
        "appInsights.properties.ConnectionString",
        "appInsights.properties.InstrumentationKey",
        "APPLICATIONINSIGHTS_CONNECTION_STRING: must be the ConnectionString of an Application Insights",
        "wiring",
    ),
    edit(
        "setting-the-management-api-reads-renamed",
        "modules/functionapp.bicep",
        "  SETTLE_OPERATOR_AUTH: ",
        "  SETTLE_OPERATOR_AUTHENTICATION: ",
        "SETTLE_OPERATOR_AUTH: read by common/principal.py, not set",
        "settings",
    ),
    edit(
        "log-alert-severity-5",
        "modules/alerts.bicep",
        "    severity: 1\n    windowSize: 'PT5M'\n",
        "    severity: 5\n    windowSize: 'PT5M'\n",
        "properties.severity: 5 (settleLogAlerts[0].severity) is not one of 0, 1, 2, 3, 4",
        "values",
    ),
    edit(
        "log-alert-window-15m",
        "modules/alerts.bicep",
        "    windowSize: 'PT15M'\n",
        "    windowSize: '15m'\n",
        "properties.windowSize: '15m' (settleLogAlerts[1].windowSize) is not an ISO 8601 duration",
        "values",
    ),
    edit(
        "metric-alert-frequency-PT2M",
        "modules/alerts.bicep",
        "    evaluationFrequency: 'PT5M'\n",
        "    evaluationFrequency: 'PT2M'\n",
        "resolverDeadLetters properties.evaluationFrequency: 'PT2M' is not one of PT1M, PT5M, PT15M",
        "values",
    ),
    edit(
        "lock-duration-30s",
        "modules/servicebus.bicep",
        "param lockDuration string = 'PT30S'",
        "param lockDuration string = '30s'",
        "properties.lockDuration: '30s' is not an ISO 8601 duration",
        "values",
    ),
    edit(
        "lock-duration-PT10M",
        "modules/servicebus.bicep",
        "param lockDuration string = 'PT30S'",
        "param lockDuration string = 'PT10M'",
        "properties.lockDuration: 'PT10M' is longer than PT5M",
        "values",
    ),
    edit(
        "storage-metric-category-Transactions",
        "modules/storage.bicep",
        "        category: 'Transaction'\n",
        "        category: 'Transactions'\n",
        "hostStorageDiagnostics properties.metrics[0].category: 'Transactions' is not a metric category of "
        "Microsoft.Storage/storageAccounts",
        "values",
    ),
    edit(
        "request-logs-on-the-storage-account-itself",
        "modules/storage.bicep",
        "  scope: hostStorage\n  name: 'to-log-analytics'\n  properties: {\n"
        "    workspaceId: logAnalyticsWorkspaceId\n",
        "  scope: hostStorage\n  name: 'to-log-analytics'\n  properties: {\n"
        "    workspaceId: logAnalyticsWorkspaceId\n"
        "    logs: [\n      {\n        categoryGroup: 'allLogs'\n        enabled: true\n      }\n    ]\n",
        "hostStorageDiagnostics properties.logs[0].categoryGroup: Microsoft.Storage/storageAccounts has no "
        "resource logs",
        "values",
    ),
    edit(
        "flex-instance-memory-1024",
        "modules/functionapp.bicep",
        "        instanceMemoryMB: instanceMemoryMB\n",
        "        instanceMemoryMB: 1024\n",
        "instanceMemoryMB: 1024 is not one of 512, 2048, 4096",
        "values",
    ),
    edit(
        "table-endpoint-of-the-host-account",
        "modules/storage.bicep",
        "output tableEndpoint string = dataStorage.properties.primaryEndpoints.table",
        "output tableEndpoint string = hostStorage.properties.primaryEndpoints.table",
        "SETTLE_TABLES__tableServiceUri: must be the table endpoint of dataStorage, the account that holds "
        "the tables",
        "wiring",
    ),
    edit(
        "data-account-given-the-host-account-s-name",
        "main.bicep",
        "    dataStorageName: storage.outputs.dataStorageName\n",
        "    dataStorageName: storage.outputs.hostStorageName\n",
        "the app's identity holds no Storage Table Data Contributor on dataStorage",
        "wiring",
    ),
    Mutation(
        "app-not-waiting-for-its-role-assignments",
        "main.bicep",
        (
            (
                "  // Start the app only once its identity holds its roles (storage, tables, bus, "
                "telemetry).\n"
                "  dependsOn: [\n    rbac\n    serviceBusRbac\n  ]\n",
                "",
            ),
        ),
        "functionApp does not wait for rbac, which grants roles to its identity",
        "dependencies",
    ),
    edit(
        "dependency-cycle-across-modules",
        "main.bicep",
        "    developerPrincipalType: developerPrincipalType\n  }\n}\n\nmodule functionApp",
        "    developerPrincipalType: developerPrincipalType\n  }\n  dependsOn: [\n    functionApp\n  ]\n}\n\n"
        "module functionApp",
        "dependency cycle: functionApp -> rbac -> functionApp",
        "dependencies",
    ),
    edit(
        "deploy-takes-enter-for-yes",
        "deploy.sh",
        "    y | Y | yes | Yes | YES) ;;\n",
        '    "" | y | Y | yes | Yes | YES) ;;\n',
        "deploy.sh: Enter (an empty answer) at the prompt deployed",
        "deploy-script",
    ),
    edit(
        "deploy-takes-eof-for-yes",
        "deploy.sh",
        "answer || true\n",
        "answer || answer=yes\n",
        "deploy.sh: end of input (EOF) at the prompt deployed",
        "deploy-script",
    ),
    edit(
        "deploy-ignores-a-failing-what-if",
        "deploy.sh",
        '    az deployment group what-if --resource-group "$rg" --name "$deployment" "${params[@]}"\n',
        '    az deployment group what-if --resource-group "$rg" --name "$deployment" "${params[@]}"'
        " || true\n",
        "deploy.sh: a failing what-if, then yes, deployed",
        "deploy-script",
    ),
    # -- state accounts 1..N-1 (modules/stateaccounts.bicep) --
    edit(
        "state-account-role-granted-to-the-developer",
        "modules/rbac.bicep",
        "    name: guid(stateStorage[i].id, principalId, roles['Storage Table Data Contributor'])\n"
        "    properties: {\n      principalId: principalId\n",
        "    name: guid(stateStorage[i].id, principalId, roles['Storage Table Data Contributor'])\n"
        "    properties: {\n      principalId: developerPrincipalId\n",
        "the app's identity holds no Storage Table Data Contributor on stateStorage",
        "wiring",
    ),
    edit(
        "state-account-role-on-account-0",
        "main.bicep",
        "    stateStorageNames: stateAccountsModule.outputs.storageNames\n",
        "    stateStorageNames: [for i in range(1, stateAccounts - 1): storage.outputs.dataStorageName]\n",
        "the app's identity holds no Storage Table Data Contributor on stateStorage",
        "wiring",
    ),
    edit(
        "state-account-endpoints-of-account-0",
        "main.bicep",
        "    stateTableEndpoints: stateAccountsModule.outputs.tableEndpoints\n",
        "    stateTableEndpoints: [for i in range(1, stateAccounts - 1): storage.outputs.tableEndpoint]\n",
        "SETTLE_TABLES_{i}__tableServiceUri: must be read from account i of a looped declaration",
        "wiring",
    ),
    edit(
        "state-account-endpoints-all-of-the-first-extra-account",
        "modules/stateaccounts.bicep",
        "stateStorage[i].properties.primaryEndpoints.table",
        "stateStorage[0].properties.primaryEndpoints.table",
        "SETTLE_TABLES_{i}__tableServiceUri: must be read from account i of a looped declaration",
        "wiring",
    ),
    edit(
        "state-account-blob-endpoint-as-its-table-endpoint",
        "modules/stateaccounts.bicep",
        "stateStorage[i].properties.primaryEndpoints.table",
        "stateStorage[i].properties.primaryEndpoints.blob",
        "SETTLE_TABLES_{i}__tableServiceUri: must be, for each i, the table endpoint of account i",
        "wiring",
    ),
    edit(
        "state-account-settings-numbered-from-0",
        "modules/functionapp.bicep",
        "name: 'SETTLE_TABLES_${i + 1}__tableServiceUri'",
        "name: 'SETTLE_TABLES_${i}__tableServiceUri'",
        "SETTLE_TABLES_{i}__tableServiceUri: a numbered setting read by state/accounts.py, not set",
        "settings",
    ),
    # -- first start: the deployment succeeds, then the app cannot start or its timers never run --
    edit(
        "catch-up-schedule-default-as-a-five-field-cron",
        "main.bicep",
        "param stateCatchupSchedule string = '0 */1 * * * *'",
        "param stateCatchupSchedule string = '*/1 * * * *'",
        "'*/1 * * * *' is not a six-field NCRONTAB expression",
        "first-start",
    ),
    edit(
        "sweeper-schedule-default-in-prose",
        "main.bicep",
        "param handoffSweeperSchedule string = '0 */1 * * * *'",
        "param handoffSweeperSchedule string = 'every minute'",
        "'every minute' is not a six-field NCRONTAB expression",
        "first-start",
    ),
    Mutation(
        "catch-up-schedule-in-the-parameter-file-as-a-five-field-cron",
        "main.parameters.json",
        (('"tablePrefix": {', '"stateCatchupSchedule": {"value": "0 * * * *"},\n    "tablePrefix": {'),),
        "'0 * * * *' is not a six-field NCRONTAB expression",
        "first-start",
    ),
    edit(
        "host-storage-firewall-deny-without-network-integration",
        "modules/storage.bicep",
        "defaultAction: 'Allow'",
        "defaultAction: 'Deny'",
        "'Deny' without the function app's virtual network integration",
        "first-start",
    ),
    edit(
        "service-bus-client-id-under-a-misspelt-connection-name",
        "modules/functionapp.bicep",
        "ServiceBusConnection__clientId: identityClientId",
        "ServiceBusConection__clientId: identityClientId",
        "names the connection 'ServiceBusConection', which no binding uses",
        "first-start",
    ),
    edit(
        "the-worker-asked-to-set-up-opentelemetry-itself",
        "modules/functionapp.bicep",
        "  AZURE_CLIENT_ID: identityClientId\n",
        "  AZURE_CLIENT_ID: identityClientId\n  PYTHON_ENABLE_OPENTELEMETRY: 'true'\n",
        "the worker then configures OpenTelemetry itself",
        "first-start",
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


def test_there_are_the_69_edits_each_with_the_check_that_catches_it() -> None:
    assert len(MUTATIONS) >= 69
    assert len({m.id for m in MUTATIONS}) == len(MUTATIONS)
    assert {m.check for m in MUTATIONS} <= set(CHECKS)
    # Every check proves itself on at least one edit (a check no mutation exercises could be dead).
    assert {m.check for m in MUTATIONS} == set(CHECKS) - {"syntax"}


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
    result = check_infra(infra_copy, type_data())
    # Then it fails, and the check named for it reports the mistake
    messages = [str(e) for e in result.report.errors]
    assert messages, f"{mutation.id} went unnoticed"
    caught = [str(e) for e in result.by_check[mutation.check].errors]
    assert any(mutation.expect in m for m in caught), "\n".join(messages)


def test_every_value_rule_and_category_table_names_its_source() -> None:
    # A value rule Azure enforces is never typed from memory; each says where it comes from.
    from tests.infra.values import CATEGORIES, RULES

    assert RULES and all(len(rule.source) > 40 for rule in RULES)
    assert CATEGORIES and all(len(c.source) > 40 for c in CATEGORIES.values())
