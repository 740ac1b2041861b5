// Settle console: one page, hash routes, the management API under /api/v1/, polling refresh.
// DOM is built with createElement/textContent only (never innerHTML), so nothing from the data can run.
"use strict";

const API = location.pathname.replace(/\/console\/?$/, "/") + "v1/";
const REFRESH_MS = 5000;
const BUCKETS = [
  ["Pending", "pending", "Pending"],
  ["PendingHandoff", "pendingHandoff", "Pending + Handoff"],
  ["Deferred", "deferred", "Deferred"],
  ["Failed", "failed", "Failed"],
  ["DeadLettered", "deadLettered", "Dead-lettered"],
  ["Unsupported", "unsupported", "Unsupported"],
];
const STATUSES = ["Pending", "PendingHandoff", "Deferred", "Failed", "DeadLettered", "Unsupported", "Completed", "Skipped"];

let timer = null;
let lastRoute = "";

// -- small helpers ------------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Every time on the page is UTC, as the API answers it, and says so (one zone for rows and "Updated").
const ZONE = "UTC";

function when(iso) {
  if (!iso) return NULL_SHOWN;
  const t = new Date(iso);
  return `${t.toISOString().replace("T", " ").replace(/\.\d+Z$/, "")} ${ZONE}`;
}

function clock(date) {
  return `${date.toISOString().slice(11, 19)} ${ZONE}`;
}

// null (never sent) and "" (sent empty) are different answers: an em dash for the first, "" for the second.
const NULL_SHOWN = "—";

function asSent(value) {
  if (value === null || value === undefined) return NULL_SHOWN;
  if (value === "") return h("code", { class: "empty", title: "sent empty", "data-empty": "" }, '""');
  return value;
}

function age(iso) {
  if (!iso) return NULL_SHOWN;
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

function pretty(text) {
  if (text === null || text === undefined) return "";
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
}

function toast(text) {
  const el = document.getElementById("toast");
  el.textContent = text;
  clearTimeout(toast.t);
  toast.t = setTimeout(() => { el.textContent = ""; }, 6000);
}

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

async function api(path, options = {}) {
  const init = { method: options.method || "GET", headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (options.body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  const response = await fetch(API + path, init);
  const text = await response.text();
  const data = parseBody(text, response.ok);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

function segment(value) { return encodeURIComponent(value); }

// Ids travel in the query string of the API: the deployed host decodes %2F in a path before it matches a
// route, so an id holding "/" in a path segment reaches no route there. encodeURIComponent writes "+" as
// %2B (a query string reads a bare "+" as a space).
function idQuery(values) { return Object.entries(values).map(([k, v]) => `${k}=${encodeURIComponent(v)}`).join("&"); }

function badge(bucket, count, href) {
  const cls = `badge ${bucket}${count ? "" : " zero"}`;
  const label = `${count} ${bucket === "PendingHandoff" ? "Pending + Handoff" : bucket}`;
  return href
    ? h("a", { class: cls, href, "aria-label": label, "data-bucket": bucket }, String(count))
    : h("span", { class: cls, "aria-label": label, "data-bucket": bucket }, String(count));
}

function statusBadge(status, subStatus) {
  if (status === "Pending" && subStatus === "Handoff") {
    return h("span", { class: "badge PendingHandoff" }, "Pending + Handoff");
  }
  return h("span", { class: `badge ${status}` }, status);
}

function problemView(error) {
  if (error.status === 401) {
    const login = "/.auth/login/aad?post_login_redirect_uri=" + encodeURIComponent(location.pathname + location.hash);
    return h("div", { class: "card" }, h("h1", {}, "Sign in"),
      h("p", {}, "The management API needs a signed-in operator. "), h("p", { class: "muted" }, error.message),
      h("a", { href: login }, "Sign in with Entra ID"));
  }
  return h("div", { class: "card error", role: "alert" }, h("strong", {}, `${error.status || ""} `), error.message, wayBack(error));
}

function confirmDialog(title, body, okLabel, danger) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  const holder = document.getElementById("confirm-body");
  holder.replaceChildren(...(Array.isArray(body) ? body : [body]));
  const ok = document.getElementById("confirm-ok");
  ok.textContent = okLabel;
  ok.className = danger ? "danger" : "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    firstFocus(holder, ok, danger).focus();
  });
}

// -- routing -----------------------------------------------------------------------------------------

function parseRoute() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query || "") };
}

function editing() {
  const active = document.activeElement;
  return document.getElementById("confirm").open || bulkBusy ||
    (active && ["INPUT", "TEXTAREA", "SELECT"].includes(active.tagName));
}

