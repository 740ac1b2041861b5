"""Find pages: every match is listed, once, however many there are; a page says when more follow.

The 10,000 hand-offs are written straight into the event table and the lookup index (rows cloned from
one the resolver projected), so the test pays for the paging it checks, not for 10,000 projections.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest

from handoff import service
from handoff.storage import keys
from handoff.storage.ids import IdRef
from tests.support.handoff_flows import Flow
from tests.support.seeding import tables_of_this_module, upsert_all  # noqa: F401 (the fixture is autouse)

from .conftest import failed_event

MANY = 10_000


def _page(call: Any, **params: str) -> dict[str, Any]:
    answer = call("find_events", method="GET", params=params)
    assert answer.status == 200, answer.body
    return dict(answer.json)


def _every_page(call: Any, page_size: int | None = None, **params: str) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    token = None
    while True:
        asked = dict(params, **({"pageSize": str(page_size)} if page_size else {}))
        if token:
            asked["continuationToken"] = token
        pages.append(_page(call, **asked))
        token = pages[-1]["continuationToken"]
        if token is None:
            return pages
        assert len(pages) <= MANY, "the pages never end"


def _seed(resolve: Any, tag: str, session: str) -> tuple[str, list[str]]:
    """An endpoint with ``MANY`` failed hand-offs of one session, event ids ``{tag}-00000`` on."""
    endpoint = f"Many-{tag}"
    template = Flow(endpoint=endpoint, event_id=f"{tag}-template")
    resolve(template.request(session_id=session))
    store = service.store()
    entity = store.locate_event(endpoint, template.event_id)[1]
    assert entity is not None
    event_ids = [f"{tag}-{n:05d}" for n in range(MANY)]
    events, index = [], []
    for event_id in event_ids:
        row = dict(entity)
        row.update(
            PartitionKey=service.layout().now().event_partition(endpoint, event_id),
            RowKey=keys.event_row(event_id),
            EventId=event_id,
        )
        events.append(row)
        index += [
            IdRef("eventId", event_id, endpoint, event_id).entity(),
            IdRef("sessionId", session, endpoint, event_id).entity(),
        ]
    events_table, ids_table = store.table(keys.EVENTS_TABLE), store.table(keys.IDS_TABLE)
    upsert_all(events_table, events)
    upsert_all(ids_table, index)
    return endpoint, [template.event_id, *event_ids]


@pytest.fixture(scope="module")
def many(functions: dict[str, Any], settle_tables: str) -> tuple[str, str, str, list[str]]:
    tag = uuid.uuid4().hex[:6]
    session = f"Customer-{tag}"
    endpoint, event_ids = _seed(functions["resolver"].get_user_function(), tag, session)
    return tag, session, endpoint, event_ids


@pytest.mark.parametrize("by", ["q", "eventId"])
def test_ten_thousand_matches_are_each_listed_once_over_pages_that_say_more_follow(
    call, many, by: str
) -> None:
    tag, session, endpoint, event_ids = many
    text = session.lower() if by != "eventId" else tag.upper()
    pages = _every_page(call, 200 if by == "q" else 137, **{by: text})
    listed = [(e["endpointId"], e["eventId"]) for p in pages for e in p["items"]]
    expected = set(event_ids) if by != "eventId" else {e for e in event_ids if e.startswith(tag)}
    assert len(listed) == len(set(listed)), "a hand-off listed twice"
    assert {event for _, event in listed} == expected
    assert {e for e, _ in listed} == {endpoint}
    assert all(p["continuationToken"] for p in pages[:-1]) and pages[-1]["continuationToken"] is None


def test_a_first_page_holds_the_default_fifty_and_a_token_for_the_rest(call, many) -> None:
    _, session, _, event_ids = many
    first = _page(call, q=session)
    assert len(first["items"]) == 50 < len(event_ids)
    assert first["continuationToken"]
    second = _page(call, q=session, continuationToken=first["continuationToken"])
    assert not {e["eventId"] for e in first["items"]} & {e["eventId"] for e in second["items"]}


def test_a_token_of_another_find_or_an_edited_one_is_refused_naming_it(call, many) -> None:
    tag, session, _, _ = many
    token = _page(call, q=session, pageSize="5")["continuationToken"]
    raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    edited = base64.urlsafe_b64encode(json.dumps({**raw, "f": raw["f"][::-1]}).encode()).decode()
    for params in (
        {"q": tag, "continuationToken": token},  # another find's
        {"q": session, "continuationToken": edited},
        {"q": session, "continuationToken": "not-a-token"},
        {"q": session, "pageSize": "201"},
    ):
        answer = call("find_events", method="GET", params=params)
        assert answer.status == 400, params
        assert answer.json.get("field") in ("continuationToken", "pageSize"), answer.json


def test_a_hand_off_matched_by_two_of_its_ids_is_listed_once_with_both(call, resolve) -> None:
    tag = uuid.uuid4().hex[:8]
    both = Flow(endpoint=f"Twice-{tag}", event_id=f"dup{tag}")
    resolve(both.request(session_id=f"dup{tag}"))  # its session id is its event id
    pages = _every_page(call, 1, q=f"DUP{tag}")
    items = [e for p in pages for e in p["items"]]
    assert [(e["eventId"], sorted(m["kind"] for m in e["matches"])) for e in items] == [
        (both.event_id, ["eventId", "sessionId"])
    ]


def test_the_event_detail_says_why_it_failed_as_its_find_row_does(call, resolve) -> None:
    tag = uuid.uuid4().hex[:8]
    flow = Flow(endpoint=f"Why-{tag}", event_id=f"why-{tag}")
    failed_event(resolve, flow)
    found = _page(call, eventId=flow.event_id)["items"]
    detail = call(
        "endpoint_event", method="GET", route_params={"endpointId": flow.endpoint, "eventId": flow.event_id}
    )
    assert detail.status == 200, detail.body
    assert found[0]["reason"], "the find row carries the error text"
    assert detail.json["reason"] == found[0]["reason"]
    assert detail.json["resolutionStatus"] == "Failed"
