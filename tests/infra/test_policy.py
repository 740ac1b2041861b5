"""Policy tests on the parsed templates: what the issue and shared/reference/azure-practice.md require.

No Bicep compiler exists here, so these read the templates through tests/infra/bicep.py and assert the
properties that matter (shared key off, local auth off, TLS 1.2, https only, FTP/basic publishing off,
Python version, Flex settings, role assignments), plus the cross-file checks a compiler would make
(module parameters, parameter file).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.infra.bicep import REPO, Expr, Interp, Loop, bicep_files, load_infra, walk_values
from tests.infra.infracheck import InfraCheck
from tests.support.infra_reads import ci_python

# Roles that grant far more than Settle needs: never assigned (names of infra/builtin-roles.json).
BROAD_ROLES = {"Owner", "Contributor", "Azure Service Bus Data Owner", "Storage Blob Data Contributor"}

# App settings Flex Consumption rejects or ignores (its runtime, scale and package live in
# functionAppConfig); FUNCTIONS_EXTENSION_VERSION is deliberately not set either (ADR 0010).
FLEX_DEPRECATED_SETTINGS = {
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_WORKER_RUNTIME_VERSION",
    "FUNCTIONS_EXTENSION_VERSION",
    "FUNCTIONS_MAX_HTTP_CONCURRENCY",
    "FUNCTIONS_WORKER_PROCESS_COUNT",
    "FUNCTIONS_WORKER_DYNAMIC_CONCURRENCY_ENABLED",
    "WEBSITE_RUN_FROM_PACKAGE",
    "SCM_DO_BUILD_DURING_DEPLOYMENT",
    "ENABLE_ORYX_BUILD",
    "WEBSITE_TIME_ZONE",
    "TZ",
    "WEBSITE_NODE_DEFAULT_VERSION",
    "WEBSITE_MAX_DYNAMIC_APPLICATION_SCALE_OUT",
    "WEBSITE_VNET_ROUTE_ALL",
    "WEBSITE_DNS_SERVER",
    "WEBSITE_SKIP_CONTENTSHARE_VALIDATION",
    "AzureWebJobsStorage",  # the connection-string form
}
FLEX_DEPRECATED_PREFIXES = ("WEBSITE_CONTENT",)
FLEX_DEPRECATED_SITE_CONFIG = {
    "alwaysOn",
    "ftpsState",
    "linuxFxVersion",
    "windowsFxVersion",
    "netFrameworkVersion",
    "javaVersion",
    "powerShellVersion",
    "use32BitWorkerProcess",
    "functionAppScaleLimit",
    "preWarmedInstanceCount",
}
SECRET_MARKERS = (
    "accountkey",
    "sharedaccesskey",
    "listkeys(",
    "listconnectionstrings",
    "defaultendpointsprotocol",
    "endpoint=sb:",
    "primarykey",
    "secondarykey",
    "instrumentationkey=",
    "password",
    "secret",
)


def text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (Expr, Interp)):
        return value.text
    return json.dumps(value, default=str)


def app_settings() -> dict[str, Any]:
    settings = load_infra("modules/functionapp.bicep").variables["appSettings"]
    assert isinstance(settings, dict)
    return settings


# ---- storage ---------------------------------------------------------------------------------------


def test_every_storage_account_is_entra_only_tls12_and_https_only() -> None:
    accounts = load_infra("modules/storage.bicep").of_type("Microsoft.Storage/storageAccounts")
    assert {a.symbol for a in accounts} == {"hostStorage", "dataStorage"}
    for account in accounts:
        props = account.body["properties"]
        assert props["allowSharedKeyAccess"] is False, account.symbol
        assert props["allowBlobPublicAccess"] is False, account.symbol
        assert props["minimumTlsVersion"] == "TLS1_2", account.symbol
        assert props["supportsHttpsTrafficOnly"] is True, account.symbol
        assert props["defaultToOAuthAuthentication"] is True, account.symbol


def test_deployment_container_is_private_and_tables_are_created_on_the_data_account() -> None:
    storage = load_infra("modules/storage.bicep")
    container = storage.resource("deploymentContainer")
    assert container.body["properties"]["publicAccess"] == "None"
    tables = storage.resource("tables")
    assert tables.loop is not None and tables.loop.iterable.text == "tableNames"
    assert tables.body["parent"].text == "dataTableService"
    assert storage.resource("dataTableService").body["parent"].text == "dataStorage"


def test_every_state_account_is_hardened_locked_watched_and_granted_like_the_data_account() -> None:
    # State accounts 1..N-1 (stateaccounts.bicep) hold Settle's state like the data account.
    storage = load_infra("modules/storage.bicep")
    state = load_infra("modules/stateaccounts.bicep")
    data, extra = storage.resource("dataStorage"), state.resource("stateStorage")
    assert extra.loop is not None and extra.loop.iterable.text == "stateStorageNames"
    assert extra.body["properties"] == data.body["properties"]
    assert extra.body["sku"]["name"].text == "dataStorageSku" == data.body["sku"]["name"].text
    # the state table, in each account's table service
    table, service = state.resource("stateTable"), state.resource("stateTableService")
    assert table.body["parent"].text == "stateTableService[i]" and table.body["name"].text == "stateTableName"
    assert service.body["parent"].text == "stateStorage[i]"
    # the same delete lock, under the same switch as the data account's
    lock, data_lock = state.resource("stateStorageLock"), storage.resource("dataStorageLock")
    assert lock.body["scope"].text == "stateStorage[i]"
    assert lock.body["properties"]["level"] == data_lock.body["properties"]["level"] == "CanNotDelete"
    main = load_infra("main.bicep")
    call = next(m for m in main.modules if m.symbol == "stateAccountsModule")
    assert call.body["params"]["lockAccounts"].text == "lockDataAccount"
    assert call.body["params"]["dataStorageSku"].text == "dataStorageSku"
    # the same diagnostics: account metrics, table service request logs
    for symbol, scope, twin in (
        ("stateStorageDiagnostics", "stateStorage[i]", "dataStorageDiagnostics"),
        ("stateTableDiagnostics", "stateTableService[i]", "dataTableDiagnostics"),
    ):
        diagnostics = state.resource(symbol)
        assert diagnostics.body["scope"].text == scope
        assert diagnostics.body["properties"] == storage.resource(twin).body["properties"]
    # Table Data Contributor for the app's identity on each account (rbac.bicep, by name from the verified
    # list), on the accounts this module created
    rbac = load_infra("modules/rbac.bicep")
    grant = rbac.resource("stateTableContributor")
    assert grant.body["scope"].text == "stateStorage[i]"
    assert grant.body["properties"]["principalId"].text == "principalId"
    assert "roles['Storage Table Data Contributor']" in grant.body["properties"]["roleDefinitionId"].text
    rbac_call = next(m for m in main.modules if m.symbol == "rbac")
    assert rbac_call.body["params"]["principalId"].text == "identity.outputs.principalId"
    assert rbac_call.body["params"]["stateStorageNames"].text == "stateAccountsModule.outputs.storageNames"
    assert state.outputs["storageNames"].body.text == "stateStorage[i].name"


def test_one_state_account_by_default_and_the_extra_ones_are_numbered_from_1() -> None:
    main = load_infra("main.bicep")
    assert main.params["stateAccounts"].default == 1
    call = next(m for m in main.modules if m.symbol == "stateAccountsModule")
    names = call.body["params"]["stateStorageNames"]
    assert names.iterable.text == "range(1, stateAccounts - 1)"  # Bicep range(start, count): 1..N-1


# ---- Service Bus -----------------------------------------------------------------------------------


def test_service_bus_namespace_has_local_auth_disabled_and_tls12() -> None:
    namespace = load_infra("modules/servicebus-namespace.bicep").resource("namespace")
    assert namespace.body["properties"]["disableLocalAuth"] is True
    assert namespace.body["properties"]["minimumTlsVersion"] == "1.2"
    assert namespace.body["sku"]["name"] in ("Standard", "Premium")  # topics need Standard or Premium


def test_no_sas_rule_and_no_key_lookup_anywhere_in_infra() -> None:
    for path in bicep_files():
        text = path.read_text().lower()
        assert "authorizationrules" not in text, path.name
        for marker in ("listkeys(", "listconnectionstrings(", "sharedaccesskey", "accountkey"):
            assert marker not in text, f"{path.name}: {marker}"


# ---- monitoring ------------------------------------------------------------------------------------


def test_log_analytics_and_application_insights_have_local_auth_disabled() -> None:
    monitoring = load_infra("modules/monitoring.bicep")
    assert monitoring.resource("appInsights").body["properties"]["DisableLocalAuth"] is True
    assert monitoring.resource("appInsights").body["properties"]["WorkspaceResourceId"].text == "workspace.id"
    assert monitoring.resource("workspace").body["properties"]["features"]["disableLocalAuth"] is True


# ---- function app ----------------------------------------------------------------------------------


def test_plan_is_flex_consumption_linux() -> None:
    plan = load_infra("modules/functionapp.bicep").resource("plan")
    assert plan.body["sku"] == {"tier": "FlexConsumption", "name": "FC1"}
    assert plan.body["properties"]["reserved"] is True


def test_site_is_https_only_tls12_with_user_assigned_identity() -> None:
    site = load_infra("modules/functionapp.bicep").resource("site")
    assert site.body["kind"] == "functionapp,linux"
    assert site.body["identity"]["type"] == "UserAssigned"
    props = site.body["properties"]
    assert props["httpsOnly"] is True
    assert props["siteConfig"]["minTlsVersion"] == "1.2"
    assert props["siteConfig"]["scmMinTlsVersion"] == "1.2"
    assert props["siteConfig"]["remoteDebuggingEnabled"] is False


def test_ftp_and_basic_auth_publishing_are_off() -> None:
    app = load_infra("modules/functionapp.bicep")
    policies = app.of_type("Microsoft.Web/sites/basicPublishingCredentialsPolicies")
    assert {p.body["name"]: p.body["properties"]["allow"] for p in policies} == {"ftp": False, "scm": False}
    assert all(p.body["parent"].text == "site" for p in policies)


def test_runtime_is_python_at_the_version_ci_runs() -> None:
    config = load_infra("modules/functionapp.bicep").resource("site").body["properties"]["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": ci_python()}
    assert ci_python() == "3.13"  # SPEC: Python 3.13 is what CI and Flex Consumption both run


def test_deployment_package_uses_the_user_assigned_identity() -> None:
    config = load_infra("modules/functionapp.bicep").resource("site").body["properties"]["functionAppConfig"]
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"]["type"] == "UserAssignedIdentity"
    assert storage["authentication"]["userAssignedIdentityResourceId"].text == "identityId"
    assert set(config["scaleAndConcurrency"]) == {"maximumInstanceCount", "instanceMemoryMB", "alwaysReady"}


def test_no_siteconfig_property_flex_rejects() -> None:
    site_config = load_infra("modules/functionapp.bicep").resource("site").body["properties"]["siteConfig"]
    assert set(site_config) & FLEX_DEPRECATED_SITE_CONFIG == set()


def test_app_settings_are_all_of_the_site_and_come_from_one_object() -> None:
    site_config = load_infra("modules/functionapp.bicep").resource("site").body["properties"]["siteConfig"]
    # The named settings of one object, then the numbered ones of state accounts 1..N-1.
    functionapp = load_infra("modules/functionapp.bicep")
    assert site_config["appSettings"].text == "concat(namedSettings, stateAccountSettings)"
    loop = functionapp.variables["namedSettings"]
    assert isinstance(loop, Loop) and loop.iterable.text == "items(appSettings)"
    assert {k: v.text for k, v in loop.body.items()} == {"name": "setting.key", "value": "setting.value"}
    numbered = functionapp.variables["stateAccountSettings"]
    assert isinstance(numbered, Loop) and numbered.iterable.text == "stateTableEndpoints"
    # No second place sets app settings (a sites/config 'appsettings' resource would replace them); the
    # only sites/config resource is App Service authentication (authsettingsV2, ADR-0013).
    for path in bicep_files():
        for config in load_infra(str(path.relative_to(REPO / "infra"))).of_type("Microsoft.Web/sites/config"):
            assert config.body.get("name") == "authsettingsV2", f"{path.name}: {config.symbol}"


def test_no_flex_deprecated_app_setting() -> None:
    names = set(app_settings())
    assert names & FLEX_DEPRECATED_SETTINGS == set()
    assert [n for n in names if n.startswith(FLEX_DEPRECATED_PREFIXES)] == []


def test_no_connection_string_or_key_in_any_app_setting() -> None:
    settings = app_settings()
    for name, value in settings.items():
        text = text_of(value).lower()
        assert not any(marker in text for marker in SECRET_MARKERS), f"{name} = {text_of(value)}"
        looks_secret = re.search(r"(connection_?string|_key|key)$", name, re.IGNORECASE)
        if name == "APPLICATIONINSIGHTS_CONNECTION_STRING":
            # Exempt on purpose: with DisableLocalAuth the instrumentation key is an identifier, and
            # ingestion needs the Entra token named by APPLICATIONINSIGHTS_AUTHENTICATION_STRING.
            assert (
                load_infra("modules/monitoring.bicep")
                .resource("appInsights")
                .body["properties"]["DisableLocalAuth"]
            )
            assert "Authorization=AAD" in text_of(settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"])
            continue
        assert not looks_secret, name
    # The plain names are the connection-string forms; only the identity forms may be set.
    assert {"AzureWebJobsStorage", "ServiceBusConnection", "SETTLE_TABLES"} & set(settings) == set()


@pytest.mark.parametrize("prefix", ["AzureWebJobsStorage", "ServiceBusConnection"])
def test_host_connections_are_identity_based(prefix: str) -> None:
    settings = app_settings()
    assert settings[f"{prefix}__credential"] == "managedidentity"
    assert settings[f"{prefix}__clientId"].text == "identityClientId"


def test_settle_and_sdk_clients_use_the_same_identity() -> None:
    settings = app_settings()
    assert settings["SETTLE_TABLES__tableServiceUri"].text == "tableEndpoint"
    assert settings["SETTLE_TABLES__clientId"].text == "identityClientId"
    assert settings["AZURE_CLIENT_ID"].text == "identityClientId"
    assert settings["AzureWebJobsStorage__blobServiceUri"].text == "hostBlobEndpoint"
    assert (
        settings["ServiceBusConnection__fullyQualifiedNamespace"].text == "serviceBusFullyQualifiedNamespace"
    )
    assert settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"].text == (
        "ClientId=${identityClientId};Authorization=AAD"
    )
    assert settings["SETTLE_LOOPBACK"] == "false"  # in Azure, settlement sends to Service Bus


# ---- role assignments ------------------------------------------------------------------------------

RBAC_FILES = ("modules/rbac.bicep", "modules/servicebus-rbac.bicep")


def role_assignments() -> list[tuple[str, Any]]:
    return [
        (path, a)
        for path in RBAC_FILES
        for a in load_infra(path).of_type("Microsoft.Authorization/roleAssignments")
    ]


def test_role_assignments_live_only_in_the_rbac_modules() -> None:
    for path in bicep_files():
        relative = path.relative_to(REPO / "infra").as_posix()
        if relative not in RBAC_FILES:
            assert "Microsoft.Authorization/roleAssignments" not in path.read_text(), relative


def test_every_role_assignment_is_named_by_guid_of_its_scope_and_has_a_principal_type() -> None:
    assignments = role_assignments()
    assert len(assignments) == 12
    for path, a in assignments:
        name = a.body["name"]
        assert isinstance(name, Expr) and name.text.startswith("guid("), a.symbol
        scope = a.body["scope"].text
        assert name.text.startswith(f"guid({scope}.id,"), f"{a.symbol}: name must include its scope"
        principal = a.body["properties"]["principalId"].text
        principal_type = a.body["properties"]["principalType"]
        if principal == "principalId":  # the app's identity
            assert principal_type == "ServicePrincipal", a.symbol
        else:  # the optional developer or pipeline
            assert principal == "developerPrincipalId" and principal_type.text == "developerPrincipalType", (
                a.symbol
            )
        assert f"guid({scope}.id, {principal}, roles[" in name.text, f"{path} {a.symbol}"


def test_the_app_identity_holds_exactly_the_narrow_roles(infra_check: InfraCheck) -> None:
    grants = [g for g in infra_check.grants if g.symbol != "resolverScaleReader"]  # opt-in, below
    granted = {(g.file, g.role, g.scope.split("[")[0]) for g in grants if g.principal == "principalId"}
    assert granted == {
        ("modules/rbac.bicep", "Storage Blob Data Owner", "hostStorage"),
        ("modules/rbac.bicep", "Storage Table Data Contributor", "dataStorage"),
        ("modules/rbac.bicep", "Storage Table Data Contributor", "stateStorage"),  # accounts 1..N-1
        ("modules/rbac.bicep", "Monitoring Metrics Publisher", "appInsights"),
        ("modules/servicebus-rbac.bicep", "Azure Service Bus Data Receiver", "resolverSubscription"),
        ("modules/servicebus-rbac.bicep", "Azure Service Bus Data Sender", "endpointTopics"),
        ("modules/servicebus-rbac.bicep", "Azure Service Bus Data Sender", "resolverTopic"),
    }
    # Each scope is what its name says: the accounts, the resolver's subscription, the endpoint topics.
    rbac, sb = load_infra("modules/rbac.bicep"), load_infra("modules/servicebus-rbac.bicep")
    assert rbac.resource("hostStorage").body["name"].text == "hostStorageName"
    assert rbac.resource("dataStorage").body["name"].text == "dataStorageName"
    state_loop = rbac.resource("stateStorage").loop
    assert state_loop is not None and state_loop.iterable.text == "stateStorageNames"
    assert sb.resource("resolverSubscription").body["parent"].text == "resolverTopic"
    topics_loop = sb.resource("endpointTopics").loop
    assert topics_loop is not None and topics_loop.iterable.text == "endpointTopicNames"
    assert sb.resource("resolverTopic").type == "Microsoft.ServiceBus/namespaces/topics"
    assert sb.resource("resolverSubscription").type == "Microsoft.ServiceBus/namespaces/topics/subscriptions"
    # main wires the storage roles to the accounts storage.bicep creates.
    main = {m.symbol: m for m in load_infra("main.bicep").modules}
    assert main["rbac"].body["params"]["hostStorageName"].text == "storage.outputs.hostStorageName"
    assert main["rbac"].body["params"]["dataStorageName"].text == "storage.outputs.dataStorageName"
    assert main["rbac"].body["params"]["stateStorageNames"].text == "stateAccountsModule.outputs.storageNames"


def test_no_broad_role_is_granted_anywhere(infra_check: InfraCheck) -> None:
    opt_in = {"resolverScaleReader"}  # Data Owner on the resolver subscription, off by default (below)
    assert {g.role for g in infra_check.grants if g.symbol not in opt_in} & BROAD_ROLES == set()


def test_target_based_scaling_is_an_opt_in_data_owner_on_the_resolver_subscription_only(
    infra_check: InfraCheck,
) -> None:
    # ADR-0014: the target-based scaler needs Manage; Data Owner is the only built-in data role
    # with it, so it is granted on the one subscription the resolver reads, and only when asked for.
    [grant] = [g for g in infra_check.grants if g.role == "Azure Service Bus Data Owner"]
    assert (grant.file, grant.symbol, grant.scope, grant.principal) == (
        "modules/servicebus-rbac.bicep",
        "resolverScaleReader",
        "resolverSubscription",
        "principalId",
    )
    reader = load_infra("modules/servicebus-rbac.bicep").resource("resolverScaleReader")
    assert reader.condition is not None and reader.condition.text.strip("()") == "resolverTargetBasedScaling"
    assert load_infra("main.bicep").params["resolverTargetBasedScaling"].default is False
    main = {m.symbol: m for m in load_infra("main.bicep").modules}
    assert (
        main["serviceBusRbac"].body["params"]["resolverTargetBasedScaling"].text
        == "resolverTargetBasedScaling"
    )


def test_developer_access_is_optional_and_off_by_default() -> None:
    developer = [
        a for _, a in role_assignments() if a.body["properties"]["principalId"].text != "principalId"
    ]
    assert len(developer) == 4 and all(  # tables (data + state accounts), receiver, sender
        a.condition is not None and "developerPrincipalId" in a.condition.text for a in developer
    )
    for path in RBAC_FILES:
        assert load_infra(path).params["developerPrincipalId"].default == ""
        assert load_infra(path).params["developerPrincipalType"].default == "User"
    main = load_infra("main.bicep")
    assert main.params["developerPrincipalId"].default == ""
    assert main.params["developerPrincipalType"].decorators["allowed"] == [
        ["User", "ServicePrincipal", "Group"]
    ]


# ---- main: scope, outputs, modules, parameters file ------------------------------------------------


def test_main_is_resource_group_scoped_with_the_required_outputs() -> None:
    main = load_infra("main.bicep")
    assert main.target_scope == "resourceGroup"
    assert {
        "functionAppName",
        "functionAppUrl",
        "tableEndpoint",
        "serviceBusNamespace",
        "identityClientId",
    } <= set(main.outputs)


def test_every_module_call_passes_exactly_the_parameters_the_module_declares() -> None:
    main = load_infra("main.bicep")
    for module in main.modules:
        declared = load_infra(module.path).params
        passed = set(module.body["params"])
        required = {name for name, p in declared.items() if not p.has_default}
        assert passed <= set(declared), f"{module.path}: unknown {passed - set(declared)}"
        assert required <= passed, f"{module.path}: missing {required - passed}"


def test_module_outputs_used_by_main_exist() -> None:
    main = load_infra("main.bicep")
    symbols = {m.symbol: m.path for m in main.modules}
    used: set[tuple[str, str]] = set()
    for value in walk_values([m.body for m in main.modules] + list(main.outputs.values())):
        text = value.text if isinstance(value, (Expr, Interp)) else ""
        used |= set(re.findall(r"\b(\w+)\.outputs\.(\w+)", text))
    assert used
    for symbol, output in used:
        assert output in load_infra(symbols[symbol]).outputs, f"{symbol}.outputs.{output}"


def test_parameters_file_sets_known_parameters_and_every_required_one() -> None:
    data = json.loads((REPO / "infra" / "main.parameters.json").read_text())
    assert data["$schema"].endswith("deploymentParameters.json#")
    main = load_infra("main.bicep")
    given = set(data["parameters"])
    assert given <= set(main.params)
    assert {n for n, p in main.params.items() if not p.has_default} <= given
    assert data["parameters"]["endpoints"]["value"] == ["Billing"]


def test_resources_are_declared_raw_so_checkov_and_these_tests_see_inside() -> None:
    # AVM registry modules would hide their resources from checkov and from this reader.
    for path in bicep_files():
        assert "br/public:" not in path.read_text() and "br:" not in path.read_text(), path.name
