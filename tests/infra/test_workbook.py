"""The operations Workbook (infra/workbooks/settle-operations.json, deployed by modules/workbook.bicep): a
Workbook the portal can open, on the Log Analytics workspace, that reads only what Settle records.

A renamed metric, attribute or span would leave a chart silently empty, so every name a query reads is
checked against the code: metrics against ``common.telemetry.INSTRUMENTS`` and the attributes the code
records them with, spans against the names the code opens them with.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from common.telemetry import INSTRUMENTS, OUTCOME
from state.catchup import CatchupResult
from tests.infra.bicep import INFRA, Expr, load_infra
from tests.support.infra_reads import recorded_attributes

ROOT = Path(__file__).resolve().parents[2]
WORKBOOK = INFRA / "workbooks" / "settle-operations.json"
PLACEHOLDER = "__SETTLE_WORKSPACE_ID__"
WORKSPACE = "microsoft.operationalinsights/workspaces"
# Workspace-based Application Insights: Settle's metrics land in AppMetrics, its spans in AppDependencies.
TABLES = {"AppMetrics", "AppDependencies"}
SPAN = re.compile(r"""(?:telemetry\.span\(\s*|span=)f?"(settle\.[a-z_.{}]+)\"""")


def workbook() -> dict[str, Any]:
    data = json.loads(WORKBOOK.read_text())
    assert isinstance(data, dict)
    return data


def queries(data: dict[str, Any] | None = None) -> dict[str, str]:
    """The KQL of every query item, by item name."""
    items = (data or workbook())["items"]
    return {i["name"]: i["content"]["query"] for i in items if i["type"] == 3}


def recorded_spans() -> set[str]:
    found: set[str] = set()
    for folder in ("common", "state", "handoff", "management"):
        for path in (ROOT / folder).rglob("*.py"):
            found.update(SPAN.findall(path.read_text()))
    return found


def span_attributes() -> set[str]:
    """What the spans a query may read carry (the outcome, and catch-up's counts: state/catchup.py)."""
    return {OUTCOME} | {f"settle.catchup.{f.name}" for f in fields(CatchupResult)}


def check_names(data: dict[str, Any]) -> list[str]:
    """Every name a query reads that Settle does not record (empty when the Workbook is right)."""
    wrong: list[str] = []
    metric_attributes, spans = recorded_attributes(), recorded_spans()
    for name, kql in queries(data).items():
        table = kql.split("\n", 1)[0].strip()
        if table not in TABLES:
            wrong.append(f"{name}: table {table}")
            continue
        read = re.findall(r'Name == "([^"]+)"', kql)
        for listed in re.findall(r"Name in \(([^)]*)\)", kql):
            read += re.findall(r'"([^"]+)"', listed)
        if not read:
            wrong.append(f"{name}: reads no metric or span by name")
        attributes = re.findall(r'Properties\["([^"]+)"\]', kql)
        for item in read:
            if table == "AppMetrics" and item not in INSTRUMENTS:
                wrong.append(f"{name}: metric {item}")
            if table == "AppDependencies" and item not in spans:
                wrong.append(f"{name}: span {item}")
            for attribute in attributes:
                known = metric_attributes.get(item, set()) if table == "AppMetrics" else span_attributes()
                if attribute not in known:
                    wrong.append(f"{name}: attribute {attribute} of {item}")
    return wrong


def test_the_workbook_is_a_notebook_the_portal_opens_on_the_workspace() -> None:
    data = workbook()
    assert data["version"] == "Notebook/1.0"
    assert data["fallbackResourceIds"] == [PLACEHOLDER]
    names = [i["name"] for i in data["items"]]
    assert len(names) == len(set(names)), "item names are unique"
    assert {i["type"] for i in data["items"]} <= {1, 3, 9}  # text, query, parameters
    [parameters] = [i for i in data["items"] if i["type"] == 9]
    defined = {p["name"] for p in parameters["content"]["parameters"]}
    for item in (i for i in data["items"] if i["type"] == 3):
        content = item["content"]
        assert content["version"] == "KqlItem/1.0" and content["queryType"] == 0, item["name"]
        assert content["resourceType"] == WORKSPACE, item["name"]
        assert content["timeContextFromParameter"] in defined, item["name"]
        assert content["visualization"] in {"table", "timechart", "barchart", "tiles"}, item["name"]
        for used in re.findall(r"\{(\w+)(?::\w+)?\}", content["query"]):
            assert used in defined, (item["name"], used)


def test_every_query_reads_a_metric_or_span_settle_records_by_its_recorded_attributes() -> None:
    assert check_names(workbook()) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"settle.handoff.overdue"', '"settle.handoff.late"'),  # a metric Settle does not record
        ('Properties["outcome"]', 'Properties["result"]'),  # an attribute it does not record
        ('"settle.resolver.project"', '"settle.resolver.run"'),  # a span it does not open
        ("AppDependencies\n", "customEvents\n"),  # a table it does not write
    ],
)
def test_the_name_check_catches_a_name_settle_does_not_record(old: str, new: str) -> None:
    text = WORKBOOK.read_text()
    assert json.dumps(old)[1:-1] in text
    broken = json.loads(text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))
    assert check_names(broken) != []


def test_the_workbook_draws_each_signal_an_operator_needs() -> None:
    kql = "\n".join(queries().values())
    for metric in (
        "settle.handoff.parked",  # hand-offs in flight, per endpoint
        "settle.handoff.overdue",  # ... and overdue
        "settle.handoff.settlements",  # settlements by outcome, unconfirmed among them
        "settle.reconciler.claims",  # unconfirmed claims the reconciler gave up on
        "settle.resolver.messages",  # poison per day
        "settle.state.locks",  # locks taken
        "settle.catchup.expired_locks",  # locks expired
    ):
        assert f'"{metric}"' in kql, metric
    for span in ("settle.catchup.run", "settle.resolver.project"):  # catch-up duration, resolver latency
        assert f'Name == "{span}"' in kql and "DurationMs" in kql, span
    assert 'tostring(Properties["outcome"]) == "poison"' in kql and "bin(TimeGenerated, 1d)" in kql
    assert 'Properties["endpoint"]' in kql


def test_the_bicep_deploys_the_workbook_on_the_workspace_with_its_json() -> None:
    module = load_infra("modules/workbook.bicep")
    [resource] = module.of_type("Microsoft.Insights/workbooks")
    assert resource.api_version == "2023-06-01"
    body = resource.body
    assert body["kind"] == "shared"
    properties = body["properties"]
    assert "logAnalyticsWorkspaceId" in str(properties["sourceId"])
    serialized = str(properties["serializedData"])
    assert "loadTextContent('../workbooks/settle-operations.json')" in serialized
    assert PLACEHOLDER in serialized and "logAnalyticsWorkspaceId" in serialized
    assert isinstance(body["name"], Expr) and "guid(" in str(
        body["name"]
    )  # a shared Workbook's name is a GUID

    main = load_infra("main.bicep")
    [call] = [m for m in main.modules if m.path == "modules/workbook.bicep"]
    assert "monitoring.outputs.workspaceId" in str(call.body["params"]["logAnalyticsWorkspaceId"])
