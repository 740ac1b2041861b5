"""The Service Bus topology in the Bicep is NimBus's (contract §1.1), and messages reach the resolver.

The expected topology below is written from shared/reference/nimbus-contract.md §1.1 (TopologyDescriptor).
The routing tests push messages through the *Bicep's* topology with a small evaluator of the filter and
action forms the topology uses (``user.X = 'v'``, ``1=1``, ``SET user.X = 'v'``) and Service Bus's
rule semantics (rules without action: one copy if any matches; each matching rule with an action: one
copy with the action applied; forwardTo: the copy is published to the target topic).
"""

from __future__ import annotations

import re

import pytest

from tests.infra.topology import (
    TRUE_FILTER,
    Rule,
    Subscription,
    Topology,
    bicep_topology,
    endpoints_from_parameters,
    norm_sql,
)

RESOLVER = "Resolver"


def expected(endpoints: list[str]) -> Topology:
    topo: Topology = {RESOLVER: {RESOLVER: Subscription(True, None, {"$Default": Rule(TRUE_FILTER)})}}
    for ep in endpoints:
        topo[ep] = {
            ep: Subscription(
                requires_session=True,
                forward_to=None,
                rules={
                    f"to-{ep}": Rule(f"user.To = '{ep}'"),
                    "continuation": Rule(
                        "user.To = 'Continuation'",
                        norm_sql(f"SET user.To='{ep}'; SET user.From='Continuation'"),
                    ),
                    "retry": Rule(
                        "user.To = 'Retry'", norm_sql(f"SET user.To='{ep}'; SET user.From='Retry'")
                    ),
                },
            ),
            RESOLVER: Subscription(
                requires_session=False,
                forward_to=RESOLVER,
                rules={
                    f"from-{ep}": Rule("user.To = 'Resolver'", f"SET user.From = '{ep}'"),
                    f"to-{ep}": Rule(f"user.To = '{ep}'"),
                },
            ),
        }
    return topo


def _normalise_spacing(topo: Topology) -> Topology:
    # Contract text writes "user.To='x'"; compare modulo spaces around '='.
    def fix(sql: str | None) -> str | None:
        return None if sql is None else re.sub(r"\s*=\s*", " = ", sql)

    return {
        t: {
            s: Subscription(
                sub.requires_session,
                sub.forward_to,
                {n: Rule(fix(r.filter) or "", fix(r.action)) for n, r in sub.rules.items()},
            )
            for s, sub in subs.items()
        }
        for t, subs in topo.items()
    }


def test_default_parameters_deploy_the_billing_endpoint() -> None:
    assert endpoints_from_parameters() == ["Billing"]


@pytest.mark.parametrize("endpoints", [["Billing"], ["Billing", "Shipping"]])
def test_bicep_topology_is_the_nimbus_topology(endpoints: list[str]) -> None:
    assert _normalise_spacing(bicep_topology(endpoints)) == _normalise_spacing(expected(endpoints))


# ---- routing ---------------------------------------------------------------------------------------

Message = dict[str, str]
_FILTER = re.compile(r"^user\.(\w+) = '([^']*)'$")
_SET = re.compile(r"^SET user\.(\w+) = '([^']*)'$")


def matches(sql: str, message: Message) -> bool:
    if sql.replace(" ", "") == "1=1":
        return True
    m = _FILTER.match(sql)
    assert m, f"filter form not modelled: {sql}"
    return message.get(m.group(1)) == m.group(2)


def apply(action: str, message: Message) -> Message:
    out = dict(message)
    for statement in action.split("; "):
        m = _SET.match(statement)
        assert m, f"action form not modelled: {statement}"
        out[m.group(1)] = m.group(2)
    return out


def publish(topo: Topology, topic: str, message: Message, hops: int = 0) -> list[tuple[str, str, Message]]:
    """Where copies of ``message`` published to ``topic`` end up: (topic, subscription, message)."""
    assert hops < 4, "forwarding loop"
    delivered: list[tuple[str, str, Message]] = []
    for sub_name, sub in topo[topic].items():
        copies: list[Message] = []
        if any(r.action is None and matches(r.filter, message) for r in sub.rules.values()):
            copies.append(dict(message))
        copies += [
            apply(r.action, message) for r in sub.rules.values() if r.action and matches(r.filter, message)
        ]
        for copy in copies:
            if sub.forward_to:
                delivered += publish(topo, sub.forward_to, copy, hops + 1)
            else:
                delivered.append((topic, sub_name, copy))
    return delivered


@pytest.fixture
def topo() -> Topology:
    return bicep_topology(["Billing", "Shipping"])


def test_a_response_reaches_the_resolver_attributed_to_its_endpoint(topo: Topology) -> None:
    # Given a subscriber of Billing answering with To=Resolver on its own topic (From is never set by it)
    response = {"To": "Resolver", "MessageType": "PendingHandoffResponse"}
    # Then exactly one copy reaches the Resolver subscription, stamped From=Billing, and nobody else
    assert publish(topo, "Billing", response) == [
        (
            "Resolver",
            "Resolver",
            {"To": "Resolver", "MessageType": "PendingHandoffResponse", "From": "Billing"},
        )
    ]


def test_a_settlement_control_message_reaches_the_endpoint_and_the_resolver(topo: Topology) -> None:
    # Given Settle's settlement sending HandoffCompletedRequest to the endpoint topic (From=Manager)
    control = {"To": "Billing", "From": "Manager", "MessageType": "HandoffCompletedRequest"}
    delivered = publish(topo, "Billing", control)
    # Then the endpoint's handler gets it and the resolver gets one unchanged copy
    assert sorted((t, s) for t, s, _ in delivered) == [("Billing", "Billing"), ("Resolver", "Resolver")]
    assert all(m == control for _, _, m in delivered)


def test_retry_and_continuation_go_to_the_endpoint_only_rewritten(topo: Topology) -> None:
    for address in ("Retry", "Continuation"):
        delivered = publish(topo, "Shipping", {"To": address, "MessageType": "RetryRequest"})
        assert delivered == [
            ("Shipping", "Shipping", {"To": "Shipping", "From": address, "MessageType": "RetryRequest"})
        ]


def test_messages_for_another_address_reach_nobody(topo: Topology) -> None:
    assert publish(topo, "Billing", {"To": "Shipping"}) == []
    assert publish(topo, "Billing", {"To": "Billing-reply"}) == []


def test_every_message_on_the_resolver_topic_reaches_the_resolver_subscription(topo: Topology) -> None:
    # The resolver's own scheduled redelivery publishes to the Resolver topic directly.
    assert publish(topo, "Resolver", {"To": "Resolver", "From": "Billing"}) == [
        ("Resolver", "Resolver", {"To": "Resolver", "From": "Billing"})
    ]
