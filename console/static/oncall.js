// The console, part two: honest freshness and errors, the on-call views (find, failed, sessions, audits),
// bulk actions, poison handling and state browsing. Loaded after app.js (both deferred, in order): its
// functions are called only once the page has loaded, so it may use app.js's and app.js may use its.
"use strict";

// -- honest freshness, errors that say what failed, ways back --------------------------------

function parseBody(text, ok) {
  if (!text) return null;
  try { return JSON.parse(text); } catch (error) {
    if (ok) throw error;
    return { detail: text.slice(0, 200) };
  }
}

// Destructive actions start on Cancel; others on the first field, else Confirm.
function firstFocus(holder, ok, danger) {
  if (danger) return document.querySelector("#confirm button[value=cancel]");
  return holder.querySelector("input, textarea") || ok;
}

function wayBack(error) {
  if (error.status !== 404) return null;
  const route = parseRoute();
  const back = route.parts[0] === "event" && route.parts[1]
    ? h("a", { href: `#/endpoint/${segment(route.parts[1])}` }, `← Events of ${route.parts[1]}`)
    : h("a", { href: "#/" }, "← Endpoints");
  return h("p", {}, back);
}

// Settle unreachable (network) or unavailable (5xx): keep what was shown, say since when, retry.
let staleSince = null;
function unreachable(error) {
  return !(error instanceof ApiError) || error.status >= 500;
}

function keepStale(error, main) {
  if (!unreachable(error)) return false;
  if (!staleSince) staleSince = new Date();
  const banner = document.getElementById("stale");
  const shown = lastRoute === location.hash && main.querySelector("h1");
  banner.replaceChildren(h("strong", {}, "Settle unreachable"),
    ` since ${clock(staleSince)} (${error.message}), retrying every ${REFRESH_MS / 1000} s.`,
    shown ? " The page shows the last data received." : "");
  banner.hidden = false;
  return Boolean(shown);
}

function freshAgain() {
  staleSince = null;
  const banner = document.getElementById("stale");
  banner.hidden = true;
  banner.replaceChildren();
}

async function knownEndpoint(endpointId) {
  const data = await api("endpoints");
  return data.items.some((item) => item.endpointId === endpointId);
}

function unknownEndpointView(endpointId) {
  return h("section", { "aria-labelledby": "list-title" },
    h("p", {}, h("a", { href: "#/" }, "← Endpoints")),
    h("h1", { id: "list-title" }, "Unknown endpoint"),
    h("div", { class: "card error", role: "alert", "data-unknown-endpoint": endpointId },
      `No endpoint named "${endpointId}" has sent anything to the resolver. Check the name (it is case-sensitive).`));
}

// The message that failed the event: its ErrorText and ErrorType (the row's last message), else the reason.
function failureFacts(e) {
  const content = e.messageContent && typeof e.messageContent === "object" ? e.messageContent : {};
  const error = content.ErrorContent || null;
  const facts = [];
  if (error && (error.ErrorText || error.ErrorType)) {
    facts.push(["Error", h("span", { class: "error", "data-fact": "error-text" }, error.ErrorText || NULL_SHOWN)]);
    facts.push(["Error type", h("code", { "data-fact": "error-type" }, error.ErrorType || NULL_SHOWN)]);
  }
  const reason = e.reason || e.deadLetterErrorDescription || e.deadLetterReason;
  if (reason || !facts.length) facts.push(["Reason", reason || NULL_SHOWN]);
  if (e.deadLetterReason && e.deadLetterReason !== reason) facts.push(["Dead-letter reason", e.deadLetterReason]);
  return facts;
}

// An audit's data is JSON text whose values may be JSON text again (an EventJson inside a control
// message): shown indented, the inner JSON unpacked, folded under a summary of its fields.
function auditData(data) {
  if (!data) return "";
  const value = unpacked(data);
  const fields = value && typeof value === "object" && !Array.isArray(value) ? Object.keys(value) : [];
  const label = fields.length ? `${fields.length} field${fields.length === 1 ? "" : "s"}: ${fields.slice(0, 3).join(", ")}${fields.length > 3 ? ", …" : ""}` : "Data";
  return h("details", { class: "audit-data" }, h("summary", {}, label),
    h("pre", { tabindex: "0", "aria-label": "Audit data" }, typeof value === "string" ? value : JSON.stringify(value, null, 2)));
}

