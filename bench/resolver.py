"""Figure 5: resolver throughput. NimBus messages (each event: EventRequest, PendingHandoffResponse,
HandoffCompletedRequest, ResolutionResponse) projected one after another through the ``resolver``
function ÷ raw single-entity upserts per second, in alternating blocks on the same Azurite. For context,
the same blocks also time the projection's own floor: a point read plus a 2-entity transaction, raw.

One projection reads the event row and writes history + event row in one transaction, so its floor is
about half the raw upsert rate (target: at least 0.5 of it).
"""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Environment, Figure, median, missing, verdict_at_least
from bench.workload import event_messages, raw_entity, unique_row

SECTION = "resolver"
TARGET = 0.5


class _ResolverFailed(Exception):
    """The resolver (the code under test) raised; reported as a finding, not a benchmark crash."""


def run(env: Environment) -> list[Figure]:
    name = "messages/s / raw upserts/s"
    target = f">= {TARGET}x"
    if not env.app.has("resolver"):
        return [missing(SECTION, name, target, "resolver not registered", unit="msg/s")]
    env.use_fresh_prefix()
    events = env.sizes.resolver_events
    blocks = env.sizes.resolver_blocks
    messages: list[Any] = [m for n in range(events) for _, m in event_messages("Billing", n)]
    per_block = max(1, len(messages) // blocks)
    table = env.raw_table("upsert")
    raw_rows = [raw_entity(f"p-{n % 50}", unique_row()) for n in range(len(messages))]

    # Warm-up (table creation, connections), not recorded.
    table.upsert_entity(raw_entity("warm", "warm"))
    try:
        for _, warm in event_messages("Billing", 10_000_000):
            env.app.message("resolver", warm)
    except Exception as exc:  # a crash in the code under test is a finding
        return [missing(SECTION, name, target, f"resolver raised {exc!r}", unit="msg/s")]

    settle_rates: list[float] = []
    raw_rates: list[float] = []
    ratios: list[float] = []
    floor_rates: list[float] = []
    floor_ratios: list[float] = []
    for b in range(blocks):
        chunk = messages[b * per_block : (b + 1) * per_block]
        rows = raw_rows[b * per_block : (b + 1) * per_block]
        if not chunk:
            break

        def project(chunk: list[Any] = chunk) -> float:
            start = time.perf_counter()
            try:
                for message in chunk:
                    env.app.message("resolver", message)
            except Exception as exc:  # a crash in the code under test is a finding
                raise _ResolverFailed(repr(exc)) from exc
            return len(chunk) / (time.perf_counter() - start)

        def upsert(rows: list[dict[str, Any]] = rows) -> float:
            start = time.perf_counter()
            for row in rows:
                table.upsert_entity(row)
            return len(rows) / (time.perf_counter() - start)

        def read_and_transact(rows: list[dict[str, Any]] = rows) -> float:
            # The projection's own floor: one point read, then history row + event row in one transaction.
            start = time.perf_counter()
            for row in rows:
                table.get_entity("warm", "warm")  # a row that exists, as the event row does after the first
                history = {**row, "RowKey": row["RowKey"] + "-h"}
                table.submit_transaction([("upsert", row), ("upsert", history)])
            return len(rows) / (time.perf_counter() - start)

        try:
            if b % 2 == 0:
                settle_rate, raw_rate, floor_rate = project(), upsert(), read_and_transact()
            else:
                floor_rate, raw_rate, settle_rate = read_and_transact(), upsert(), project()
        except _ResolverFailed as exc:
            return [missing(SECTION, name, target, f"resolver raised {exc}", unit="msg/s")]
        settle_rates.append(settle_rate)
        raw_rates.append(raw_rate)
        floor_rates.append(floor_rate)
        ratios.append(settle_rate / raw_rate)
        floor_ratios.append(settle_rate / floor_rate)
    value = median(ratios)
    env.details["resolver"] = {
        "messages": len(messages),
        "events": events,
        "blocks": len(ratios),
        "messages_per_s": settle_rates,
        "raw_upserts_per_s": raw_rates,
        "raw_read_plus_transaction_per_s": floor_rates,
    }
    return [
        Figure(
            section=SECTION,
            name=name,
            settle=median(settle_rates),
            baseline=median(raw_rates),
            ratio=value,
            target=target,
            verdict=verdict_at_least(value, TARGET),
            unit="msg/s",
            note=f"{len(messages)} messages over {events} events, {len(ratios)} alternating blocks",
        ),
        Figure(
            section=SECTION,
            name="messages/s / raw (read + 2-entity transaction)/s",
            settle=median(settle_rates),
            baseline=median(floor_rates),
            ratio=median(floor_ratios),
            target="(context)",
            verdict="info",
            unit="msg/s",
            note="the same two requests a projection makes, raw, in the same blocks",
        ),
    ]