async function render({ quiet } = {}) {
  const main = document.getElementById("main");
  const route = parseRoute();
  const section = route.parts[0] || "endpoints";
  for (const link of document.querySelectorAll("[data-nav]")) {
    const current = link.dataset.nav === (section === "endpoint" || section === "event" ? "endpoints" : section);
    if (current) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  let view;
  try {
    if (section === "endpoint") view = await endpointView(route.parts[1], route.params);
    else if (section === "event") view = await eventView(route.parts[1], route.parts[2]);
    else if (section === "poison") view = await poisonView(route.params);
    else if (section === "stuck") view = await stuckView(route.parts[1]);
    else if (section === "state") view = await stateView();
    else if (ONCALL_VIEWS[section]) view = await ONCALL_VIEWS[section](route);
    else view = await endpointsView();
    if (section === "endpoint") await listingExtras(view, route.parts[1], route.params);
    if (section === "poison") poisonExtras(view);
    if (section === "state") stateExtras(view);
  } catch (error) {
    if (keepStale(error, main)) return;
    view = problemView(error);
  }
  freshAgain();
  if (quiet && editing()) return; // never replace what the operator is typing into
  main.replaceChildren(view);
  document.getElementById("refresh").textContent = `Updated ${clock(new Date())} · every ${REFRESH_MS / 1000} s`;
  if (!quiet && location.hash !== lastRoute) main.focus();
  lastRoute = location.hash;
}

function schedule() {
  clearInterval(timer);
  timer = setInterval(() => { if (!document.hidden) render({ quiet: true }); }, REFRESH_MS);
}

// -- endpoints overview ---------------------------------------------------------------------------------

async function endpointsView() {
  const data = await api("endpoints");
  const rows = data.items.map((item) => {
    const base = `#/endpoint/${segment(item.endpointId)}`;
    return h("tr", { "data-endpoint": item.endpointId },
      h("td", { "data-label": "Endpoint" }, h("a", { href: base }, item.endpointId)),
      BUCKETS.map(([bucket, key, label]) =>
        h("td", { class: "num", "data-label": label }, badge(bucket, item.counts[key], `${base}?status=${bucket}`))),
      h("td", { class: "num", "data-label": "Poison" }, badge("Poison", item.poison, poisonHref(item.oldestPoisonDay))),
      stuckBadges(item),
      h("td", { "data-label": "Oldest pending" }, age(item.oldestPendingAt)),
      h("td", { "data-label": "Oldest failed" }, age(item.oldestFailedAt)));
  });
  return h("section", { "aria-labelledby": "endpoints-title" },
    h("h1", { id: "endpoints-title" }, "Endpoints"),
    h("p", { class: "muted" }, "Everything that needs a human: counts are exact; Pending includes Pending + Handoff."),
    data.items.length ? h("div", { class: "scroll" }, h("table", { class: "stack" },
      h("thead", {}, h("tr", {}, h("th", {}, "Endpoint"), BUCKETS.map(([, , label]) => h("th", { class: "num" }, label)),
        h("th", { class: "num" }, "Poison"), STUCK_COLUMNS.map((label) => h("th", { class: "num" }, label)),
        h("th", {}, "Oldest pending"), h("th", {}, "Oldest failed"))),
      h("tbody", {}, rows))) : h("p", {}, "No endpoint has sent anything to the resolver yet."),
    data.unattributedPoison ? h("p", {}, `Poison naming no endpoint: `, h("a", { href: poisonHref(data.unattributedOldestPoisonDay) }, String(data.unattributedPoison))) : null);
}

// The poison page lists one UTC day: a badge opens the day of its oldest unresolved poison.
function poisonHref(day) {
  return day ? `#/poison?day=${day}` : "#/poison";
}

// -- event list of one endpoint -----------------------------------------------------------------------

async function endpointView(endpointId, params) {
  const query = new URLSearchParams();
  for (const name of ["status", "eventTypeId", "from", "to", "continuationToken"]) {
    if (params.get(name)) query.set(name, params.get(name));
  }
  query.set("pageSize", "25");
  const [page, known] = await Promise.all([api(`endpoints/events?${idQuery({ endpointId })}&${query}`), knownEndpoint(endpointId)]);
  if (!known && !page.items.length) return unknownEndpointView(endpointId);
  const filters = h("form", { class: "filters card", "aria-label": "Filters", onsubmit: (e) => {
    e.preventDefault();
    const form = new FormData(e.target);
    const next = new URLSearchParams();
    for (const [k, v] of form.entries()) {
      if (!v) continue;
      next.set(k, (k === "from" || k === "to") ? new Date(v + "Z").toISOString() : v);
    }
    location.hash = `#/endpoint/${segment(endpointId)}?${next}`;
  } },
    h("label", {}, "Status", h("select", { name: "status" }, h("option", { value: "" }, "Any"),
      STATUSES.map((s) => h("option", { value: s, selected: params.get("status") === s }, s === "PendingHandoff" ? "Pending + Handoff" : s)))),
    h("label", {}, "Event type", h("input", { name: "eventTypeId", value: params.get("eventTypeId") || "", placeholder: "InvoiceCreated" })),
    h("label", {}, "Changed from (UTC)", h("input", { name: "from", type: "datetime-local", value: localValue(params.get("from")) })),
    h("label", {}, "to (UTC)", h("input", { name: "to", type: "datetime-local", value: localValue(params.get("to")) })),
    h("button", { type: "submit" }, "Apply"));
  const rows = page.items.map((e) => h("tr", { "data-event": e.eventId, "data-message": e.lastMessageId || "" },
    h("td", { "data-label": "Event" }, h("a", { href: `#/event/${segment(endpointId)}/${segment(e.eventId)}` }, e.eventId)),
    h("td", { "data-label": "Status" }, statusBadge(e.resolutionStatus, e.pendingSubStatus)),
    h("td", { "data-label": "Type" }, asSent(e.eventTypeId)),
    h("td", { "data-label": "Last message" }, e.messageType),
    h("td", { "data-label": "Changed" }, when(e.updatedAt)),
    h("td", { "data-label": "Reason" }, e.reason || "")));
  const pager = h("div", { class: "pager" },
    params.get("continuationToken") ? h("a", { href: withParam(params, endpointId, null) }, "First page") : null,
    page.continuationToken ? h("a", { href: withParam(params, endpointId, page.continuationToken) }, "Next page") : null);
  return h("section", { "aria-labelledby": "list-title" },
    h("p", {}, h("a", { href: "#/" }, "← Endpoints")),
    h("h1", { id: "list-title" }, `Events of ${endpointId}`),
    filters,
    page.items.length ? h("div", { class: "scroll" }, h("table", { class: "stack" },
      h("thead", {}, h("tr", {}, ["Event", "Status", "Type", "Last message", "Changed", "Reason"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows))) : h("p", {}, "No event matches."),
    pager);
}

function localValue(iso) {
  return iso ? new Date(iso).toISOString().slice(0, 16) : "";
}

function withParam(params, endpointId, token) {
  const next = new URLSearchParams(params);
  if (token) next.set("continuationToken", token); else next.delete("continuationToken");
  return `#/endpoint/${segment(endpointId)}?${next}`;
}

// -- one event --------------------------------------------------------------------------------------

async function eventView(endpointId, eventId) {
  const e = await api(`endpoints/event?${idQuery({ endpointId, eventId })}`);
  const facts = h("dl", { class: "facts" }, [
    ["Status", statusBadge(e.resolutionStatus, e.pendingSubStatus)],
    ["Event type", asSent(e.eventTypeId)], ["Session", asSent(e.sessionId)], ["Correlation", asSent(e.correlationId)],
    ["Last message", `${e.messageType} ${e.lastMessageId || ""}`], ["From → To", `${e.from || "?"} → ${e.to || "?"}`],
    ["Updated", when(e.updatedAt)], ...failureFacts(e),
    ["Processing time", e.processingTimeMs === null ? NULL_SHOWN : `${e.processingTimeMs} ms`],
  ].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, asSent(v))]));
  const handoff = e.pendingSubStatus === "Handoff" ? h("div", { class: "card handoff", "aria-label": "Handoff details" },
    h("h2", {}, "Awaiting external work"),
    h("dl", { class: "facts" }, h("dt", {}, "Reason"), h("dd", { "data-fact": "handoff-reason" }, asSent(e.handoffReason)),
      h("dt", {}, "External job"), h("dd", { "data-fact": "external-job" }, asSent(e.externalJobId)),
      h("dt", {}, "Expected by"), h("dd", { "data-fact": "expected-by" }, e.expectedBy ? `${when(e.expectedBy)} (${new Date(e.expectedBy) < new Date() ? "overdue" : "in " + age(new Date(2 * Date.now() - new Date(e.expectedBy).getTime()).toISOString())})` : NULL_SHOWN))) : null;
  const timeline = h("ol", { class: "timeline", "aria-label": "Message history" }, e.history.map((m) => h("li", {},
    h("strong", {}, `${m.sequence || ""}. ${m.messageType}`), " ",
    h("span", { class: "muted" }, `${m.from || "?"} → ${m.to || "?"} · ${when(m.enqueuedTimeUtc)} · ${m.messageId}`),
    m.messageContent && m.messageContent.ErrorContent && m.messageContent.ErrorContent.ErrorText
      ? h("div", { class: "error" }, m.messageContent.ErrorContent.ErrorText) : null)));
  const audits = e.audits.length ? h("div", { class: "scroll" }, h("table", { class: "stack", "aria-label": "Audits" },
    h("thead", {}, h("tr", {}, ["When", "Type", "By", "Comment", "Data"].map((t) => h("th", {}, t)))),
    h("tbody", {}, e.audits.map((a) => h("tr", { "data-audit": a.auditType },
      h("td", { "data-label": "When" }, when(a.auditTimestamp)),
      h("td", { "data-label": "Type" }, a.auditType + (a.accessDenied ? " (denied)" : "")),
      h("td", { "data-label": "By" }, a.auditorName),
      h("td", { "data-label": "Comment" }, a.comment || ""),
      h("td", { "data-label": "Data" }, auditData(a.data))))))) : h("p", { class: "muted" }, "No audit yet.");
  return h("section", { "aria-labelledby": "event-title" },
    h("p", {}, h("a", { href: `#/endpoint/${segment(endpointId)}` }, `← Events of ${endpointId}`)),
    h("h1", { id: "event-title" }, `Event ${eventId}`),
    h("div", { class: "grid2" }, h("div", { class: "card" }, facts), actionsCard(e, endpointId, eventId)),
    handoff,
    h("h2", {}, "Payload"), h("pre", { tabindex: "0", "aria-label": "Payload" }, pretty(e.eventJson) || NULL_SHOWN),
    h("h2", {}, "History"), h("div", { class: "card" }, timeline),
    h("h2", {}, "Audits"), audits);
}

