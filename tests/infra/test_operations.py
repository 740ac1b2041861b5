"""What an Azure operator expects of infra/, and what makes it deploy on the first try.

Values are followed through modules with tests/infra/trace.py, so each test states where a setting comes
from (a main.bicep parameter, a resource property), not how a module happens to spell it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.infra.bicep import INFRA, Expr, load_infra
from tests.infra.report import Report
from tests.infra.trace import Form, Tracer
from tests.infra.units import Unit, load_units

MAIN = "main.bicep"


@pytest.fixture(scope="module")
def units() -> dict[str, Unit]:
    report = Report()
    loaded = load_units(INFRA, report)
    assert report.errors == []
    return loaded


@pytest.fixture(scope="module")
def tracer(units: dict[str, Unit]) -> Tracer:
    return Tracer(units)


def param(name: str) -> Form:
    return ("param", MAIN, name)


def trace(tracer: Tracer, file: str, value: Any) -> Form:
    return tracer.trace(tracer.units[file], value)


def resource(file: str, symbol: str) -> Any:
    return load_infra(file).resource(symbol)


# ---- data account: redundancy and the delete lock --------------------------------------------------


def test_data_account_redundancy_is_a_parameter_zrs_by_default_lrs_allowed(tracer: Tracer) -> None:
    main = load_infra(MAIN)
    assert main.params["dataStorageSku"].default == "Standard_ZRS"
    assert main.params["dataStorageSku"].decorators["allowed"] == [["Standard_ZRS", "Standard_LRS"]]
    sku = resource("modules/storage.bicep", "dataStorage").body["sku"]["name"]
    assert trace(tracer, "modules/storage.bicep", sku) == param("dataStorageSku")
    # The host account is LRS (its blobs and the package are rebuilt by the host and a redeploy), but ZRS
    # when the plan is zone-redundant : a zone outage must not take the host's storage with it.
    host_sku = trace(
        tracer, "modules/storage.bicep", resource("modules/storage.bicep", "hostStorage").body["sku"]["name"]
    )
    assert host_sku == ("op", "?:", param("zoneRedundant"), ("lit", "Standard_ZRS"), ("lit", "Standard_LRS"))
    plan = resource("modules/functionapp.bicep", "plan").body["properties"]["zoneRedundant"]
    assert trace(tracer, "modules/functionapp.bicep", plan) == param("zoneRedundant")


def test_every_module_deployment_name_is_unique_to_the_environment(tracer: Tracer) -> None:
    # Fixed names ('identity', 'servicebus', ...) collide between two environments in one resource
    # group, and with Settle's own deployments in NimBus's resource group (attach mode).
    main = load_infra(MAIN)
    names = [trace(tracer, MAIN, m.body["name"]) for m in main.modules]
    token = trace(tracer, MAIN, main.variables["resourceToken"])
    assert names and all(n[0] == "concat" and token in n[1:] for n in names), names
    assert len({n[1] for n in names}) == len(names)  # and distinct from each other


def test_the_app_service_token_store_is_off() -> None:
    # The code never reads a stored token, and the default store is the app's file system.
    auth = resource("modules/functionapp.bicep", "auth").body["properties"]
    assert auth["login"]["tokenStore"]["enabled"] is False


def test_dead_letters_on_every_endpoint_topic_are_alerted(tracer: Tracer) -> None:
    # Only the Resolver's dead letters were alerted; the fan-out subscriptions of the endpoint
    # topics (and the endpoints' own) dead-letter too.
    alert = resource("modules/alerts.bicep", "endpointDeadLetters").body["properties"]
    [criterion] = alert["criteria"]["allOf"]
    assert criterion["metricName"] == "DeadletteredMessages" and criterion["threshold"] == 0
    [dimension] = criterion["dimensions"]
    assert dimension["name"] == "EntityName"
    values = trace(tracer, "modules/alerts.bicep", dimension["values"])
    assert values == trace(
        tracer,
        "modules/servicebus.bicep",
        load_infra("modules/servicebus.bicep").outputs["endpointTopicNames"],
    )
    assert values == param("endpoints")


def test_data_account_has_a_cannotdelete_lock_on_by_default_except_for_dev(tracer: Tracer) -> None:
    [lock] = load_infra("modules/storage.bicep").of_type("Microsoft.Authorization/locks")
    assert lock.body["scope"].text == "dataStorage"
    assert lock.body["properties"]["level"] == "CanNotDelete"
    assert lock.condition is not None
    assert trace(tracer, "modules/storage.bicep", lock.condition) == param("lockDataAccount")
    default = load_infra(MAIN).params["lockDataAccount"].default
    assert isinstance(default, Expr) and default.text == "!startsWith(environmentName, 'dev')"


# ---- diagnostic settings -----------------------------------------------------------------------------


def diagnostic_settings() -> dict[tuple[str, str], Any]:
    found = {}
    for file in ("modules/storage.bicep", "modules/servicebus.bicep"):
        for setting in load_infra(file).of_type("Microsoft.Insights/diagnosticSettings"):
            found[(file, setting.body["scope"].text)] = setting
    return found


def test_service_bus_and_both_storage_accounts_send_logs_and_metrics_to_log_analytics(tracer: Tracer) -> None:
    settings = diagnostic_settings()
    assert set(settings) == {
        ("modules/storage.bicep", "hostStorage"),
        ("modules/storage.bicep", "hostBlobs"),
        ("modules/storage.bicep", "dataStorage"),
        ("modules/storage.bicep", "dataTableService"),
        ("modules/servicebus.bicep", "namespace"),
    }
    workspace = ("read", "modules/monitoring.bicep", "workspace", (("prop", "id"),))
    for (file, scope), setting in settings.items():
        # Always deployed: an attached (NimBus) namespace's logs and metrics are wanted as much as ours.
        assert setting.condition is None and not setting.loop, scope
        props = setting.body["properties"]
        assert trace(tracer, file, props["workspaceId"]) == workspace, scope
        assert props["metrics"] and all(m["enabled"] is True for m in props["metrics"]), scope
        if scope in ("hostBlobs", "dataTableService", "namespace"):  # where request logs exist
            assert props["logs"] == [{"categoryGroup": "allLogs", "enabled": True}], scope
    # The services' settings are on the services of the right accounts.
    storage = load_infra("modules/storage.bicep")
    assert storage.resource("hostBlobs").body["parent"].text == "hostStorage"
    assert storage.resource("dataTableService").body["parent"].text == "dataStorage"


# ---- alerts ------------------------------------------------------------------------------------------


def test_alerts_for_resolver_dead_letters_function_failures_and_throttling(tracer: Tracer) -> None:
    alerts = {
        a.symbol: a for a in load_infra("modules/alerts.bicep").of_type("Microsoft.Insights/metricAlerts")
    }
    assert set(alerts) == {
        "resolverDeadLetters",
        "endpointDeadLetters",
        "functionFailures",
        "serviceBusThrottling",
    }

    def criterion(symbol: str) -> dict[str, Any]:
        [only] = alerts[symbol].body["properties"]["criteria"]["allOf"]
        assert only["operator"] == "GreaterThan" and only["threshold"] == 0
        return dict(only)

    namespace = ("read", "modules/servicebus.bicep", "namespace", (("prop", "id"),))
    dead = criterion("resolverDeadLetters")
    assert (dead["metricNamespace"], dead["metricName"], dead["timeAggregation"]) == (
        "Microsoft.ServiceBus/namespaces",
        "DeadletteredMessages",
        "Maximum",
    )
    [dimension] = dead["dimensions"]
    assert dimension["name"] == "EntityName" and dimension["operator"] == "Include"
    # The Resolver topic's only subscription is the resolver's: the topic's count is that queue's.
    assert [trace(tracer, "modules/alerts.bicep", v) for v in dimension["values"]] == [("lit", "Resolver")]
    assert trace(
        tracer, "modules/alerts.bicep", alerts["resolverDeadLetters"].body["properties"]["scopes"][0]
    ) == (namespace)
    failures = criterion("functionFailures")
    assert (failures["metricNamespace"], failures["metricName"], failures["timeAggregation"]) == (
        "microsoft.insights/components",
        "requests/failed",
        "Count",
    )
    assert trace(
        tracer, "modules/alerts.bicep", alerts["functionFailures"].body["properties"]["scopes"][0]
    ) == (
        "read",
        "modules/monitoring.bicep",
        "appInsights",
        (("prop", "id"),),
    )
    throttling = criterion("serviceBusThrottling")
    assert (throttling["metricName"], throttling["timeAggregation"]) == ("ThrottledRequests", "Total")


def test_alert_email_is_optional_and_every_alert_uses_it(tracer: Tracer) -> None:
    alerts = load_infra("modules/alerts.bicep")
    [group] = alerts.of_type("Microsoft.Insights/actionGroups")
    assert group.condition is not None
    assert trace(tracer, "modules/alerts.bicep", group.condition) == (
        "op",
        "!",
        ("call", "empty", param("alertEmail")),
    )
    assert load_infra(MAIN).params["alertEmail"].default == ""
    [receiver] = group.body["properties"]["emailReceivers"]
    assert trace(tracer, "modules/alerts.bicep", receiver["emailAddress"]) == param("alertEmail")
    for alert in alerts.of_type("Microsoft.Insights/metricAlerts"):
        actions = trace(tracer, "modules/alerts.bicep", alert.body["properties"]["actions"])
        assert actions[:2] == ("op", "?:") and actions[3] == ("array", ()), alert.symbol
        assert actions[4] == (
            "array",
            (
                (
                    "object",
                    (("actionGroupId", ("read", "modules/alerts.bicep", "operators", (("prop", "id"),))),),
                ),
            ),
        )


# ---- Flex: always-ready HTTP instances ---------------------------------------------------------------


def test_always_ready_http_instances_are_a_parameter_off_by_default(tracer: Tracer) -> None:
    main = load_infra(MAIN)
    assert main.params["httpAlwaysReadyInstances"].default == 0
    config = resource("modules/functionapp.bicep", "site").body["properties"]["functionAppConfig"]
    always_ready = trace(tracer, "modules/functionapp.bicep", config["scaleAndConcurrency"]["alwaysReady"])
    condition, when_on, when_off = always_ready[2:]
    assert condition == ("op", ">", param("httpAlwaysReadyInstances"), ("lit", 0))
    assert when_off == ("array", ())
    assert when_on == (
        "array",
        (("object", (("instanceCount", param("httpAlwaysReadyInstances")), ("name", ("lit", "http")))),),
    )


# ---- attaching to an existing (NimBus) Service Bus namespace -----------------------------------------


def test_an_existing_namespace_in_any_resource_group_can_be_attached(tracer: Tracer) -> None:
    main = load_infra(MAIN)
    modules = {m.symbol: m for m in main.modules}
    assert main.params["serviceBusNamespaceName"].default == ""
    assert main.params["serviceBusResourceGroupName"].default == ""
    assert main.variables["createServiceBusNamespace"].text == "empty(serviceBusNamespaceName)"
    namespace_module = modules["serviceBusNamespace"]
    assert namespace_module.condition is not None
    created = ("call", "empty", param("serviceBusNamespaceName"))
    assert trace(tracer, MAIN, namespace_module.condition) == created
    # Everything that touches the namespace runs in its resource group.
    for symbol in ("serviceBusNamespace", "serviceBus", "serviceBusRbac"):
        assert modules[symbol].body["scope"].text == "resourceGroup(serviceBusResourceGroup)", symbol
    assert main.variables["serviceBusResourceGroup"].text == (
        "empty(serviceBusResourceGroupName) ? resourceGroup().name : serviceBusResourceGroupName"
    )
    # The topology module creates no namespace: it references the one it is given.
    topology = load_infra("modules/servicebus.bicep")
    assert [r.existing for r in topology.of_type("Microsoft.ServiceBus/namespaces")] == [True]


def test_topics_that_exist_already_are_not_created(tracer: Tracer) -> None:
    topology = load_infra("modules/servicebus.bicep")
    for res in topology.resources:
        if res.type.startswith("Microsoft.ServiceBus/namespaces/") and not res.existing:
            assert res.condition is not None, res.symbol
            flag = trace(tracer, "modules/servicebus.bicep", res.condition)
            expected = "createResolverTopic" if res.symbol.startswith("resolver") else "createEndpointTopics"
            assert flag == param(expected), res.symbol
    main = load_infra(MAIN)
    assert main.params["createResolverTopic"].default is True
    assert main.params["createEndpointTopics"].default is True


def test_duplicate_detection_is_one_flag_for_the_topics_and_the_code(tracer: Tracer) -> None:
    on_topics = resource("modules/servicebus.bicep", "endpointTopics").body["properties"]
    flag = trace(tracer, "modules/servicebus.bicep", on_topics["requiresDuplicateDetection"])
    # On by default, and never claimed for topics Settle did not create (NimBus never enables it).
    assert flag == ("op", "&&", param("createEndpointTopics"), param("endpointDuplicateDetection"))
    assert load_infra(MAIN).params["endpointDuplicateDetection"].default is True
    assert on_topics["duplicateDetectionHistoryTimeWindow"] == "PT10M"
    settings = load_infra("modules/functionapp.bicep").variables["appSettings"]
    setting = trace(tracer, "modules/functionapp.bicep", settings["HANDOFF_DUPLICATE_DETECTION"])
    assert setting == ("op", "?:", flag, ("lit", "true"), ("lit", "false"))
    # The Resolver topic never detects duplicates: a rescheduled copy keeps its MessageId.
    assert (
        resource("modules/servicebus.bicep", "resolverTopic").body["properties"]["requiresDuplicateDetection"]
        is False
    )


def test_the_window_the_topics_get_is_the_one_the_reconciler_assumes(monkeypatch: pytest.MonkeyPatch) -> None:
    # HANDOFF_DUPLICATE_DETECTION=true (what infra/ sets) means DEFAULT_DUPLICATE_WINDOW to the reconciler,
    # which re-sends an unconfirmed control message only within that window (ADR-0012): a shorter window
    # on the topics than in the code would let a re-sent copy reach the endpoint a second time.
    from handoff.messages import transport

    window = resource("modules/servicebus.bicep", "endpointTopics").body["properties"][
        "duplicateDetectionHistoryTimeWindow"
    ]
    monkeypatch.setenv(transport.DUPLICATE_DETECTION, window)
    assert transport.duplicate_window_from_env() == transport.DEFAULT_DUPLICATE_WINDOW
    monkeypatch.setenv(transport.DUPLICATE_DETECTION, "true")
    assert transport.duplicate_window_from_env() == transport.DEFAULT_DUPLICATE_WINDOW


def test_subscriptions_and_rules_under_one_parent_are_created_one_after_the_other() -> None:
    topology = load_infra("modules/servicebus.bicep")
    chains = {
        "fanoutSubscriptions": {"resolverTopic", "endpointRetryRules[i]"},
        "endpointToRules": {"endpointDefaultRules[i]"},
        "endpointContinuationRules": {"endpointToRules[i]"},
        "endpointRetryRules": {"endpointContinuationRules[i]"},
        "fanoutFromRules": {"fanoutDefaultRules[i]"},
        "fanoutToRules": {"fanoutFromRules[i]"},
    }
    for symbol, depends in chains.items():
        assert {d.text for d in topology.resource(symbol).body["dependsOn"]} == depends, symbol


# ---- azd --------------------------------------------------------------------------------------------


def test_azd_deploys_the_same_bicep_and_finds_the_function_app() -> None:
    azure_yaml = (INFRA.parent / "azure.yaml").read_text()
    for line in ("provider: bicep", "path: infra", "module: main", "language: python", "host: function"):
        assert line in azure_yaml, line
    site = resource("modules/functionapp.bicep", "site")
    assert "'azd-service-name': 'api'" in site.body["tags"].text
    assert "  api:\n" in azure_yaml
    # azd fills environmentName from its environment; the Azure CLI path passes -p environmentName=...,
    # and the placeholder itself is longer than @maxLength, so forgetting it fails before anything changes.
    placeholder = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]["environmentName"][
        "value"
    ]
    assert placeholder == "${AZURE_ENV_NAME}"
    assert len(placeholder) > load_infra(MAIN).params["environmentName"].decorators["maxLength"][0]
