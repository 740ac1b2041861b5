"""The layout blueprint: the recorded shard layouts, and changing one (operators only, audited).

``GET /api/v1/layout``: each family's recorded layout (common/layouts.py), a change not yet in force, the
changes made so far, and where this instance's settings disagree. ``POST /api/v1/layout/{family}``: the
one explicit step that changes a layout (``make reshard`` is the same step from a shell); it takes effect
once every instance's copy knows it (``activeFrom``). Behind operator auth (common/principal.py).
Registered in function_app.py beside the management blueprint. Thin: the views and the change live in
:mod:`management.layout_changes`.
"""

from __future__ import annotations

import azure.functions as func

from common import layouts
from common.http import operation, parse_body
from common.principal import actor_of, allowed, denial
from management.api import AUTH, TAG, operator_read
from management.layout_changes import LayoutChangeRequest, Layouts, LayoutView, all_views, change

bp = func.Blueprint()

_FAMILY = {
    "name": "family",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": list(layouts.FAMILIES)},
}


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