function actionsCard(e, endpointId, eventId) {
  const at = (action) => `events/${action}?${idQuery({ endpointId, eventId })}`;
  const done = (result) => {
    toast(`${result.action} accepted: ${result.messageType} ${result.controlMessageId} by ${result.by}`);
    render();
  };
  const failed = (error) => toast(`Refused: ${error.message}`);
  const card = h("div", { class: "card", "aria-label": "Actions" }, h("h2", {}, "Actions"));
  if (e.settlement) card.append(settlementNote(e, endpointId, eventId));
  else if (!e.actions.length) card.append(noActionNote(e, endpointId));
  if (e.actions.includes("complete")) {
    const result = h("textarea", { id: "complete-result", class: "short", rows: 3 }, "");
    card.append(h("label", {}, "Result (JSON, optional)", result),
      h("div", { class: "buttons" },
        h("button", { type: "button", id: "complete", onclick: async () => {
          let value = null;
          if (result.value.trim()) {
            try { value = JSON.parse(result.value); } catch { return toast("The result is not valid JSON."); }
          }
          if (!(await confirmDialog("Complete the hand-off?", h("p", {}, `One HandoffCompletedRequest goes to ${endpointId}.`), "Complete"))) return;
          api(at("complete"), { method: "POST", body: addressed(e, { result: value }) }).then(done, failed);
        } }, "Complete hand-off"),
        h("button", { type: "button", class: "danger", id: "fail", onclick: async () => {
          const reason = h("input", { id: "fail-reason", required: true });
          const errorType = h("input", { id: "fail-type", placeholder: "ExternalJobFailed" });
          if (!(await confirmDialog("Fail the hand-off?", [h("label", {}, "Why it failed", reason), h("label", {}, "Error type (optional)", errorType)], "Fail", true))) return;
          if (!reason.value.trim()) return toast("A reason is needed to fail a hand-off.");
          api(at("fail"), { method: "POST", body: addressed(e, failBody(reason.value, errorType.value)) }).then(done, failed);
        } }, "Fail hand-off")));
  }
  if (e.actions.includes("resubmit")) {
    const editor = h("textarea", { id: "resubmit-payload", "aria-label": "Payload to resubmit (EventJson)" }, pretty(e.eventJson));
    card.append(h("label", {}, "Payload to resubmit (edit to resubmit with changes)", editor),
      h("div", { class: "buttons" }, h("button", { type: "button", id: "resubmit", onclick: async () => {
        let edited = null;
        try {
          const original = e.eventJson ? JSON.stringify(JSON.parse(e.eventJson)) : null;
          const now = JSON.stringify(JSON.parse(editor.value));
          if (now !== original) edited = now;
        } catch { return toast("The payload is not valid JSON."); }
        const what = edited ? "Resubmit with changes" : "Resubmit";
        const reason = h("input", { id: "resubmit-reason" });
        if (!(await confirmDialog(`${what}?`, [h("p", {}, `One ResubmissionRequest goes to ${endpointId}; the handler runs again.`), h("label", {}, "Reason (optional, kept in the audit)", reason)], what))) return;
        api(at("resubmit"), { method: "POST", body: addressed(e, resubmitBody(edited, reason.value)) }).then(done, failed);
      } }, "Resubmit")));
  }
  if (e.actions.includes("skip")) {
    card.append(h("div", { class: "buttons" }, h("button", { type: "button", class: "secondary", id: "skip", onclick: async () => {
      const reason = h("input", { id: "skip-reason", "aria-label": "Reason (optional)" });
      if (!(await confirmDialog("Skip this event?", [h("p", {}, `One SkipRequest goes to ${endpointId}; the event is not handled.`), h("label", {}, "Reason (optional)", reason)], "Skip", true))) return;
      api(at("skip"), { method: "POST", body: addressed(e, reason.value.trim() ? { reason: reason.value.trim() } : {}) }).then(done, failed);
    } }, "Skip")));
  }
  return card;
}

