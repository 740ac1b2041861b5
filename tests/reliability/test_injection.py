"""OData injection: crafted keys and filter values never read another tenant's (or endpoint's) rows.

Settle builds filters with bound parameters (``@name``) and key ranges from escaped keys; these tests
hold that from the outside: a tenant's queries, reads and lock calls with OData-shaped text only ever
see that tenant's records, and a query without a tenant is refused.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Caller
from tests.reliability.nimbus_model import Msg, service_bus_message
from tests.reliability.tally import TALLY, Tally, sized

pytestmark = pytest.mark.slow

AREA = "injection"
MINE, THEIRS = 501, 502
FRAGMENTS = [
    "' or 1 eq 1",
    "' or '1' eq '1",
    "x' or TenantId eq 502 or 'a' eq 'a",
    "PartitionKey ge ''",
    "') or (PartitionKey ge '",
    "' or PartitionKey ne 'x",
    "secret",
    "order",
    "|",
    "502|4|11",
    "%27",
    "''",
    "*",
    "~",
]
crafted = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.lists(st.sampled_from([*FRAGMENTS, "'", " or ", " and ", "eq", "(", ")"]), min_size=1, max_size=5).map(
        "".join
    ),
    st.text(min_size=1, max_size=20),
)


def key(tenant: int, item_entity: str = "order", item: str | None = None) -> dict[str, Any]:
    return {
        "tenantId": tenant,
        "scopeId": 4,
        "entityId": 11,
        "itemEntityKey": item_entity,
        "itemKey": item or f"I-{uuid.uuid4().hex[:8]}",
    }


@pytest.fixture
def tenants(faulty_tables, call: Caller) -> dict[str, Any]:
    """Records of two tenants; the other tenant's hold "secret" everywhere a filter could look."""
    for tenant in (MINE, THEIRS):
        for item_entity in ("order", "secret", "' or 1 eq 1"):
            k = key(tenant, item_entity)
            assert call("state_upsert", {"key": k, "data": {"tenant": tenant}}).status == 200
    return {"mine": MINE, "theirs": THEIRS}


def only_mine(call: Caller, body: dict[str, Any], where: str, *, tally: Tally = TALLY) -> None:
    """The checker: a query of my tenant answers 200 or 400, and never with another tenant's record."""
    result = call("state_query", body)
    tally.add(AREA, operations=1, fuzz_cases=1)
    tally.check(AREA, result.status in (200, 400), f"{where}: {result.status} {result.body!r:.200}")
    if result.status == 200:
        tenants = {item["tenantId"] for item in result.json["items"]}
        tally.check(AREA, tenants <= {MINE}, f"{where}: read tenants {tenants}")


def only_this_key(
    items: list[dict[str, Any]], field: str, text: str, where: str, *, tally: Tally = TALLY
) -> None:
    """The checker for a crafted key: every record read is my tenant's, with exactly that key text."""
    for item in items:
        tally.check(AREA, item["tenantId"] == MINE and item[field] == text, f"{where}: read {item!r:.200}")


def test_a_query_always_requires_a_tenant(tenants, call):
    for body in (
        {},
        {"scopeId": 4},
        {"tenantId": None},
        {"tenantId": "' or 1 eq 1"},
        {"itemEntityKey": "order"},
    ):
        result = call("state_query", body)
        TALLY.add(AREA, operations=1)
        TALLY.check(
            AREA,
            result.status == 400 and result.content_type.startswith("application/problem+json"),
            f"{body}: {result.status}",
        )


def test_fixed_odata_payloads_stay_inside_the_tenant(tenants, call):
    mine = call("state_query", {"tenantId": MINE}).json["items"]
    TALLY.check(AREA, len(mine) == 3 and {i["tenantId"] for i in mine} == {MINE}, f"baseline {mine}")
    for text in FRAGMENTS:
        for field in ("itemEntityKey", "status", "continuationToken"):
            only_mine(call, {"tenantId": MINE, field: text}, f"{field}={text!r}")
            only_mine(call, {"tenantId": MINE, "scopeId": 4, field: text}, f"scoped {field}={text!r}")
            only_mine(
                call,
                {"tenantId": MINE, "scopeId": 4, "entityId": 11, field: text},
                f"entity {field}={text!r}",
            )


@settings(
    max_examples=sized(400, 30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=crafted, field=st.sampled_from(["itemEntityKey", "itemKey", "subItemKey", "subItemEntityKey"]))
def test_crafted_keys_never_reach_another_tenants_record(tenants, call, text, field):
    # Given a key of my tenant whose field is OData-shaped text
    k = key(MINE)
    k[field] = text
    where = f"{field}={text!r}"
    # When I read, test, lock and query with it
    for name in ("state_get", "state_exists", "state_history"):
        result = call(name, {"key": k})
        TALLY.add(AREA, operations=1, fuzz_cases=1)
        TALLY.check(AREA, result.status in (200, 400, 404), f"{where} {name}: {result.status}")
        items = [result.json] if name == "state_get" and result.status == 200 else []
        if name == "state_history" and result.status == 200:
            items = result.json["items"]
        # only ever this very key of my tenant (an earlier example may have locked it)
        only_this_key(items, field, text, f"{where} {name}")
    lock = call("state_lock", {"key": k, "lockSeconds": 5})
    TALLY.add(AREA, operations=1, fuzz_cases=1)
    TALLY.check(AREA, lock.status in (200, 400), f"{where} lock: {lock.status}")
    if field == "itemEntityKey":
        only_mine(call, {"tenantId": MINE, "itemEntityKey": text}, f"query {where}")
        only_mine(call, {"tenantId": MINE, "scopeId": 4, "itemEntityKey": text}, f"scoped query {where}")


def test_crafted_endpoint_and_event_ids_never_read_another_endpoints_event(faulty_tables, functions, call):
    # Given a parked event on another endpoint
    resolver = functions["resolver"].get_user_function()
    theirs, event_id = "Payroll-" + uuid.uuid4().hex[:6], str(uuid.uuid4())
    req = Msg("EventRequest", "req-x")
    for msg in (req, Msg("PendingHandoffResponse", "park-x", req.message_id)):
        resolver(service_bus_message(msg, endpoint=theirs, event_id=event_id))
    assert (
        call("event_get", method="GET", route_params={"endpointId": theirs, "eventId": event_id}).status
        == 200
    )
    for text in FRAGMENTS:
        for route in ({"endpointId": text, "eventId": event_id}, {"endpointId": "Billing", "eventId": text}):
            got = call("event_get", method="GET", route_params=route)
            TALLY.add(AREA, operations=1, fuzz_cases=1)
            TALLY.check(AREA, got.status in (400, 404), f"event_get {route}: {got.status} {got.body!r:.200}")
        nxt = call(
            "handoff_next", method="GET", route_params={"endpointId": text}, params={"eventTypeId": text}
        )
        job = call("handoff_job", method="GET", route_params={"endpointId": text, "externalJobId": text})
        mine = call(
            "handoff_next", method="GET", route_params={"endpointId": "Billing"}, params={"eventTypeId": text}
        )
        TALLY.add(AREA, operations=3, fuzz_cases=3)
        for name, result in (("next", nxt), ("job", job), ("next (mine)", mine)):
            TALLY.check(
                AREA,
                result.status in (204, 400, 404),
                f"{name} {text!r}: {result.status} {result.body!r:.200}",
            )
