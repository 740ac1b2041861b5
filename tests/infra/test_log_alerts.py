"""The log search alerts on Settle's own signals query metrics the code really records, by the attribute
names the code really uses (a renamed metric or attribute would silently never fire)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from common.telemetry import INSTRUMENTS
from tests.infra.bicep import Expr, load_infra
from tests.support.infra_reads import recorded_attributes

ROOT = Path(__file__).resolve().parents[2]


def alerts() -> list[dict[str, Any]]:
    value = load_infra("modules/alerts.bicep").variables["settleLogAlerts"]
    assert isinstance(value, list) and len(value) == 4
    return value


def test_each_alert_queries_a_metric_settle_records_by_its_recorded_attributes() -> None:
    recorded = recorded_attributes()
    for alert in alerts():
        query = alert["query"]
        [metric] = re.findall(r'name == "([^"]+)"', query)
        assert metric in INSTRUMENTS, (alert["name"], metric)
        for attribute in re.findall(r'customDimensions\["([^"]+)"\]', query):
            assert attribute in recorded.get(metric, set()), (alert["name"], metric, attribute)
        assert alert["column"] in query, alert["name"]


def test_poison_messages_expired_locks_overdue_hand_offs_and_unavailable_settlement_are_alerted_on() -> None:
    names = {a["name"]: a for a in alerts()}
    assert set(names) == {"poison-messages", "expired-locks", "overdue-handoffs", "settlement-unavailable"}
    assert '"poison"' in names["poison-messages"]["query"]
    assert '"off"' in names["overdue-handoffs"]["query"]
    assert '"unavailable"' in names["settlement-unavailable"]["query"]
    for alert in ("expired-locks", "settlement-unavailable"):
        assert isinstance(names[alert]["threshold"], Expr)  # a parameter, not a constant


def test_the_log_alerts_watch_application_insights_and_mail_the_operators() -> None:
    module = load_infra("modules/alerts.bicep")
    [rule] = module.of_type("Microsoft.Insights/scheduledQueryRules")
    properties = rule.body["properties"]
    assert "applicationInsightsId" in str(properties["scopes"])
    assert "operators.id" in str(properties["actions"]) and "alertEmail" in str(properties["actions"])
    assert rule.body["kind"] == "LogAlert"
