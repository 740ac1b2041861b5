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
  for (const child of children.flat(Infinity)) {
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

// A time as a <time> that never wraps inside itself (at 1400 px a narrow column broke it at its spaces).
function stamp(iso) {
  return iso ? h("time", { datetime: iso }, when(iso)) : NULL_SHOWN;
}

// An id is one token: class "id" keeps it on one line (ids wrapped at their hyphens).
function idLink(href, id) {
  return h("a", { href, class: "id" }, id);
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

function asId(value) {
  const shown = asSent(value);
  return typeof shown === "string" && shown !== NULL_SHOWN ? h("span", { class: "id" }, shown) : shown;
}

function age(iso) {
  if (!iso) return NULL_SHOWN;
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

// atLeast: the API counted that status only up to its cap, so the oldest is at least this old ("≥ 3 d").
function oldestAge(iso, atLeast) {
  return iso && atLeast ? `≥ ${age(iso)}` : age(iso);
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

// atLeast: the API stopped counting at ``count`` (shown "1000+").
function badge(bucket, count, href, atLeast) {
  const cls = `badge ${bucket}${count ? "" : " zero"}`;
  const label = `${atLeast ? "at least " : ""}${count} ${bucket === "PendingHandoff" ? "Pending + Handoff" : bucket}`;
  const shown = `${count}${atLeast ? "+" : ""}`;
  return href
    ? h("a", { class: cls, href, "aria-label": label, "data-bucket": bucket }, shown)
    : h("span", { class: cls, "aria-label": label, "data-bucket": bucket }, shown);
}

// -- lists the API pages: the first page, then "More" -------------------------------------------------

// Rows "More" loaded, per list of the current view: the 5 s refresh reads as many again (so they stay on
// screen, fresh); a new route starts at the first page.
const loaded = new Map();
let moreBusy = false;

function withQuery(path, params) {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== ""));
  return `${path}${path.includes("?") ? "&" : "?"}${query}`;
}

// A list's first page, or as many rows as "More" had loaded (pages of at most maxPage), with the API's count
// of them all where it gives one.
async function listPages(name, path, pageSize, maxPage) {
  const want = Math.max(pageSize, loaded.get(name) || 0);
  const first = await api(withQuery(path, { pageSize: Math.min(want, maxPage) }));
  const items = [...first.items];
  let token = first.continuationToken;
  while (token && items.length < want) {
    const next = await api(withQuery(path, { pageSize: Math.min(want - items.length, maxPage), continuationToken: token }));
    items.push(...next.items);
    token = next.continuationToken;
  }
  return { ...first, items, continuationToken: token };
}

// How many a list holds, as far as is known: "N" when exact (the API's count, or every page loaded), else
// "at least N" (the API stopped counting, or more follow uncounted).
function howMany(list, counted) {
  const shown = list.items.length;
  if (counted && typeof list.count === "number" && !list.atLeast) return String(list.count);
  if (!list.continuationToken) return String(shown);
  return `at least ${Math.max(counted && typeof list.count === "number" ? list.count : 0, shown + 1)}`;
}

// A list the API pages: its first rows, and a "More" button that fetches the next page with the list's
// continuationToken and appends its rows, until none is left. name: the list (ids "<name>-more",
// "<name>-shown"); path, pageSize: its query; rows(items): the rows of a page; table(rows): the table that
// holds them (its tbody gets the rest); empty: what an empty list says; heading + label(howMany): the
// heading that says how many, kept up to date; counted: the API's count is of them all.
function pagedList(name, list, { path, pageSize, rows, table, empty, heading, label, counted }) {
  const say = () => { if (heading) heading.textContent = label(howMany(list, counted)); };
  say();
  if (!list.items.length && !list.continuationToken) return [empty];
  const holder = table(rows(list.items));
  if (!list.continuationToken && !loaded.has(name)) return [holder]; // one page, whole: nothing to say
  const shown = h("span", { id: `${name}-shown`, class: "muted", role: "status", tabindex: "-1" });
  const pager = h("div", { class: "pager more" });
  const more = h("button", { type: "button", class: "secondary", id: `${name}-more`, onclick: async () => {
    if (moreBusy) return; // one page at a time; the button stays focusable while it loads
    moreBusy = true;
    more.setAttribute("aria-busy", "true");
    try {
      const next = await api(withQuery(path, { pageSize, continuationToken: list.continuationToken }));
      const added = rows(next.items);
      holder.querySelector("tbody").append(...added);
      list.items.push(...next.items);
      list.continuationToken = next.continuationToken;
      loaded.set(name, list.items.length);
      update();
      if (!list.continuationToken) (added[0] && added[0].querySelector("a, button, input") || shown).focus();
    } catch (error) {
      toast(`More: ${error.message}`);
    } finally {
      moreBusy = false;
      more.removeAttribute("aria-busy");
    }
  } }, "More");
  const update = () => {
    say();
    const total = howMany(list, counted);
    shown.textContent = list.continuationToken
      ? `${list.items.length} shown of ${total}; More loads the next ${pageSize}.`
      : `All ${list.items.length} shown.`;
    if (!list.continuationToken) more.remove();
  };
  pager.append(more, shown);
  update();
  return [holder, pager];
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
  return document.getElementById("confirm").open || bulkBusy || moreBusy ||
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
  // A refresh keeps the keyboard where it was (on "More", say): the new view's element of the same id.
  const focused = quiet && main.contains(document.activeElement) ? document.activeElement.id : "";
  main.replaceChildren(view);
  const again = focused && document.getElementById(focused);
  if (again) again.focus({ preventScroll: true });
  document.getElementById("refresh").textContent = `Updated ${clock(new Date())} · every ${REFRESH_MS / 1000} s`;
  if (!quiet && location.hash !== lastRoute) {
    // A new view starts at its top, focus on it (for screen readers and the keyboard) without scrolling:
    // focus() alone scrolls main's top to the window's, taking the header and "Updated" off screen.
    window.scrollTo(0, 0);
    main.focus({ preventScroll: true });
  }
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
        h("td", { class: "num", "data-label": label }, badge(bucket, item.counts[key], `${base}?status=${bucket}`, item.counts[`${key}AtLeast`]))),
      h("td", { class: "num", "data-label": "Poison" }, badge("Poison", item.poison, poisonHref(item.oldestPoisonDay))),
      stuckBadges(item),
      h("td", { "data-label": "Oldest pending" }, oldestAge(item.oldestPendingAt, item.oldestPendingAtLeast)),
      h("td", { "data-label": "Oldest failed" }, oldestAge(item.oldestFailedAt, item.oldestFailedAtLeast)));
  });
  return h("section", { "aria-labelledby": "endpoints-title" },
    h("h1", { id: "endpoints-title" }, "Endpoints"),
    h("p", { class: "muted" }, "Everything that needs a human; Pending includes Pending + Handoff."),
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
    h("td", { "data-label": "Event" }, idLink(`#/event/${segment(endpointId)}/${segment(e.eventId)}`, e.eventId)),
    h("td", { "data-label": "Status" }, statusBadge(e.resolutionStatus, e.pendingSubStatus)),
    h("td", { "data-label": "Type" }, asSent(e.eventTypeId)),
    h("td", { "data-label": "Last message" }, e.messageType),
    h("td", { "data-label": "Changed" }, stamp(e.updatedAt)),
    h("td", { "data-label": "Reason" }, e.reason || "")));
  const pager = h("div", { class: "pager" },
    params.get("continuationToken") ? h("a", { href: withParam(params, endpointId, null) }, "First page") : null,
    page.continuationToken ? h("a", { href: withParam(params, endpointId, page.continuationToken) }, "Next page") : null);
  return h("section", { "aria-labelledby": "list-title" },
    h("p", {}, h("a", { href: "#/" }, "← Endpoints")),
    h("h1", { id: "list-title" }, `Events of ${endpointId}`),
    statusCount(page, params.get("status")),
    filters,
    page.items.length ? h("div", { class: "scroll" }, h("table", { class: "stack" },
      h("thead", {}, h("tr", {}, ["Event", "Status", "Type", "Last message", "Changed", "Reason"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows))) : h("p", {}, "No event matches."),
    pager);
}

// With a status as the only filter the API counts them (the overview's count; atLeast: it stopped there).
function statusCount(page, status) {
  if (typeof page.count !== "number") return null;
  const name = status === "PendingHandoff" ? "Pending + Handoff" : status;
  const onPage = page.count > page.items.length ? `; this page shows ${page.items.length}` : "";
  const count = `${page.atLeast ? "at least " : ""}${page.count}`;
  return h("p", { id: "list-count", role: "status" }, `${count} ${name} event${page.count === 1 ? "" : "s"}${onPage}.`);
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
    ["Event type", asSent(e.eventTypeId)], ["Session", asId(e.sessionId)], ["Correlation", asId(e.correlationId)],
    ["Last message", [`${e.messageType} `, e.lastMessageId ? asId(e.lastMessageId) : ""]], ["From → To", `${e.from || "?"} → ${e.to || "?"}`],
    ["Updated", stamp(e.updatedAt)], ...failureFacts(e),
    ["Processing time", e.processingTimeMs === null ? NULL_SHOWN : `${e.processingTimeMs} ms`],
  ].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, asSent(v))]));
  const handoff = e.pendingSubStatus === "Handoff" ? h("div", { class: "card handoff", "aria-label": "Handoff details" },
    h("h2", {}, "Awaiting external work"),
    h("dl", { class: "facts" }, h("dt", {}, "Reason"), h("dd", { "data-fact": "handoff-reason" }, asSent(e.handoffReason)),
      h("dt", {}, "External job"), h("dd", { "data-fact": "external-job" }, asSent(e.externalJobId)),
      h("dt", {}, "Expected by"), h("dd", { "data-fact": "expected-by" }, e.expectedBy ? `${when(e.expectedBy)} (${new Date(e.expectedBy) < new Date() ? "overdue" : "in " + age(new Date(2 * Date.now() - new Date(e.expectedBy).getTime()).toISOString())})` : NULL_SHOWN))) : null;
  const timeline = h("ol", { class: "timeline", "aria-label": "Message history" }, e.history.map((m) => h("li", {},
    h("strong", {}, `${m.sequence || ""}. ${m.messageType}`), " ",
    h("span", { class: "muted" }, `${m.from || "?"} → ${m.to || "?"} · `, stamp(m.enqueuedTimeUtc), " · ", h("span", { class: "id" }, m.messageId)),
    m.messageContent && m.messageContent.ErrorContent && m.messageContent.ErrorContent.ErrorText
      ? h("div", { class: "error" }, m.messageContent.ErrorContent.ErrorText) : null)));
  const audits = e.audits.length ? h("div", { class: "scroll" }, h("table", { class: "stack", "aria-label": "Audits" },
    h("thead", {}, h("tr", {}, ["When", "Type", "By", "Comment", "Data"].map((t) => h("th", {}, t)))),
    h("tbody", {}, e.audits.map((a) => h("tr", { "data-audit": a.auditType },
      h("td", { "data-label": "When" }, stamp(a.auditTimestamp)),
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
const STUCK_PAGE = 200; // the API's default page of unconfirmed settlements and overdue hand-offs

function stuckBadges(item) {
  const href = `#/stuck/${segment(item.endpointId)}`;
  return [
    h("td", { class: "num", "data-label": "Unconfirmed" }, badge("Unconfirmed", item.unconfirmed || 0, href, item.unconfirmedAtLeast)),
    h("td", { class: "num", "data-label": "Overdue hand-offs" }, badge("Overdue", item.overdueHandoffs || 0, href, item.overdueHandoffsAtLeast)),
  ];
}

// Every action names the message the operator saw: a retry of it is answered from its claim, never sent twice.
function addressed(e, body) {
  return e.lastMessageId ? { ...body, messageId: e.lastMessageId } : body;
}

async function stuckView(endpointId) {
  const paths = { unconfirmed: `endpoints/unconfirmed?${idQuery({ endpointId })}`, overdue: `endpoints/overdue?${idQuery({ endpointId })}` };
  const [unconfirmed, overdue] = await Promise.all([
    listPages("unconfirmed", paths.unconfirmed, STUCK_PAGE, 1000), listPages("overdue", paths.overdue, STUCK_PAGE, 1000)]);
  const link = (eventId) => idLink(`#/event/${segment(endpointId)}/${segment(eventId)}`, eventId);
  const unconfirmedTitle = h("h2", { id: "unconfirmed-title" });
  const overdueTitle = h("h2", { id: "overdue-title" });
  return h("section", { "aria-labelledby": "stuck-title" },
    h("p", {}, h("a", { href: "#/" }, "← Endpoints")),
    h("h1", { id: "stuck-title" }, `Needs a human on ${endpointId}`),
    unconfirmedTitle,
    h("p", { class: "muted" }, "Settle could neither confirm these control messages nor re-send them safely. Check the endpoint, then open the event to mark it delivered or release it."),
    pagedList("unconfirmed", unconfirmed, {
      path: paths.unconfirmed, pageSize: STUCK_PAGE, counted: true, heading: unconfirmedTitle,
      label: (n) => `Unconfirmed settlements (${n})`, empty: h("p", {}, "None."),
      table: (rows) => h("div", { class: "scroll" }, h("table", { class: "stack", "aria-label": "Unconfirmed settlements" },
        h("thead", {}, h("tr", {}, ["Event", "Message", "Control message", "By", "Claimed"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows))),
      rows: (items) => items.map((c) => h("tr", { "data-unconfirmed": c.eventId },
        h("td", { "data-label": "Event" }, link(c.eventId)),
        h("td", { "data-label": "Message" }, c.messageType),
        h("td", { "data-label": "Control message" }, h("span", { class: "id" }, c.controlMessageId)),
        h("td", { "data-label": "By" }, c.settledBy),
        h("td", { "data-label": "Claimed" }, stamp(c.claimedAt), ` (${age(c.claimedAt)} ago)`))),
    }),
    overdueTitle,
    pagedList("overdue", overdue, {
      path: paths.overdue, pageSize: STUCK_PAGE, counted: true, heading: overdueTitle,
      label: (n) => `Overdue hand-offs (${n})`, empty: h("p", {}, "None."),
      table: (rows) => h("div", { class: "scroll" }, h("table", { class: "stack", "aria-label": "Overdue hand-offs" },
        h("thead", {}, h("tr", {}, ["Event", "Expected by", "Overdue by"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows))),
      rows: (items) => items.map((o) => h("tr", { "data-overdue": o.eventId },
        h("td", { "data-label": "Event" }, link(o.eventId)),
        h("td", { "data-label": "Expected by" }, stamp(o.expectedBy)),
        h("td", { "data-label": "Overdue by" }, age(o.expectedBy)))),
    }));
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
    h("td", { "data-label": "Enqueued" }, stamp(p.enqueuedTimeUtc)),
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

// The Scope enum of state/model.py, by id (1-7): the API takes the name as "scope".
const SCOPES = ["App", "Process", "Thread", "Element", "ProcessExecution", "ThreadExecution", "ElementExecution"];
const KEY_EXAMPLE = '{"tenantId": 1, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice", "itemKey": "INV-42"}';
let lookupResult = null;

// The key as the API takes it (pasted from a log, a request or the client), alone or as {"key": ...};
// a scope chosen by name replaces the key's scope or scopeId.
function keyFrom(text, scope) {
  let value;
  try { value = JSON.parse(text); } catch (error) { throw new ApiError(400, { detail: `The key is not valid JSON: ${error.message}` }); }
  const key = value && typeof value.key === "object" && value.key !== null ? value.key : value;
  if (!key || typeof key !== "object" || Array.isArray(key)) throw new ApiError(400, { detail: "The key is a JSON object, e.g. " + KEY_EXAMPLE });
  if (!scope) return key;
  const named = { ...key, scope };
  delete named.scopeId;
  return named;
}

function scopeOf(key) {
  if (!key) return "";
  if (typeof key.scope === "string") return SCOPES.find((name) => name.toLowerCase() === key.scope.toLowerCase()) || "";
  return SCOPES[key.scopeId - 1] || "";
}

const RECORDS_PAGE = 50;

async function stateView() {
  const stuck = await listPages("stuck-records", "records/stuck", RECORDS_PAGE, 1000);
  const scope = h("select", { name: "scope", id: "lookup-scope" }, h("option", { value: "" }, "As in the key"),
    SCOPES.map((name, i) => h("option", { value: name, selected: lookupResult && lookupResult.scope === name }, `${name} (${i + 1})`)));
  const text = h("textarea", { name: "key", id: "lookup-key", class: "short", rows: 4, required: true, spellcheck: "false",
    placeholder: KEY_EXAMPLE, oninput: () => {
      // The scope shown follows the pasted key (a number becomes its name); picking one overrides it.
      try { scope.value = scopeOf(keyFrom(text.value, "")) || scope.value; } catch { /* still typing */ }
    } }, lookupResult ? lookupResult.text : "");
  const form = h("form", { class: "card lookup", "aria-label": "Record key", onsubmit: async (ev) => {
    ev.preventDefault();
    const data = new FormData(ev.target);
    const entered = { text: String(data.get("key") || ""), scope: String(data.get("scope") || "") };
    try {
      const key = keyFrom(entered.text, entered.scope);
      lookupResult = { ...entered, ...(await api("records/lookup", { method: "POST", body: { key, pageSize: 50 } })), key };
    } catch (error) {
      lookupResult = { ...entered, error };
    }
    render();
  } },
    h("label", {}, "Key (paste its JSON, as the API takes it)", text),
    h("p", { class: "muted hint" }, "tenantId, scopeId or scope, entityId, itemEntityKey, itemKey; entityExecutionId (scopes 5-7), sourceAppId, subItemEntityKey, subItemKey when the key has them."),
    h("div", { class: "filters" }, h("label", {}, "Scope", scope), h("button", { type: "submit", id: "lookup" }, "Look up")));
  const stuckTitle = h("h2", { id: "stuck-records-title" });
  return h("section", { "aria-labelledby": "state-title" },
    h("h1", { id: "state-title" }, "State records"),
    form, lookupView(),
    stuckTitle,
    pagedList("stuck-records", stuck, {
      path: "records/stuck", pageSize: RECORDS_PAGE, heading: stuckTitle, rows: recordRows, table: recordsHolder,
      label: (n) => `Stuck in Processing past their lock (${n})`,
      empty: h("p", { class: "muted" }, "None: every expired lock has been caught up."),
    }));
}

function lookupView() {
  if (!lookupResult) return null;
  if (lookupResult.error) return problemView(lookupResult.error);
  const r = lookupResult.record;
  return h("div", { class: "card", id: "record" },
    h("h2", {}, r ? `Record: ${r.status}` : "No record for this key"),
    r ? h("dl", { class: "facts" }, [["Item", `${r.itemEntityKey} / ${r.itemKey}`], ["Version", r.version],
      ["Locked until", stamp(r.lockedUntil)], ["Updated", stamp(r.updatedAt)], ["Error", r.error || NULL_SHOWN]]
      .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])) : null,
    r ? h("pre", { tabindex: "0" }, pretty(r.data)) : null,
    h("h2", {}, "History"), recordTable(lookupResult.history.items));
}

function recordTable(items) {
  return recordsHolder(recordRows(items));
}

function recordsHolder(rows) {
  return h("div", { class: "scroll" }, h("table", { class: "stack" },
    h("thead", {}, h("tr", {}, ["Status", "Item", "Version", "Locked until", "Updated", "Error", "Note"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows)));
}

// A listed record opens its lookup (with its history).
function recordRows(items) {
  return items.map((r) => h("tr", {},
    h("td", { "data-label": "Status" }, r.status + (r.originalStatus ? ` (was ${r.originalStatus})` : "")),
    h("td", { "data-label": "Item" }, h("a", { href: "#/state", "data-lookup": r.itemKey, onclick: (ev) => {
      ev.preventDefault();
      lookUpRecord(r);
    } }, `${r.itemEntityKey} / ${r.itemKey}`)),
    h("td", { "data-label": "Version" }, String(r.version)),
    h("td", { "data-label": "Locked until" }, stamp(r.lockedUntil)),
    h("td", { "data-label": "Updated" }, stamp(r.updatedAt)),
    h("td", { "data-label": "Error", class: r.error ? "error" : "" }, r.error || ""),
    h("td", { "data-label": "Note" }, r.note || "")));
}

window.addEventListener("hashchange", () => {
  document.getElementById("toast").textContent = ""; // a message belongs to the view it came from
  loaded.clear(); // a new view starts at the first page of each list
  render();
});
window.addEventListener("DOMContentLoaded", () => {
  // The header is sticky: what scrolls into view (a skip link's target, a looked-up record) stops below it.
  const bar = document.querySelector("header.bar");
  new ResizeObserver(() => document.documentElement.style.setProperty("--bar-height", `${bar.offsetHeight}px`)).observe(bar);
  // The skip link moves focus to the view; followed as a link, "#main" would be read as a route.
  document.querySelector("a.skip").addEventListener("click", (ev) => {
    ev.preventDefault();
    document.getElementById("main").focus();
  });
  render();
  schedule();
});
