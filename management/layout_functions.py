"""The layout blueprint: the recorded shard layouts, and changing one (operators only, audited).

``GET /api/v1/layout``: each family's recorded layout (common/layouts.py), a change not yet in force, the
changes made so far, and where this instance's settings disagree. ``POST /api/v1/layout/{family}``: the
one explicit step that changes a layout (``make reshard`` is the same step from a shell); it takes effect
once every instance's copy knows it (``activeFrom``). Behind operator auth (common/principal.py).
Registered in function_app.py beside the management blueprint.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import azure.functions as func
from pydantic import Field

from common import layouts, runtime
from common.clock import utcnow
from common.errors import InvalidInput
from common.http import operation, parse_body
from common.models import ApiModel, RequestModel
from common.partition_meter import METER
from common.principal import actor_of, allowed, denial
from management.api import AUTH, TAG, operator_read

bp = func.Blueprint()

_FAMILY = {
    "name": "family",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": list(layouts.FAMILIES)},
}
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


@operator_read(
    bp,
    "v1/layout",
    "The recorded shard layouts (state, hand-off), pending changes and their audit",
    Layouts,
)
def layout_show(req: func.HttpRequest) -> Layouts:
    return all_views()


@operation(
    bp,
    route="v1/layout/{family}",
    method="POST",
    summary="Change a family's shard layout (the earlier one is still read): one audited step",
    request=LayoutChangeRequest,
    response=LayoutView,
    responses={
        **AUTH,
        400: "Invalid input (the problem names the field)",
        409: "Nothing recorded yet, a change pending, nothing to change, or the layout changed meanwhile",
    },
    parameters=(_FAMILY,),
    anonymous=True,
    ok_status=202,
    tag=TAG,
)
def layout_change(req: func.HttpRequest) -> LayoutView:
    body = parse_body(req, LayoutChangeRequest)
    actor = actor_of(req, body.by)
    if not allowed(actor):
        raise denial(actor)
    family = req.route_params.get("family") or ""
    return change(family, body.shards, accounts=body.accounts, actor=actor.by, reason=body.reason)


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