// -- stuck settlements and overdue hand-offs ------------------------------------------------------

const STUCK_COLUMNS = ["Unconfirmed", "Overdue hand-offs"];

function stuckBadges(item) {
  const href = `#/stuck/${segment(item.endpointId)}`;
  return [
    h("td", { class: "num", "data-label": "Unconfirmed" }, badge("Unconfirmed", item.unconfirmed || 0, href)),
    h("td", { class: "num", "data-label": "Overdue hand-offs" }, badge("Overdue", item.overdueHandoffs || 0, href)),
  ];
}

// Every action names the message the operator saw: a retry of it is answered from its claim, never sent twice.
function addressed(e, body) {
  return e.lastMessageId ? { ...body, messageId: e.lastMessageId } : body;
}

async function stuckView(endpointId) {
  const [unconfirmed, overdue] = await Promise.all([
    api(`endpoints/unconfirmed?${idQuery({ endpointId })}`), api(`endpoints/overdue?${idQuery({ endpointId })}`)]);
  const link = (eventId) => h("a", { href: `#/event/${segment(endpointId)}/${segment(eventId)}` }, eventId);
  return h("section", { "aria-labelledby": "stuck-title" },
    h("p", {}, h("a", { href: "#/" }, "← Endpoints")),
    h("h1", { id: "stuck-title" }, `Needs a human on ${endpointId}`),
    h("h2", {}, `Unconfirmed settlements (${unconfirmed.count})`),
    h("p", { class: "muted" }, "Settle could neither confirm these control messages nor re-send them safely. Check the endpoint, then open the event to mark it delivered or release it."),
    unconfirmed.items.length ? h("div", { class: "scroll" }, h("table", { class: "stack", "aria-label": "Unconfirmed settlements" },
      h("thead", {}, h("tr", {}, ["Event", "Message", "Control message", "By", "Claimed"].map((t) => h("th", {}, t)))),
      h("tbody", {}, unconfirmed.items.map((c) => h("tr", { "data-unconfirmed": c.eventId },
        h("td", { "data-label": "Event" }, link(c.eventId)),
        h("td", { "data-label": "Message" }, c.messageType),
        h("td", { "data-label": "Control message" }, c.controlMessageId),
        h("td", { "data-label": "By" }, c.settledBy),
        h("td", { "data-label": "Claimed" }, `${when(c.claimedAt)} (${age(c.claimedAt)} ago)`)))))) : h("p", {}, "None."),
    h("h2", {}, `Overdue hand-offs (${overdue.count})`),
    overdue.items.length ? h("div", { class: "scroll" }, h("table", { class: "stack", "aria-label": "Overdue hand-offs" },
      h("thead", {}, h("tr", {}, ["Event", "Expected by", "Overdue by"].map((t) => h("th", {}, t)))),
      h("tbody", {}, overdue.items.map((o) => h("tr", { "data-overdue": o.eventId },
        h("td", { "data-label": "Event" }, link(o.eventId)),
        h("td", { "data-label": "Expected by" }, when(o.expectedBy)),
        h("td", { "data-label": "Overdue by" }, age(o.expectedBy))))))) : h("p", {}, "None."));
}

