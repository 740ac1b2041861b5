"""The Service Bus topology as plain data, from the Bicep template or from the emulator's Config.json.

Both sides are normalised the same way so they can be compared with ``==``:
- SQL expressions: whitespace collapsed, statements split on ``;`` and re-joined with ``"; "``;
- effective rules: a rule whose filter can never match (``1=0``, how the Bicep neutralises the ``$Default``
  rule ARM adds to every subscription) is dropped; a subscription that declares no rule at all gets the
  broker's implicit ``$Default`` true filter (``1=1``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.infra.bicep import INFRA, Expr, Interp, load_infra

TRUE_FILTER = "1=1"
FALSE_FILTER = "1=0"


@dataclass(frozen=True)
class Rule:
    filter: str
    action: str | None = None


@dataclass(frozen=True)
class Subscription:
    requires_session: bool
    forward_to: str | None
    rules: dict[str, Rule]


Topology = dict[str, dict[str, Subscription]]


def norm_sql(sql: str | None) -> str | None:
    if sql is None or not sql.strip():
        return None
    statements = [" ".join(s.split()) for s in sql.split(";")]
    return "; ".join(s for s in statements if s)


def effective(rules: dict[str, Rule]) -> dict[str, Rule]:
    if not rules:
        return {"$Default": Rule(TRUE_FILTER)}
    return {name: rule for name, rule in rules.items() if rule.filter.replace(" ", "") != FALSE_FILTER}


def endpoints_from_parameters() -> list[str]:
    """The ``endpoints`` of ``infra/main.parameters.json`` (else main.bicep's default)."""
    params = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    if "endpoints" in params:
        return list(params["endpoints"]["value"])
    default = load_infra("main.bicep").params["endpoints"].default
    assert isinstance(default, list)
    return [str(e) for e in default]


def _render(value: Any, env: dict[str, str]) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Interp):
        return value.render(env)
    if isinstance(value, Expr) and value.text in env:
        return env[value.text]
    raise AssertionError(f"cannot evaluate {value!r} with {sorted(env)}")


_PARENT = re.compile(r"^(\w+)(?:\[(\w+)\])?$")


def bicep_topology(endpoints: list[str]) -> Topology:
    """Expand servicebus.bicep's resources (and their loops over ``endpoints``) into a ``Topology``."""
    sb = load_infra("modules/servicebus.bicep")
    main = load_infra("main.bicep")
    # main passes its own resolverName to the module; use that value, not only the module's default.
    module_params = next(m for m in main.modules if m.path == "modules/servicebus.bicep").body["params"]
    base: dict[str, str] = {
        name: p.default for name, p in sb.params.items() if p.has_default and isinstance(p.default, str)
    }
    for name, passed in module_params.items():
        if isinstance(passed, Expr) and isinstance(main.variables.get(passed.text), str):
            base[name] = main.variables[passed.text]
    instances: dict[str, list[tuple[dict[str, str], str, Any]]] = {}
    topo: Topology = {}
    pending_rules: list[tuple[str, str, str, Rule]] = []
    for res in sb.resources:
        if not res.type.lower().startswith("microsoft.servicebus/"):
            continue  # diagnostic settings and the like are not topology
        envs = [dict(base)]
        if res.loop is not None:
            assert res.loop.iterable.text == "endpoints", res.loop.iterable
            envs = []
            for i, ep in enumerate(endpoints):
                env = {**base, res.loop.item: ep}
                if res.loop.index:
                    env[res.loop.index] = str(i)
                envs.append(env)
        for env in envs:
            if res.type.endswith("/namespaces"):
                instances.setdefault(res.symbol, []).append((env, "", ()))
                continue
            name = _render(res.body["name"], env)
            parent_path: Any = None
            parent = res.body.get("parent")
            if parent is not None:
                match = _PARENT.match(parent.text)
                assert match, parent
                symbol, index = match.groups()
                parents = instances[symbol]
                parent_path = parents[int(env[index])][2] if index else parents[0][2]
            kind = res.type.rsplit("/", 1)[-1]
            props = res.body.get("properties", {})
            if kind == "topics":
                path: Any = (name,)
                topo[name] = {}
            elif kind == "subscriptions":
                path = (*parent_path, name)
                forward = props.get("forwardTo")
                topo[parent_path[0]][name] = Subscription(
                    requires_session=bool(props.get("requiresSession", False)),
                    forward_to=_render(forward, env) if forward is not None else None,
                    rules={},
                )
            elif kind == "rules":
                path = (*parent_path, name)
                assert props.get("filterType") == "SqlFilter", f"{res.symbol}: only SQL filters are modelled"
                action = props.get("action", {}).get("sqlExpression")
                rule = Rule(
                    filter=norm_sql(_render(props["sqlFilter"]["sqlExpression"], env)) or "",
                    action=norm_sql(_render(action, env)) if action is not None else None,
                )
                pending_rules.append((parent_path[0], parent_path[1], name, rule))
            else:
                raise AssertionError(f"unexpected resource type {res.type}")
            instances.setdefault(res.symbol, []).append((env, name, path))
    for topic, sub, name, rule in pending_rules:
        topo[topic][sub].rules[name] = rule
    return {
        topic: {
            name: Subscription(s.requires_session, s.forward_to, effective(s.rules))
            for name, s in subs.items()
        }
        for topic, subs in topo.items()
    }


def _emulator_filter(props: dict[str, Any]) -> str:
    kind = props.get("FilterType", "Sql")
    if kind == "Sql":
        return norm_sql(props.get("SqlFilter", {}).get("SqlExpression")) or TRUE_FILTER
    if kind == "Correlation":
        corr = dict(props.get("CorrelationFilter", {}))
        terms = [f"user.{k} = '{v}'" for k, v in corr.pop("Properties", {}).items()]
        terms += [f"sys.{k} = '{v}'" for k, v in corr.items() if v not in (None, "")]
        return " AND ".join(terms) or TRUE_FILTER
    if kind in ("True", "TrueFilter"):
        return TRUE_FILTER
    if kind in ("False", "FalseFilter"):
        return FALSE_FILTER
    raise AssertionError(f"unknown emulator FilterType {kind!r}")


def emulator_topology(config_path: Path) -> Topology:
    """The topics of the emulator's (single) namespace as a ``Topology``."""
    config = json.loads(config_path.read_text())
    namespaces = config["UserConfig"]["Namespaces"]
    assert len(namespaces) == 1, "the emulator hosts exactly one namespace"
    topo: Topology = {}
    for topic in namespaces[0].get("Topics", []):
        subs: dict[str, Subscription] = {}
        for sub in topic.get("Subscriptions", []):
            props = sub.get("Properties", {})
            rules: dict[str, Rule] = {}
            for rule in sub.get("Rules", []) or []:
                rprops = rule.get("Properties", {})
                action = (rprops.get("Action") or {}).get("SqlExpression")
                rules[rule["Name"]] = Rule(filter=_emulator_filter(rprops), action=norm_sql(action))
            subs[sub["Name"]] = Subscription(
                requires_session=bool(props.get("RequiresSession", False)),
                forward_to=props.get("ForwardTo") or None,
                rules=effective(rules),
            )
        topo[topic["Name"]] = subs
    return topo
