"""The operator routes of the app, as the route and auth tests know them."""

from __future__ import annotations

OPERATOR_ROUTES = {
    "console",
    "console_asset",
    "endpoints_overview",
    "endpoint_events",
    "endpoint_event",
    "event_resubmit",
    "event_skip",
    "event_complete",
    "event_fail",
    "event_settlement_resolve",
    "endpoint_unconfirmed",
    "endpoint_overdue",
    "poison_list",
    "poison_replay",
    "records_lookup",
    "records_stuck",
    # the operator's find, bulk actions, dismiss, audit search and records query
    "find_events",
    "failed_events",
    "endpoint_bulk",
    "poison_dismiss",
    "audits_search",
    "records_query",
    "layout_show",
    "layout_change",
}