// The claim on the event's current message: what is in flight, and (unconfirmed only) the way out.
function settlementNote(e, endpointId, eventId) {
  const s = e.settlement;
  const note = h("div", { class: "settlement", "aria-label": "Settlement" },
    h("p", {}, `${s.messageType} ${s.controlMessageId} by ${s.settledBy} is ${s.state} (claimed ${when(s.claimedAt)}).`));
  if (s.state !== "unconfirmed") {
    note.append(h("p", { class: "muted" }, "Nothing else can be sent for this message while it stands."));
    return note;
  }
  note.append(h("p", {}, "Settle could not confirm it reached the endpoint, and cannot re-send it safely. Check the endpoint first."));
  const resolveWith = (resolution, title, okLabel, danger) => async () => {
    const reason = h("input", { id: "resolve-reason", "aria-label": "Why (what you checked)", required: true });
    if (!(await confirmDialog(title, [h("label", {}, "Why (what you checked)", reason)], okLabel, danger))) return;
    if (!reason.value.trim()) return toast("A reason is needed.");
    const body = { messageId: s.addressedMessageId, controlMessageId: s.controlMessageId, resolution, reason: reason.value.trim() };
    api(`events/settlement/resolve?${idQuery({ endpointId, eventId })}`, { method: "POST", body }).then(
      (result) => { toast(`Settlement ${result.state}${result.replayed ? " (already)" : ""} by ${result.by}`); render(); },
      (error) => toast(`Refused: ${error.message}`));
  };
  const buttons = h("div", { class: "buttons" });
  if (e.actions.includes("mark-delivered")) {
    buttons.append(h("button", { type: "button", id: "mark-delivered", onclick: resolveWith("delivered", "Mark it delivered?", "Mark delivered") }, "Mark delivered"));
  }
  if (e.actions.includes("release")) {
    buttons.append(h("button", { type: "button", class: "danger", id: "release", onclick: resolveWith("released", "Release it? The hand-off can then be settled again.", "Release", true) }, "Release"));
  }
  note.append(buttons);
  return note;
}

// -- poison ------------------------------------------------------------------------------------------

