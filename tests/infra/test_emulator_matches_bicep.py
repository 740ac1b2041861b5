"""The local Service Bus emulator (emulator/Config.json) declares the same topology as the Bicep.

Compared for the endpoints of infra/main.parameters.json: topics, subscriptions, session flags,
forwarding, rule names, filters and actions (normalised as described in tests/infra/topology.py).
Deliberately not compared: TTLs, lock durations and delivery counts, which the emulator may set
differently for local runs. A missing Config.json fails (it is part of the project, see emulator/).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.infra.bicep import REPO
from tests.infra.topology import bicep_topology, emulator_topology, endpoints_from_parameters

CONFIG = REPO / "emulator" / "Config.json"


def test_emulator_config_exists() -> None:
    assert CONFIG.is_file(), "emulator/Config.json is missing: the emulator must declare the Bicep topology"


def test_emulator_declares_the_same_topics_subscriptions_sessions_forwarding_and_rules() -> None:
    assert CONFIG.is_file(), "emulator/Config.json is missing"
    emulator = emulator_topology(CONFIG)
    bicep = bicep_topology(endpoints_from_parameters())
    assert sorted(emulator) == sorted(bicep), "topics differ"
    for topic, subs in bicep.items():
        assert sorted(emulator[topic]) == sorted(subs), f"subscriptions of {topic} differ"
        for name, sub in subs.items():
            assert emulator[topic][name] == sub, f"{topic}/{name}"


def test_a_drifted_emulator_config_is_detected(tmp_path: Path) -> None:
    # Given the emulator config with the fan-out subscription no longer forwarding to the resolver
    assert CONFIG.is_file(), "emulator/Config.json is missing"
    config = json.loads(CONFIG.read_text())
    for topic in config["UserConfig"]["Namespaces"][0]["Topics"]:
        for sub in topic.get("Subscriptions", []):
            if topic["Name"] != "Resolver" and sub["Name"] == "Resolver":
                sub["Properties"]["ForwardTo"] = ""
    drifted = tmp_path / "Config.json"
    drifted.write_text(json.dumps(config))
    # Then the comparison sees the difference
    assert emulator_topology(drifted) != bicep_topology(endpoints_from_parameters())
