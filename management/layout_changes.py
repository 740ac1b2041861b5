"""The shard layouts as operators see and change them: the recorded layout of each family with its pending
change, earlier layouts and audited changes, and the one audited step that changes a layout.

The service behind ``GET /api/v1/layout`` and ``POST /api/v1/layout/{family}``
(:mod:`management.layout_functions`) and ``make reshard`` (:mod:`management.reshard`). The recording,
the eras and the audit rows themselves live in :mod:`common.layouts`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from common import layouts, runtime
from common.clock import utcnow
from common.errors import InvalidInput
from common.models import ApiModel, RequestModel
from common.partition_meter import METER

# One partition of Table Storage takes ~2,000 entities/s; a lock + set writes 6 (docs/benchmark.md,
# "Scale-out under a storage budget"): one shard carries about this many items/s of one node or endpoint.
ITEMS_PER_SHARD_S = 250


class EraView(ApiModel):
    shards: int
    accounts: int
    since: datetime


class ChangeView(ApiModel):
    by: str | None
    reason: str | None
    from_shards: int
    to_shards: int
    from_accounts: int
    to_accounts: int
    active_from: datetime


class LayoutView(ApiModel):
    """One family's recorded layout."""

    family: str
    shards: int = Field(description="Partitions a node (state) or endpoint (hand-off) spreads over now.")
    accounts: int
    since: datetime
    previous: list[EraView] = Field(description="Earlier layouts still read (records never move).")
    pending: EraView | None = Field(description="A change written but not in force before its `since`.")
    refresh_seconds: float
    generation: int
    items_per_second_per_node: int = Field(
        description="About what one node or endpoint can take before storage throttles (shards x ~250)."
    )
    setting_disagrees: str | None = Field(
        default=None, description="This instance's setting differs from the recorded layout (followed)."
    )
    changes: list[ChangeView] = Field(default_factory=list, description="Audited changes, oldest first.")


class Layouts(ApiModel):
    layouts: list[LayoutView]
    hot_partitions: dict[str, float] = Field(
        default_factory=dict,
        description="Partitions this instance writes near one partition's budget: entity writes per second.",
    )


class LayoutChangeRequest(RequestModel):
    shards: int = Field(ge=1, le=layouts.MAX_SHARDS, description="The new shard count.")
    accounts: int | None = Field(
        default=None, ge=1, le=64, description="State only: storage accounts (default: the current count)."
    )
    reason: str | None = Field(default=None, max_length=1024)
    by: str | None = Field(default=None, max_length=256)


def view(recorded: layouts.Recorded, changes: list[dict[str, Any]]) -> LayoutView:
    raw = recorded.view()
    book = layouts.book()
    return LayoutView(
        family=recorded.family,
        shards=raw["shards"],
        accounts=raw["accounts"],
        since=datetime.fromisoformat(raw["since"]),
        previous=[EraView(**e) for e in raw["previous"]],
        pending=EraView(**raw["pending"]) if raw["pending"] else None,
        refresh_seconds=recorded.refresh_s,
        generation=recorded.generation,
        items_per_second_per_node=raw["shards"] * ITEMS_PER_SHARD_S,
        setting_disagrees=book.disagreements.get(recorded.family),
        changes=[
            ChangeView(
                by=c.get("Actor"),
                reason=c.get("Reason") or None,
                from_shards=c["FromShards"],
                to_shards=c["ToShards"],
                from_accounts=c["FromAccounts"],
                to_accounts=c["ToAccounts"],
                active_from=c["ActiveFrom"],
            )
            for c in changes
        ],
    )


def all_views() -> Layouts:
    tables = runtime.tables()
    recorded = layouts.read_all(tables)
    return Layouts(
        layouts=[view(recorded[f], layouts.audits(tables, f)) for f in layouts.FAMILIES if f in recorded],
        hot_partitions={pk: round(rate) for pk, rate in METER.near_budget().items()},
    )


def change(family: str, shards: int, *, accounts: int | None, actor: str, reason: str | None) -> LayoutView:
    """The one step both the endpoint and ``make reshard`` take."""
    tables = runtime.tables()
    if family not in layouts.FAMILIES:
        raise InvalidInput(f"family must be one of {', '.join(layouts.FAMILIES)}.", field="family")
    if accounts is not None and family != layouts.STATE:
        raise InvalidInput("accounts applies to the state layout only.", field="accounts")
    if accounts is None:
        current = layouts.read_all(tables).get(family)
        accounts = current.split(utcnow())[0].accounts if current is not None else 1
    changed = layouts.change(tables, family, shards, accounts=accounts, actor=actor, reason=reason)
    layouts.book().invalidate()
    return view(changed, layouts.audits(tables, family))