function unpacked(value) {
  if (typeof value === "string") {
    const text = value.trim();
    if (!(text.startsWith("{") || text.startsWith("["))) return value;
    try { return unpacked(JSON.parse(text)); } catch { return value; }
  }
  if (Array.isArray(value)) return value.map(unpacked);
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, unpacked(v)]));
  return value;
}

const CONTROL_REQUESTS = ["ResubmissionRequest", "SkipRequest", "HandoffCompletedRequest", "HandoffFailedRequest", "RetryRequest"];
function noActionNote(e, endpointId) {
  if (CONTROL_REQUESTS.includes(e.messageType)) {
    return h("p", { class: "muted", "data-waiting": e.messageType },
      `Nothing to do now: the ${e.messageType} was sent at ${when(e.updatedAt)}; this event waits for ${endpointId}'s answer (it appears here when the endpoint responds).`);
  }
  if (e.resolutionStatus === "Pending") {
    return h("p", { class: "muted", "data-waiting": "Pending" }, `Nothing to do: ${endpointId} has not answered yet.`);
  }
  return h("p", { class: "muted" }, "Nothing to do: this event's state allows no action.");
}

function failBody(text, type) {
  const body = { errorText: text };
  if (type.trim()) body.errorType = type.trim();
  return body;
}

function resubmitBody(edited, reason) {
  const body = edited ? { eventJson: edited } : {};
  if (reason.trim()) body.reason = reason.trim();
  return body;
}


// -- find, failed across endpoints, sessions, audits -----------------------------------------

const ONCALL_VIEWS = { find: findView, failed: failedView, session: sessionView, audits: auditsView };
const SELECTABLE = ["Failed", "DeadLettered", "Unsupported", "Deferred", "Completed"];

// What kind of id matched a find, as the operator reads it.
const ID_KINDS = {
  any: ["q", "Any id (event, session, message, external job)"],
  eventId: ["eventId", "Event id (or its first 3+ characters)"],
  sessionId: ["sessionId", "Session id"],
  messageId: ["messageId", "Message id"],
  externalJobId: ["externalJobId", "External job id"],
};
const KIND_NAMES = { eventId: "Event id", sessionId: "Session id", messageId: "Message id", externalJobId: "External job id" };