async function poisonView(params) {
  const day = params.get("day") || new Date().toISOString().slice(0, 10).replace(/-/g, "");
  const token = params.get("continuationToken");
  const page = await api(`poison?day=${day}&pageSize=100${token ? "&continuationToken=" + encodeURIComponent(token) : ""}`);
  lastPoisonPage = page;
  const picker = h("form", { class: "filters card", "aria-label": "Day", onsubmit: (ev) => {
    ev.preventDefault();
    const value = new FormData(ev.target).get("day");
    if (value) location.hash = `#/poison?day=${String(value).replace(/-/g, "")}`;
  } }, h("label", {}, "Day (UTC)", h("input", { type: "date", name: "day", value: `${day.slice(0, 4)}-${day.slice(4, 6)}-${day.slice(6, 8)}` })),
    h("button", { type: "submit" }, "Show"));
  const rows = page.items.map((p) => h("tr", { "data-poison": p.messageId || p.id },
    h("td", { "data-label": "Enqueued" }, when(p.enqueuedTimeUtc)),
    h("td", { "data-label": "Endpoint" }, p.endpointId ? h("a", { href: `#/endpoint/${segment(p.endpointId)}` }, p.endpointId) : NULL_SHOWN),
    h("td", { "data-label": "Message" }, h("details", {}, h("summary", {}, p.messageId || "(no id)"),
      h("pre", { tabindex: "0", "aria-label": "Application properties" }, pretty(p.applicationProperties)),
      h("pre", { tabindex: "0", "aria-label": "Body" }, p.messageContent !== null ? pretty(p.messageContent) : `base64: ${p.messageContentBase64 || ""}`))),
    h("td", { "data-label": "Reason" }, p.reason),
    h("td", { "data-label": "Replay" }, p.replayOutcome
      ? `${p.replayOutcome} by ${p.replayedBy} at ${when(p.replayedAt)}${p.replayDetail ? " — " + p.replayDetail : ""}` : NULL_SHOWN),
    h("td", {}, ["applied", "refused", "duplicate"].includes(p.replayOutcome) ? null :
      h("button", { type: "button", class: "secondary", "data-replay": p.id, onclick: async () => {
        if (!(await confirmDialog("Replay this message?", h("p", {}, "It goes through the resolver again; the answer says what happened."), "Replay"))) return;
        try {
          const answer = await api(`poison/replay?${idQuery({ day: p.day, id: p.id })}`, { method: "POST", body: {} });
          toast(`Replay: ${answer.outcome}${answer.detail ? " — " + answer.detail : ""}`);
        } catch (error) { toast(`Refused: ${error.message}`); }
        render();
      } }, "Replay"))));
  return h("section", { "aria-labelledby": "poison-title" },
    h("h1", { id: "poison-title" }, "Poison"),
    h("p", { class: "muted" }, "Resolver input that could never be projected, with its reason and whole body."),
    picker,
    page.items.length ? h("div", { class: "scroll" }, h("table", { class: "stack" },
      h("thead", {}, h("tr", {}, ["Enqueued", "Endpoint", "Message", "Reason", "Last replay", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows))) : h("p", {}, "No poison on this day."),
    h("div", { class: "pager" },
      token ? h("a", { href: `#/poison?day=${day}` }, "First page") : null,
      page.continuationToken ? h("a", { href: `#/poison?day=${day}&continuationToken=${encodeURIComponent(page.continuationToken)}` }, "Next page") : null));
}

// -- state -------------------------------------------------------------------------------------------

const KEY_FIELDS = [
  ["tenantId", "Tenant id", "number", true], ["scopeId", "Scope id (1-7)", "number", true],
  ["entityId", "Entity id", "number", true], ["entityExecutionId", "Entity execution id", "number", false],
  ["sourceAppId", "Source app id", "number", false], ["itemEntityKey", "Item entity key", "text", true],
  ["itemKey", "Item key", "text", true], ["subItemEntityKey", "Sub-item entity key", "text", false],
  ["subItemKey", "Sub-item key", "text", false],
];
let lookupResult = null;

async function stateView() {
  const stuck = await api("records/stuck");
  const form = h("form", { class: "card filters", "aria-label": "Record key", onsubmit: async (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    const key = {};
    for (const [name, , type] of KEY_FIELDS) {
      const value = String(data.get(name) || "");
      if (value === "") continue;
      key[name] = type === "number" ? Number(value) : value;
    }
    try {
      lookupResult = { ...(await api("records/lookup", { method: "POST", body: { key, pageSize: 50 } })), key };
    } catch (error) {
      lookupResult = { error, key };
    }
    render();
  } }, KEY_FIELDS.map(([name, label, type, required]) => h("label", {}, label,
    h("input", { name, type, required, value: (lookupResult && lookupResult.key && lookupResult.key[name]) || "" }))),
    h("button", { type: "submit", id: "lookup" }, "Look up"));
  return h("section", { "aria-labelledby": "state-title" },
    h("h1", { id: "state-title" }, "State records"),
    form, lookupView(),
    h("h2", {}, `Stuck in Processing past their lock (${stuck.count})`),
    stuck.count ? recordTable(stuck.items) : h("p", { class: "muted" }, "None: every expired lock has been caught up."));
}

function lookupView() {
  if (!lookupResult) return null;
  if (lookupResult.error) return problemView(lookupResult.error);
  const r = lookupResult.record;
  return h("div", { class: "card", id: "record" },
    h("h2", {}, r ? `Record: ${r.status}` : "No record for this key"),
    r ? h("dl", { class: "facts" }, [["Item", `${r.itemEntityKey} / ${r.itemKey}`], ["Version", r.version],
      ["Locked until", when(r.lockedUntil)], ["Updated", when(r.updatedAt)], ["Error", r.error || NULL_SHOWN]]
      .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])) : null,
    r ? h("pre", { tabindex: "0" }, pretty(r.data)) : null,
    h("h2", {}, "History"), recordTable(lookupResult.history.items));
}

