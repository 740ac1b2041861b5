"""Figure 5: resolver throughput. NimBus messages (each event: EventRequest, PendingHandoffResponse,
HandoffCompletedRequest, ResolutionResponse) projected one after another through the ``resolver``
function ÷ raw single-entity upserts per second, in alternating blocks on the same Azurite.

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
    for b in range(blocks):
        chunk = messages[b * per_block : (b + 1) * per_block]
        rows = raw_rows[b * per_block : (b + 1) * per_block]
        if not chunk:
            break

        def project(chunk: list[Any] = chunk) -> float:
            start = time.perf_counter()
            for message in chunk:
                env.app.message("resolver", message)
            return len(chunk) / (time.perf_counter() - start)

        def upsert(rows: list[dict[str, Any]] = rows) -> float:
            start = time.perf_counter()
            for row in rows:
                table.upsert_entity(row)
            return len(rows) / (time.perf_counter() - start)

        try:
            if b % 2 == 0:
                settle_rate, raw_rate = project(), upsert()
            else:
                raw_rate, settle_rate = upsert(), project()
        except Exception as exc:  # a crash in the code under test is a finding
            return [missing(SECTION, name, target, f"resolver raised {exc!r}", unit="msg/s")]
        settle_rates.append(settle_rate)
        raw_rates.append(raw_rate)
        ratios.append(settle_rate / raw_rate)
    value = median(ratios)
    env.details["resolver"] = {
        "messages": len(messages),
        "events": events,
        "blocks": len(ratios),
        "messages_per_s": settle_rates,
        "raw_upserts_per_s": raw_rates,
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
        )
    ]
