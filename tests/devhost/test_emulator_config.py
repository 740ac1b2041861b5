"""``emulator/``: the official Service Bus emulator's compose file and a Config.json it accepts.

(The topology is compared with ``infra/`` by the infra tests; here: the emulator's own limits and shape,
from its published JSON schema, so ``docker compose up`` does not fail on a machine that has Docker.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "emulator" / "Config.json"
COMPOSE = ROOT / "emulator" / "docker-compose.yml"
NAME = re.compile(r"^[A-Za-z0-9]$|^[A-Za-z0-9][\w\-./]*[A-Za-z0-9]$")
DURATION = re.compile(r"^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?$")


def seconds(duration: str) -> int:
    match = DURATION.match(duration)
    assert match, duration
    hours, minutes, secs = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + secs


def namespace() -> dict[str, Any]:
    document = json.loads(CONFIG.read_text())
    namespaces = document["UserConfig"]["Namespaces"]
    assert document["UserConfig"]["Logging"]["Type"] in {"File", "Console", "File,Console", "Console,File"}
    assert len(namespaces) == 1 and namespaces[0]["Name"] == "sbemulatorns"  # the only name it accepts
    return dict(namespaces[0])


def subscriptions() -> dict[tuple[str, str], dict[str, Any]]:
    return {(t["Name"], s["Name"]): s for t in namespace()["Topics"] for s in t["Subscriptions"]}


def test_every_entity_respects_the_emulators_limits() -> None:
    ns = namespace()
    assert len(ns["Queues"]) + len(ns["Topics"]) <= 50
    for topic in ns["Topics"]:
        assert NAME.match(topic["Name"])
        assert seconds(topic["Properties"]["DefaultMessageTimeToLive"]) <= 3600
        assert 5 <= seconds(topic["Properties"]["DuplicateDetectionHistoryTimeWindow"]) <= 300
        assert 1 <= len(topic["Subscriptions"]) <= 50
    for (_, name), sub in subscriptions().items():
        props = sub["Properties"]
        assert NAME.match(name)
        assert 60 <= seconds(props["LockDuration"]) <= 300  # the emulator's lock range
        assert 1 <= props["MaxDeliveryCount"] <= 10
        assert seconds(props["DefaultMessageTimeToLive"]) <= 3600
        for rule in sub["Rules"]:
            assert NAME.match(rule["Name"]), rule["Name"]
            assert rule["Properties"]["FilterType"] == "Sql"
            assert rule["Properties"]["SqlFilter"]["SqlExpression"]


def test_duplicate_detection_as_in_infra() -> None:
    topics = {t["Name"]: t["Properties"] for t in namespace()["Topics"]}
    # Endpoint topics drop a retried settlement's duplicate (infra: PT10M; the emulator allows at most PT5M).
    assert topics["Billing"]["RequiresDuplicateDetection"] is True
    # The Resolver topic must not: a rescheduled copy keeps its MessageId (contract §2.1).
    assert topics["Resolver"]["RequiresDuplicateDetection"] is False


def test_the_resolver_subscription_is_session_enabled() -> None:
    resolver = subscriptions()[("Resolver", "Resolver")]
    assert resolver["Properties"]["RequiresSession"] is True
    assert resolver["Rules"] == []  # the default true filter: everything forwarded to Resolver


def test_the_sample_endpoint_forwards_to_the_resolver_with_nimbus_rules() -> None:
    subs = subscriptions()
    endpoint = subs[("Billing", "Billing")]
    assert endpoint["Properties"]["RequiresSession"] is True
    rules = {r["Name"]: r["Properties"] for r in endpoint["Rules"]}
    assert rules["to-Billing"]["SqlFilter"]["SqlExpression"] == "user.To = 'Billing'"
    assert rules["retry"]["Action"]["SqlExpression"] == "SET user.To = 'Billing'; SET user.From = 'Retry'"
    assert rules["continuation"]["Action"]["SqlExpression"] == (
        "SET user.To = 'Billing'; SET user.From = 'Continuation'"
    )
    fan_out = subs[("Billing", "Resolver")]
    assert fan_out["Properties"]["ForwardTo"] == "Resolver"
    assert fan_out["Properties"]["RequiresSession"] is False
    rules = {r["Name"]: r["Properties"] for r in fan_out["Rules"]}
    assert rules["from-Billing"]["SqlFilter"]["SqlExpression"] == "user.To = 'Resolver'"
    assert rules["from-Billing"]["Action"]["SqlExpression"] == "SET user.From = 'Billing'"
    assert rules["to-Billing"]["SqlFilter"]["SqlExpression"] == "user.To = 'Billing'"


def test_the_compose_file_runs_the_official_images_with_this_config() -> None:
    compose = COMPOSE.read_text()
    assert "image: mcr.microsoft.com/azure-messaging/servicebus-emulator:latest" in compose
    assert "image: mcr.microsoft.com/azure-sql-edge:latest" in compose
    assert '"./Config.json:/ServiceBus_Emulator/ConfigFiles/Config.json:ro"' in compose
    assert '"5672:5672"' in compose
    assert "SQL_SERVER: sqledge" in compose
    assert 'ACCEPT_EULA: "${ACCEPT_EULA:?' in compose  # the licence must be accepted explicitly