function recordTable(items) {
  return rememberItems(items, h("div", { class: "scroll" }, h("table", { class: "stack" },
    h("thead", {}, h("tr", {}, ["Status", "Item", "Version", "Locked until", "Updated"].map((t) => h("th", {}, t)))),
    h("tbody", {}, items.map((r) => h("tr", {},
      h("td", { "data-label": "Status" }, r.status + (r.originalStatus ? ` (was ${r.originalStatus})` : "")),
      h("td", { "data-label": "Item" }, `${r.itemEntityKey} / ${r.itemKey}`),
      h("td", { "data-label": "Version" }, String(r.version)),
      h("td", { "data-label": "Locked until" }, when(r.lockedUntil)),
      h("td", { "data-label": "Updated" }, when(r.updatedAt))))))));
}

window.addEventListener("hashchange", () => {
  document.getElementById("toast").textContent = ""; // a message belongs to the view it came from
  render();
});
window.addEventListener("DOMContentLoaded", () => { render(); schedule(); });

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

function auditData(data) {
  if (!data) return "";
  return h("pre", { class: "audit-data", tabindex: "0" }, pretty(data));
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

function summaryTable(items, { select, matched } = {}) {
  return h("div", { class: "scroll" }, h("table", { class: "stack" },
    h("thead", {}, h("tr", {}, select ? h("th", {}, h("span", { class: "sr" }, "Select")) : null,
      [...(matched ? ["Matched"] : []), "Endpoint", "Event", "Status", "Type", "Session", "Changed", "Reason"].map((t) => h("th", {}, t)))),
    h("tbody", {}, items.map((e) => h("tr", { "data-event": e.eventId, "data-endpoint-row": e.endpointId, "data-matched": e.matchedBy || null },
      matched ? h("td", { "data-label": "Matched" }, (e.matches || []).flatMap((m, i) => [i ? ", " : "",
        h("span", { class: "match", "data-kind": m.kind }, `${KIND_NAMES[m.kind] || m.kind} `, h("code", {}, m.value))])) : null,
      h("td", { "data-label": "Endpoint" }, h("a", { href: `#/endpoint/${segment(e.endpointId)}` }, e.endpointId)),
      h("td", { "data-label": "Event" }, h("a", { href: `#/event/${segment(e.endpointId)}/${segment(e.eventId)}` }, e.eventId)),
      h("td", { "data-label": "Status" }, statusBadge(e.resolutionStatus, e.pendingSubStatus)),
      h("td", { "data-label": "Type" }, asSent(e.eventTypeId)),
      h("td", { "data-label": "Session" }, e.sessionId ? h("a", { href: `#/session/${segment(e.sessionId)}` }, e.sessionId) : asSent(e.sessionId)),
      h("td", { "data-label": "Changed" }, when(e.updatedAt)),
      h("td", { "data-label": "Reason" }, e.reason || ""))))));
}

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
    const answer = await api(`find?${ID_KINDS[kind][0]}=${encodeURIComponent(q)}`);
    const kinds = [...new Set(answer.items.map((e) => KIND_NAMES[e.matchedBy] || e.matchedBy))];
    results = answer.items.length ? [
      h("p", { id: "find-summary", role: "status" }, `${answer.items.length} hand-off${answer.items.length === 1 ? "" : "s"} by ${kinds.join(", ").toLowerCase()}.`),
      summaryTable(answer.items, { matched: true })]
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
  const answer = await api(`find?sessionId=${encodeURIComponent(sessionId)}`);
  const open = answer.items.filter((e) => !["Completed", "Skipped"].includes(e.resolutionStatus));
  const blocked = answer.items.find((e) => ["Failed", "DeadLettered"].includes(e.resolutionStatus));
  return h("section", { "aria-labelledby": "session-title" },
    h("p", {}, h("a", { href: "#/find?by=sessionId" }, "← Find")),
    h("h1", { id: "session-title" }, `Session ${sessionId}`),
    h("p", { class: blocked ? "error" : "muted", "data-session-state": blocked ? "blocked" : "open" },
      blocked ? `Blocked: ${blocked.eventId} on ${blocked.endpointId} is ${blocked.resolutionStatus}; ${open.length} event(s) of this session are not done.`
        : `${answer.items.length} event(s), ${open.length} not done; nothing failed.`),
    answer.items.length ? summaryTable(answer.items) : h("p", {}, "No event of this session on any endpoint."));
}

