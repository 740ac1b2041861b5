"""Figure: one find by each kind of id, at many endpoints x 4 shards, against today's per-endpoint reads.

The on-call operator has only the other team's id. ``GET v1/find?q=`` reads the lookup index ``hoids``
(docs/tables.md): the event-id range and the exact-id partition, then the hand-off found, whatever the
number of endpoints. Today's way (before the index) was one range read of ``hoevents`` per endpoint and
shard after the endpoint list (``ev|{id}`` for an event id, ``ss|`` for a session, ``jb|`` per endpoint
for a job; a message id could not be found at all): that is run here too, on the same rows, and counted
the same way. Both are counted at the wire (every Table request reaching Azurite, ``bench.proxy``).
The first :data:`PROJECTED` endpoints hold one parked hand-off each, through the resolver (request + park:
event id, session, message ids, job id); the others are listed endpoints with no event (inserted in
``hoendpoints`` directly, to keep the section short): today's way reads their partitions all the same, and
the index's cost does not depend on them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from bench.harness import Environment, Figure, missing, ratio, verdict_at_most
from bench.proxy import CountingProxy
from bench.workload import expect, nimbus_message
from handoff import service
from handoff.storage import keys

SECTION = "find"
SHARDS = 4
MAXIMUM = 3  # table requests of one find of one hand-off, at any number of endpoints and shards
PROJECTED = 20


def _park(env: Environment, endpoint: str, tag: str) -> dict[str, str]:
    ids = {
        "eventId": f"evt-{tag}-{endpoint}",
        "sessionId": f"order-{tag}-{endpoint}",
        "messageId": f"park-{tag}-{endpoint}",
        "externalJobId": f"JOB-{tag}-{endpoint}",
    }
    request = f"req-{tag}-{endpoint}"
    common: dict[str, Any] = {
        "event_id": ids["eventId"],
        "endpoint": endpoint,
        "session_id": ids["sessionId"],
    }
    env.app.message("resolver", nimbus_message("EventRequest", message_id=request, **common))
    park = nimbus_message(
        "PendingHandoffResponse",
        message_id=ids["messageId"],
        parent_message_id=request,
        extra={"HandoffReason": "awaiting ERP", "ExternalJobId": ids["externalJobId"]},
        **common,
    )
    env.app.message("resolver", park)
    return ids


def _per_endpoint(event_id: str) -> Callable[[], int]:
    """Today's find: the endpoint list, then the first page of ``ev|{id}``... in every endpoint and shard
    (sent from 8 threads to keep the section short: the proxy counts every request, whatever its thread)."""

    def run() -> int:
        store = service.store()
        table = store.table(keys.EVENTS_TABLE)
        low = "ev|" + keys.encode(event_id)
        high = low + "\uffff"

        def first_page(pk: str) -> int:
            query = f"PartitionKey eq '{pk}' and RowKey ge '{low}' and RowKey lt '{high}'"
            page: Any = next(table.query_entities(query, results_per_page=50).by_page(), [])
            return len(list(page))

        partitions = [pk for e in store.endpoints() for pk in store.endpoint_partitions(e)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            return sum(pool.map(first_page, partitions))

    return run


def _counted(proxy: CountingProxy, env: Environment, call: Callable[[], Any]) -> tuple[int, Any]:
    proxy.wait_quiet(env.sizes.roundtrip_quiet_s)
    start = proxy.count
    result = call()
    proxy.wait_quiet(env.sizes.roundtrip_quiet_s)
    return len(proxy.since(start)), result


def run(env: Environment) -> list[Figure]:
    endpoints = env.sizes.find_endpoints
    size = f"{endpoints} endpoints x {SHARDS} shards"
    if not all(env.app.has(f) for f in ("find_events", "resolver")):
        return [missing(SECTION, f"find ({size})", f"<= {MAXIMUM} requests", "function not registered")]
    figures: list[Figure] = []
    previous = os.environ.get("SETTLE_HANDOFF_SHARDS")
    with CountingProxy(env.table_endpoint()) as proxy:
        env.use_fresh_prefix(
            connection=proxy.connection_string(env.connection), SETTLE_HANDOFF_SHARDS=str(SHARDS)
        )
        try:
            tag = uuid.uuid4().hex[:6]

            parked = [_park(env, f"Node{n:03d}", tag) for n in range(min(endpoints, PROJECTED))]
            with ThreadPoolExecutor(max_workers=8) as pool:
                names = [f"Node{n:03d}" for n in range(len(parked), endpoints)]
                list(pool.map(service.store().register_endpoint, names))
            wanted = parked[len(parked) // 2]
            measured = 0.0
            env.app.http("find_events", method="GET", params={"q": "warm-up"})  # clients and tables exist
            for kind, value in wanted.items():
                typed = value.lower() if kind != "messageId" else value.upper()  # the other team's case
                find = partial(env.app.http, "find_events", method="GET", params={"q": typed})
                requests, answer = _counted(proxy, env, find)
                items = expect(answer, 200, what="find_events").json["items"]
                found = [(i["eventId"], i["matchedBy"]) for i in items]
                if found != [(wanted["eventId"], kind)]:
                    figures.append(missing(SECTION, f"find by {kind} ({size})", "", f"found {found}"))
                    continue
                today: float | None = None
                note = "today: no way to find a hand-off by its message id"
                if kind == "eventId":
                    # Counted once: the session's ss| and the job's jb| ranges are the same reads.
                    measured = float(_counted(proxy, env, _per_endpoint(value))[0])
                if kind != "messageId":
                    today = measured
                    note = f"today: the endpoint list + one range read per endpoint and shard ({int(today)})"
                    if kind != "eventId":
                        rows = "ss|" if kind == "sessionId" else "jb|"
                        note += f"; counted for the event id, the {rows} ranges are the same reads"
                figures.append(
                    Figure(
                        section=SECTION,
                        name=f"find by {kind} ({size})",
                        settle=float(requests),
                        baseline=today,
                        ratio=ratio(requests, today) if today else None,
                        target=f"<= {MAXIMUM} requests",
                        verdict=verdict_at_most(requests, MAXIMUM),
                        unit="requests",
                        note=note,
                    )
                )
        finally:
            if previous is None:
                os.environ.pop("SETTLE_HANDOFF_SHARDS", None)
            else:
                os.environ["SETTLE_HANDOFF_SHARDS"] = previous
            env.use_fresh_prefix()
    env.details["find"] = {"endpoints": endpoints, "shards": SHARDS, "with_a_hand_off": PROJECTED}
    return figures