function summaryTable(rows, { matched } = {}) {
  return h("div", { class: "scroll" }, h("table", { class: "stack" },
    h("thead", {}, h("tr", {},
      [...(matched ? ["Matched"] : []), "Endpoint", "Event", "Status", "Type", "Session", "Changed", "Reason"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows)));
}

function summaryRows(items, { matched } = {}) {
  return items.map((e) => h("tr", { "data-event": e.eventId, "data-endpoint-row": e.endpointId, "data-matched": e.matchedBy || null },
      matched ? h("td", { "data-label": "Matched" }, (e.matches || []).flatMap((m, i) => [i ? ", " : "",
        h("span", { class: "match", "data-kind": m.kind }, `${KIND_NAMES[m.kind] || m.kind} `, h("code", {}, m.value))])) : null,
      h("td", { "data-label": "Endpoint" }, h("a", { href: `#/endpoint/${segment(e.endpointId)}` }, e.endpointId)),
      h("td", { "data-label": "Event" }, idLink(`#/event/${segment(e.endpointId)}/${segment(e.eventId)}`, e.eventId)),
      h("td", { "data-label": "Status" }, statusBadge(e.resolutionStatus, e.pendingSubStatus)),
      h("td", { "data-label": "Type" }, asSent(e.eventTypeId)),
      h("td", { "data-label": "Session" }, e.sessionId ? idLink(`#/session/${segment(e.sessionId)}`, e.sessionId) : asSent(e.sessionId)),
      h("td", { "data-label": "Changed" }, stamp(e.updatedAt)),
      h("td", { "data-label": "Reason" }, e.reason || "")));
}

// A list of hand-offs the API pages (find, a session, failed), with "More"; rows(items) may filter them.
function summaryList(name, list, path, { matched, heading, label, empty, rows }) {
  return pagedList(name, list, {
    path, pageSize: LIST_PAGE, heading, label, empty,
    rows: rows || ((items) => summaryRows(items, { matched })),
    table: (first) => summaryTable(first, { matched }),
  });
}

const LIST_PAGE = 50; // find and failed: the API's default page

async function findView(route) {
  const q = (route.params.get("q") || "").trim();
  const by = route.params.get("by") === "session" ? "sessionId" : route.params.get("by") === "event" ? "eventId" : route.params.get("by");
  const kind = ID_KINDS[by] ? by : "any";
  const form = h("form", { class: "card filters", role: "search", "aria-label": "Find", onsubmit: (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    location.hash = `#/find?${new URLSearchParams({ by: String(data.get("by")), q: String(data.get("q") || "").trim() })}`;
  } },
    h("label", {}, "Find by", h("select", { name: "by", id: "find-by" },
      Object.entries(ID_KINDS).map(([value, [, label]]) => h("option", { value, selected: kind === value }, label)))),
    h("label", {}, "Id", h("input", { name: "q", id: "find-q", value: q, required: true, minlength: kind === "eventId" ? 3 : 1,
      placeholder: "JOB-4711 / evt-42 / customer-10442", autocomplete: "off", spellcheck: "false" })),
    h("button", { type: "submit", id: "find-go" }, "Find"));
  let results = h("p", { class: "muted" }, "Looks in every endpoint: the job number the other team gave, a session, a message id, an event id or its first 3 characters, in any case.");
  if (q) {
    const path = `find?${ID_KINDS[kind][0]}=${encodeURIComponent(q)}`;
    const answer = await listPages("find", path, LIST_PAGE, 200);
    const summary = h("p", { id: "find-summary", role: "status" });
    // What matched, over every row loaded so far ("More" adds rows, and perhaps kinds).
    const says = (n) => {
      const kinds = [...new Set(answer.items.map((e) => KIND_NAMES[e.matchedBy] || e.matchedBy))];
      return `${n} hand-off${n === "1" ? "" : "s"} by ${kinds.join(", ").toLowerCase()}${answer.continuationToken ? `; ${answer.items.length} shown, more match` : ""}.`;
    };
    results = answer.items.length || answer.continuationToken ? [summary,
      summaryList("find", answer, path, { matched: true, heading: summary, label: says })]
      : h("p", { id: "find-none", role: "status" }, `No hand-off on any endpoint has ${kind === "any" ? "an id" : KIND_NAMES[kind].toLowerCase()} "${q}"${kind === "any" || kind === "eventId" ? (q.length >= 3 ? " (or an event id starting with it)" : " (an event id prefix needs 3 characters)") : ""}.`);
    const only = answer.items.length === 1 ? answer.items[0] : null;
    if (only && route.params.get("go") === "1") {
      location.hash = `#/event/${segment(only.endpointId)}/${segment(only.eventId)}`;
    }
  }
  return h("section", { "aria-labelledby": "find-title" },
    h("h1", { id: "find-title" }, "Find"), form, results);
}

async function sessionView(route) {
  const sessionId = route.parts[1] || "";
  const path = `find?sessionId=${encodeURIComponent(sessionId)}`;
  const answer = await listPages("session", path, LIST_PAGE, 200);
  const open = answer.items.filter((e) => !["Completed", "Skipped"].includes(e.resolutionStatus));
  const blocked = answer.items.find((e) => ["Failed", "DeadLettered"].includes(e.resolutionStatus));
  const more = answer.continuationToken ? " (of the events loaded; more follow)" : "";
  return h("section", { "aria-labelledby": "session-title" },
    h("p", {}, h("a", { href: "#/find?by=sessionId" }, "← Find")),
    h("h1", { id: "session-title" }, `Session ${sessionId}`),
    h("p", { class: blocked ? "error" : "muted", "data-session-state": blocked ? "blocked" : "open" },
      blocked ? `Blocked: ${blocked.eventId} on ${blocked.endpointId} is ${blocked.resolutionStatus}; ${open.length} event(s) of this session are not done${more}.`
        : `${howMany(answer)} event(s), ${open.length} not done; nothing failed${more}.`),
    summaryList("session", answer, path, { empty: h("p", {}, "No event of this session on any endpoint.") }));
}

async function failedView(route) {
  const answer = await listPages("failed", "failed", LIST_PAGE, 200);
  const filter = route.params.get("errorText") || "";
  const shown = filterByError(answer.items, filter);
  const count = h("h2", { id: "failed-count" });
  // The error-text filter narrows the rows loaded: a page that adds none still offers the next.
  const list = summaryList("failed", answer, "failed", { heading: count, label: (n) => `${n} failed event${n === "1" ? "" : "s"}`,
    empty: h("p", {}, "Nothing failed."), rows: (items) => summaryRows(filterByError(items, filter)) });
  return h("section", { "aria-labelledby": "failed-title" },
    h("h1", { id: "failed-title" }, "Failed across endpoints"),
    h("p", { class: "muted" }, `Failed and dead-lettered events of every endpoint, newest change first, ${LIST_PAGE} at a time.`),
    errorFilterForm("#/failed", new URLSearchParams(), filter, shown.length, answer.items.length),
    count,
    !shown.length && !answer.continuationToken ? h("p", {}, filter ? "No failed event's error matches." : "Nothing failed.") : list);
}

function filterByError(items, text) {
  const needle = text.trim().toLowerCase();
  return needle ? items.filter((e) => (e.reason || "").toLowerCase().includes(needle)) : items;
}

function errorFilterForm(base, params, value, shown, total) {
  return h("form", { class: "card filters", "aria-label": "Error text filter", onsubmit: (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams(params);
    const text = String(new FormData(ev.target).get("errorText") || "").trim();
    if (text) next.set("errorText", text); else next.delete("errorText");
    next.delete("continuationToken");
    location.hash = `${base}?${next}`;
  } },
    h("label", {}, "Error text contains", h("input", { name: "errorText", id: "error-text", value, placeholder: "timeout" })),
    h("button", { type: "submit", class: "secondary" }, "Filter"),
    value ? h("span", { class: "muted", id: "error-count", role: "status" }, `${shown} of ${total} loaded events match`) : null);
}

async function auditsView(route) {
  const p = route.params;
  const query = new URLSearchParams();
  for (const name of ["endpointId", "auditType", "by", "from", "to", "continuationToken"]) if (p.get(name)) query.set(name, p.get(name));
  query.set("pageSize", "50");
  const page = await api(`audits?${query}`);
  const form = h("form", { class: "card filters", "aria-label": "Audit filters", onsubmit: (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const [k, v] of new FormData(ev.target).entries()) {
      if (!v) continue;
      next.set(k, (k === "from" || k === "to") ? new Date(v + "Z").toISOString() : String(v));
    }
    location.hash = `#/audits?${next}`;
  } },
    h("label", {}, "Endpoint", h("input", { name: "endpointId", value: p.get("endpointId") || "" })),
    h("label", {}, "Type", h("select", { name: "auditType", id: "audit-type" }, h("option", { value: "" }, "Any"),
      ["Resubmit", "ResubmitWithChanges", "Skip", "CompleteHandoff", "FailHandoff", "ResolveSettlement", "ReplayPoison", "ReplayPoisonWithChanges", "DismissPoison"]
        .map((t) => h("option", { value: t, selected: p.get("auditType") === t }, t)))),
    h("label", {}, "Operator", h("input", { name: "by", value: p.get("by") || "" })),
    h("label", {}, "From (UTC)", h("input", { name: "from", type: "datetime-local", value: localValue(p.get("from")) })),
    h("label", {}, "to (UTC)", h("input", { name: "to", type: "datetime-local", value: localValue(p.get("to")) })),
    h("button", { type: "submit" }, "Search"));
  const rows = page.items.map((a) => h("tr", { "data-audit": a.auditType },
    h("td", { "data-label": "When" }, stamp(a.auditTimestamp)),
    h("td", { "data-label": "Type" }, a.auditType + (a.accessDenied ? " (denied)" : "")),
    h("td", { "data-label": "By" }, a.auditorName),
    h("td", { "data-label": "Endpoint" }, a.endpointId ? h("a", { href: `#/endpoint/${segment(a.endpointId)}` }, a.endpointId) : NULL_SHOWN),
    h("td", { "data-label": "Event" }, a.eventId ? idLink(`#/event/${segment(a.endpointId)}/${segment(a.eventId)}`, a.eventId) : NULL_SHOWN),
    h("td", { "data-label": "Comment" }, a.comment || ""),
    h("td", { "data-label": "Data" }, auditData(a.data))));
  const next = new URLSearchParams(p);
  if (page.continuationToken) next.set("continuationToken", page.continuationToken);
  return h("section", { "aria-labelledby": "audits-title" },
    h("h1", { id: "audits-title" }, "Audits"),
    h("p", { class: "muted" }, "Operator actions, oldest first (the last 24 hours unless a time is given)."),
    form,
    page.items.length ? h("div", { class: "scroll" }, h("table", { class: "stack", "aria-label": "Audits" },
      h("thead", {}, h("tr", {}, ["When", "Type", "By", "Endpoint", "Event", "Comment", "Data"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows))) : h("p", {}, "No audit matches."),
    page.continuationToken ? h("div", { class: "pager" }, h("a", { href: `#/audits?${next}` }, "Next page")) : null);
}

// -- bulk actions and the error-text filter on an endpoint's listing -----------------------------

let bulkBusy = false;
const bulkSelection = new Map(); // endpointId -> Map of event id -> the message the operator saw (its last)
let bulkReport = null; // { endpointId, ... } of the last bulk run, shown until the route changes

function selectionOf(endpointId) {
  if (!bulkSelection.has(endpointId)) bulkSelection.set(endpointId, new Map());
  return bulkSelection.get(endpointId);
}

async function listingExtras(view, endpointId, params) {
  if (!view.querySelector("form.filters")) return; // a problem or an unknown endpoint: nothing to add
  const table = view.querySelector("table.stack");
  const selected = selectionOf(endpointId);
  const filter = params.get("errorText") || "";
  if (table) {
    const head = table.querySelector("thead tr");
    head.prepend(h("th", {}, h("span", { class: "sr" }, "Select")));
    let total = 0;
    let shown = 0;
    for (const row of table.querySelectorAll("tbody tr[data-event]")) {
      total += 1;
      const id = row.dataset.event;
      const status = row.querySelector(".badge").className.replace("badge ", "");
      const reason = row.querySelector('td[data-label="Reason"]').textContent;
      if (filter && !reason.toLowerCase().includes(filter.toLowerCase())) { row.remove(); continue; }
      shown += 1;
      const box = h("input", { type: "checkbox", "aria-label": `Select ${id}`, "data-select": id, checked: selected.has(id),
        disabled: !SELECTABLE.includes(status), onchange: (ev) => {
          if (ev.target.checked) selected.set(id, row.dataset.message); else selected.delete(id);
          updateBulkBar(view, endpointId);
        } });
      row.prepend(h("td", { "data-label": "Select" }, box));
    }
    view.querySelector("form.filters").after(errorFilterForm(`#/endpoint/${segment(endpointId)}`, params, filter, shown, total));
    if (!shown) table.closest(".scroll").replaceWith(h("p", { id: "error-none" }, "No event on this page matches the error text."));
  } else {
    view.querySelector("form.filters").after(errorFilterForm(`#/endpoint/${segment(endpointId)}`, params, filter, 0, 0));
  }
  const bar = h("div", { class: "card bulk", id: "bulk", "aria-label": "Bulk actions" });
  view.querySelector("h1").after(bar);
  updateBulkBar(view, endpointId);
}

function updateBulkBar(view, endpointId) {
  const bar = view.querySelector("#bulk");
  if (!bar) return;
  const selected = selectionOf(endpointId);
  const params = parseRoute().params;
  const boxes = [...view.querySelectorAll("input[data-select]:not(:disabled)")];
  bar.replaceChildren(
    h("h2", {}, "Act in bulk"),
    h("p", { id: "bulk-count", role: "status" }, `${selected.size} selected`),
    h("div", { class: "buttons" },
      h("button", { type: "button", class: "secondary", id: "bulk-page", disabled: !boxes.length, onclick: () => {
        for (const box of boxes) { box.checked = true; selected.set(box.dataset.select, box.closest("tr").dataset.message); }
        updateBulkBar(view, endpointId);
      } }, "Select this page"),
      h("button", { type: "button", class: "secondary", id: "bulk-matching", onclick: () => selectMatching(view, endpointId, params) },
        "Select all matching this filter"),
      h("button", { type: "button", class: "secondary", id: "bulk-clear", disabled: !selected.size, onclick: () => {
        selected.clear();
        for (const box of boxes) box.checked = false;
        updateBulkBar(view, endpointId);
      } }, "Clear"),
      h("button", { type: "button", id: "bulk-resubmit", disabled: !selected.size || bulkBusy, onclick: () => runBulk(view, endpointId, "resubmit") }, "Resubmit selected"),
      h("button", { type: "button", class: "danger", id: "bulk-skip", disabled: !selected.size || bulkBusy, onclick: () => runBulk(view, endpointId, "skip") }, "Skip selected")),
    // replaceChildren is the DOM's, not h(): a null here would be shown as the text "null".
    bulkReport && bulkReport.endpointId === endpointId ? bulkReportView(bulkReport) : "");
}

// Every page of the listing with the same filters (the API's own paging), rows that allow an action.
async function selectMatching(view, endpointId, params) {
  const selected = selectionOf(endpointId);
  const query = new URLSearchParams();
  for (const name of ["status", "eventTypeId", "from", "to"]) if (params.get(name)) query.set(name, params.get(name));
  query.set("pageSize", "200");
  const filter = (params.get("errorText") || "").toLowerCase();
  let token = null;
  let pages = 0;
  do {
    if (token) query.set("continuationToken", token);
    const page = await api(`endpoints/events?${idQuery({ endpointId })}&${query}`);
    for (const e of page.items) {
      if (!SELECTABLE.includes(e.resolutionStatus)) continue;
      if (filter && !(e.reason || "").toLowerCase().includes(filter)) continue;
      selected.set(e.eventId, e.lastMessageId || "");
    }
    token = page.continuationToken;
    pages += 1;
  } while (token && pages < 50);
  for (const box of view.querySelectorAll("input[data-select]")) box.checked = selected.has(box.dataset.select);
  updateBulkBar(view, endpointId);
}

const BULK_CHUNK = 10;

async function runBulk(view, endpointId, action) {
  if (bulkBusy) return; // one bulk action at a time (its buttons are disabled while it runs)
  const selected = selectionOf(endpointId);
  const ids = [...selected.keys()];
  const reason = h("input", { id: "bulk-reason" });
  const body = [h("p", {}, `${ids.length} event(s) of ${endpointId}: one ${action === "skip" ? "SkipRequest" : "ResubmissionRequest"} and one audit each. Events whose state does not allow it are refused one by one.`),
    h("label", {}, "Reason (optional, kept in each audit)", reason)];
  if (!(await confirmDialog(`${action === "skip" ? "Skip" : "Resubmit"} ${ids.length} event(s)?`, body, action === "skip" ? "Skip all" : "Resubmit all", action === "skip"))) return;
  bulkBusy = true;
  for (const button of view.querySelectorAll("#bulk-resubmit, #bulk-skip")) button.disabled = true;
  const report = { endpointId, action, total: ids.length, done: 0, accepted: 0, refused: [] };
  bulkReport = report;
  const bar = view.querySelector("#bulk");
  const progress = h("progress", { id: "bulk-progress", max: ids.length, value: 0, "aria-label": "Bulk progress" });
  const text = h("p", { id: "bulk-progress-text", role: "status" }, `0 / ${ids.length}`);
  bar.append(progress, text);
  try {
    for (let i = 0; i < ids.length; i += BULK_CHUNK) {
      const chunk = ids.slice(i, i + BULK_CHUNK);
      // Each event's action addresses the message the operator saw: a retried chunk is answered from its claims.
      const messageIds = Object.fromEntries(chunk.filter((id) => selected.get(id)).map((id) => [id, selected.get(id)]));
      const payload = { action, eventIds: chunk, messageIds };
      if (reason.value.trim()) payload.reason = reason.value.trim();
      try {
        const answer = await api(`endpoints/bulk?${idQuery({ endpointId })}`, { method: "POST", body: payload });
        for (const item of answer.items) {
          if (item.status === 202) { report.accepted += 1; selected.delete(item.eventId); }
          else report.refused.push({ eventId: item.eventId, status: item.status, detail: item.detail || item.problem });
        }
      } catch (error) {
        for (const id of chunk) report.refused.push({ eventId: id, status: error.status || 0, detail: `${error.message} (retry)` });
      }
      report.done += chunk.length;
      progress.value = report.done;
      text.textContent = `${report.done} / ${ids.length}: ${report.accepted} accepted, ${report.refused.length} refused`;
    }
  } finally {
    bulkBusy = false;
  }
  toast(`Bulk ${action}: ${report.accepted} accepted, ${report.refused.length} refused`);
  render();
}

function bulkReportView(report) {
  return h("div", { id: "bulk-report" },
    h("p", {}, `Last bulk ${report.action}: ${report.accepted} of ${report.total} accepted${report.refused.length ? `, ${report.refused.length} refused (still selected; safe to retry):` : "."}`),
    report.refused.length ? h("ul", {}, report.refused.map((r) => h("li", { "data-refused": r.eventId },
      h("a", { href: `#/event/${segment(report.endpointId)}/${segment(r.eventId)}` }, r.eventId), ` — ${r.status}: ${r.detail || ""}`))) : null);
}

// -- poison dismissed or edited and replayed --------------------------------------------------

let showDismissed = false;
let lastPoisonPage = null;

function poisonExtras(view) {
  if (!view.querySelector("#poison-title")) return;
  const rows = view.querySelectorAll("tr[data-poison]");
  const items = lastPoisonPage ? lastPoisonPage.items : [];
  const table = view.querySelector("table.stack");
  if (table) {
    table.before(h("label", { class: "inline" }, h("input", { type: "checkbox", id: "show-dismissed", checked: showDismissed,
      onchange: (ev) => { showDismissed = ev.target.checked; render(); } }), "Show dismissed"));
  }
  rows.forEach((row, index) => {
    const p = items[index];
    if (!p) return;
    const cell = row.lastElementChild;
    if (p.dismissedAt) {
      row.classList.add("dismissed");
      row.querySelector('td[data-label="Replay"]').textContent = `Dismissed by ${p.dismissedBy} at ${when(p.dismissedAt)}: ${p.dismissReason}`;
      cell.replaceChildren();
      if (!showDismissed) row.hidden = true;
      return;
    }
    if (["applied", "refused", "duplicate"].includes(p.replayOutcome)) return;
    cell.append(h("div", { class: "row-actions" },
      h("button", { type: "button", class: "secondary", "data-edit-replay": p.id, onclick: () => editReplay(p) }, "Edit & replay"),
      h("button", { type: "button", class: "danger", "data-dismiss": p.id, onclick: () => dismissPoison(p) }, "Dismiss")));
  });
}

async function dismissPoison(p) {
  const reason = h("input", { id: "dismiss-reason", required: true });
  if (!(await confirmDialog("Dismiss this poison message?", [h("p", {}, "It is archived: no longer counted, kept with who and why. It cannot be replayed afterwards."),
    h("label", {}, "Why no fix will ever project it", reason)], "Dismiss", true))) return;
  if (!reason.value.trim()) return toast("A reason is needed to dismiss poison.");
  try {
    await api(`poison/dismiss?${idQuery({ day: p.day, id: p.id })}`, { method: "POST", body: { reason: reason.value.trim() } });
    toast(`Dismissed ${p.messageId || p.id}`);
  } catch (error) { toast(`Refused: ${error.message}`); }
  render();
}

async function editReplay(p) {
  const props = h("textarea", { id: "edit-properties", class: "short", rows: 8 }, pretty(p.applicationProperties));
  const body = h("textarea", { id: "edit-body", rows: 8 }, p.messageContent !== null ? pretty(p.messageContent) : "");
  if (!(await confirmDialog("Edit and replay through the resolver?", [
    h("label", {}, "Application properties (JSON)", props), h("label", {}, "Body", body)], "Replay edited"))) return;
  let properties;
  try { properties = JSON.parse(props.value); } catch { return toast("The application properties are not valid JSON."); }
  try {
    const answer = await api(`poison/replay?${idQuery({ day: p.day, id: p.id })}`, { method: "POST", body: { applicationProperties: properties, messageContent: body.value } });
    toast(`Replay: ${answer.outcome}${answer.detail ? " — " + answer.detail : ""}`);
  } catch (error) { toast(`Refused: ${error.message}`); }
  render();
}

// -- state browsing (records of a node by status, scopes by name, error and note columns) -------

let stateQuery = null;

function stateExtras(view) {
  if (!view.querySelector("#state-title")) return;
  const browse = h("form", { class: "card filters", id: "browse", "aria-label": "Browse records", onsubmit: async (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    const body = { tenantId: Number(data.get("browseTenantId")), pageSize: 50 };
    if (data.get("browseScope")) body.scope = String(data.get("browseScope"));
    if (data.get("browseEntityId")) body.entityId = Number(data.get("browseEntityId"));
    if (data.get("browseStatus")) body.status = String(data.get("browseStatus"));
    try { stateQuery = { body, page: await api("records/query", { method: "POST", body }) }; } catch (error) { stateQuery = { body, error }; }
    render();
  } },
    h("label", {}, "Tenant id", h("input", { name: "browseTenantId", type: "number", required: true, value: stateQuery ? stateQuery.body.tenantId : "" })),
    h("label", {}, "Scope", h("select", { name: "browseScope", id: "browse-scope" }, h("option", { value: "" }, "Any"),
      SCOPES.map((name) => h("option", { value: name, selected: stateQuery && stateQuery.body.scope === name }, name)))),
    h("label", {}, "Entity (node) id", h("input", { name: "browseEntityId", type: "number", value: stateQuery && stateQuery.body.entityId !== undefined ? stateQuery.body.entityId : "" })),
    h("label", {}, "Status", h("select", { name: "browseStatus", id: "browse-status" }, h("option", { value: "" }, "Any"),
      ["Processing", "Processed", "Failed", "Skipped", "Expired"].map((name) => h("option", { value: name, selected: stateQuery && stateQuery.body.status === name }, name)))),
    h("button", { type: "submit", id: "browse-go" }, "Browse"));
  const results = stateQuery ? (stateQuery.error ? problemView(stateQuery.error) : h("div", { id: "browse-results" },
    h("p", { class: "muted" }, `${stateQuery.page.items.length} record(s)${stateQuery.page.continuationToken ? " (first page)" : ""}`),
    recordTable(stateQuery.page.items))) : null;
  const title = view.querySelector("h1");
  title.after(h("h2", {}, "Browse a node's records"), browse);
  if (results) browse.after(results);
}

async function lookUpRecord(r) {
  const key = { tenantId: r.tenantId, scopeId: r.scopeId, entityId: r.entityId, itemEntityKey: r.itemEntityKey, itemKey: r.itemKey };
  if (r.entityExecutionId !== null && r.entityExecutionId !== undefined) key.entityExecutionId = r.entityExecutionId;
  if (r.sourceAppId !== null && r.sourceAppId !== undefined) key.sourceAppId = r.sourceAppId;
  if (r.subItemEntityKey) key.subItemEntityKey = r.subItemEntityKey;
  if (r.subItemKey) key.subItemKey = r.subItemKey;
  const entered = { text: JSON.stringify(key, null, 2), scope: SCOPES[key.scopeId - 1] || "" };
  try { lookupResult = { ...entered, ...(await api("records/lookup", { method: "POST", body: { key, pageSize: 50 } })), key }; } catch (error) { lookupResult = { ...entered, error }; }
  await render();
  const record = document.getElementById("record");
  if (record) record.scrollIntoView();
}