async function failedView(route) {
  const answer = await api("failed?pageSize=50");
  const filter = route.params.get("errorText") || "";
  const shown = filterByError(answer.items, filter);
  return h("section", { "aria-labelledby": "failed-title" },
    h("h1", { id: "failed-title" }, "Failed across endpoints"),
    h("p", { class: "muted" }, "Failed and dead-lettered events of every endpoint, newest change first (50 per endpoint and status)."),
    errorFilterForm("#/failed", new URLSearchParams(), filter, shown.length, answer.items.length),
    shown.length ? summaryTable(shown) : h("p", {}, filter ? "No failed event's error matches." : "Nothing failed."));
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
    h("td", { "data-label": "When" }, when(a.auditTimestamp)),
    h("td", { "data-label": "Type" }, a.auditType + (a.accessDenied ? " (denied)" : "")),
    h("td", { "data-label": "By" }, a.auditorName),
    h("td", { "data-label": "Endpoint" }, a.endpointId ? h("a", { href: `#/endpoint/${segment(a.endpointId)}` }, a.endpointId) : NULL_SHOWN),
    h("td", { "data-label": "Event" }, a.eventId ? h("a", { href: `#/event/${segment(a.endpointId)}/${segment(a.eventId)}` }, a.eventId) : NULL_SHOWN),
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
    bulkReport && bulkReport.endpointId === endpointId ? bulkReportView(bulkReport) : null);
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
  // The history and stuck tables gain the error and note columns; a stuck record links to its lookup.
  for (const table of view.querySelectorAll("table.stack")) recordColumns(table);
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
      ["App", "Process", "Thread", "Element", "ProcessExecution", "ThreadExecution", "ElementExecution"]
        .map((name) => h("option", { value: name, selected: stateQuery && stateQuery.body.scope === name }, name)))),
    h("label", {}, "Entity (node) id", h("input", { name: "browseEntityId", type: "number", value: stateQuery && stateQuery.body.entityId !== undefined ? stateQuery.body.entityId : "" })),
    h("label", {}, "Status", h("select", { name: "browseStatus", id: "browse-status" }, h("option", { value: "" }, "Any"),
      ["Processing", "Processed", "Failed", "Skipped", "Expired"].map((name) => h("option", { value: name, selected: stateQuery && stateQuery.body.status === name }, name)))),
    h("button", { type: "submit", id: "browse-go" }, "Browse"));
  const results = stateQuery ? (stateQuery.error ? problemView(stateQuery.error) : h("div", { id: "browse-results" },
    h("p", { class: "muted" }, `${stateQuery.page.items.length} record(s)${stateQuery.page.continuationToken ? " (first page)" : ""}`),
    recordTable(stateQuery.page.items))) : null;
  const title = view.querySelector("h1");
  title.after(h("h2", {}, "Browse a node's records"), browse);
  if (results) {
    browse.after(results);
    recordColumns(results.querySelector("table.stack"));
  }
  for (const holder of view.querySelectorAll("div.scroll")) linkLookups(holder);
}

function rememberItems(items, holder) {
  holder.recordItems = items;
  return holder;
}

function recordColumns(table) {
  if (!table || table.dataset.extra) return;
  table.dataset.extra = "1";
  const items = table.parentElement.recordItems || [];
  table.querySelector("thead tr").append(h("th", {}, "Error"), h("th", {}, "Note"));
  table.querySelectorAll("tbody tr").forEach((row, i) => {
    const r = items[i] || {};
    row.append(h("td", { "data-label": "Error", class: r.error ? "error" : "" }, r.error || ""), h("td", { "data-label": "Note" }, r.note || ""));
  });
}

function linkLookups(holder) {
  const items = holder.recordItems || [];
  holder.querySelectorAll("tbody tr").forEach((row, i) => {
    const r = items[i];
    if (!r) return;
    const cell = row.querySelector('td[data-label="Item"]');
    cell.replaceChildren(h("a", { href: "#/state", "data-lookup": r.itemKey, onclick: (ev) => {
      ev.preventDefault();
      lookUpRecord(r);
    } }, `${r.itemEntityKey} / ${r.itemKey}`));
  });
}

async function lookUpRecord(r) {
  const key = { tenantId: r.tenantId, scopeId: r.scopeId, entityId: r.entityId, itemEntityKey: r.itemEntityKey, itemKey: r.itemKey };
  if (r.entityExecutionId !== null && r.entityExecutionId !== undefined) key.entityExecutionId = r.entityExecutionId;
  if (r.sourceAppId !== null && r.sourceAppId !== undefined) key.sourceAppId = r.sourceAppId;
  if (r.subItemEntityKey) key.subItemEntityKey = r.subItemEntityKey;
  if (r.subItemKey) key.subItemKey = r.subItemKey;
  try { lookupResult = { ...(await api("records/lookup", { method: "POST", body: { key, pageSize: 50 } })), key }; } catch (error) { lookupResult = { error, key }; }
  await render();
  const record = document.getElementById("record");
  if (record) record.scrollIntoView();
}
