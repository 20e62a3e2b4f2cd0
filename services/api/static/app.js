// Gangline's dashboard: reads the API's JSON with the caller's bearer token, and hears of changes over
// server-sent events (GET /v1/stream, opened with a short-lived token from POST /v1/stream-token).
// Plain JS, no build step and no library: each page is drawn from the API's answers; a notice updates
// what it can in place (a job's state) and redraws the page it touches from the API.
"use strict";

const TOKEN_KEY = "gangline-token";
const FINAL = new Set(["completed", "failed", "cancelled", "rejected"]);
const RUNNING = new Set(["placed", "running", "preempting", "resizing"]);
const $ = (sel, root = document) => root.querySelector(sel);

let me = null;
let source = null;
let reconnectTimer = null;
let redrawTimer = null;
const logRows = [];

// -- helpers -------------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-") || key === "title" || key === "href" || key === "style") node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${token()}`, Accept: "application/json", ...(options.headers || {}) },
  });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not a problem document */ }
    throw new ApiError(response.status, detail);
  }
  return response.json();
}

async function allPages(path, limit = 500, maxPages = 20) {
  const items = [];
  let cursor = null;
  for (let i = 0; i < maxPages; i++) {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}limit=${limit}${cursor ? `&cursor=${cursor}` : ""}`);
    items.push(...page.items);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  return items;
}

function hue(name) {
  // FNV-1a, spread by the golden angle: near names get far-apart colours.
  let h = 0x811c9dc5;
  for (const c of name) h = Math.imul(h ^ c.charCodeAt(0), 16777619) >>> 0;
  return Math.round((h % 1000) * 137.508) % 360;
}
function queueColour(queue) { return `hsl(${hue(queue)}, 62%, 52%)`; }

function shortType(type) {
  const parts = type.split(".");
  return parts.length >= 3 && parts[0] === "gangline" ? parts.slice(1, -1).join(".") : type;
}

function when(iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function gpusOf(job) {
  const model = job.gpu_type ? ` ${job.gpu_type}` : "";
  return `${job.workers}x${job.gpus_per_worker}${model}`;
}

function stateBadge(state) { return el("span", { class: `state state-${state}`, text: state }); }

// -- sign in -------------------------------------------------------------------------------------

async function signIn() {
  try {
    me = await api("/v1/whoami");
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(error.status === 401 ? "that token is not valid" : String(error.message));
    return;
  }
  $("#login").hidden = true;
  $("#main").hidden = false;
  $("#logout").hidden = false;
  $("#who").textContent = me.admin ? `${me.tenant} (admin: every queue)` : `${me.tenant} (queues: ${me.queues.join(", ")})`;
  connect();
  route();
}

function showLogin(message = "") {
  $("#main").hidden = true;
  $("#login").hidden = false;
  $("#logout").hidden = true;
  $("#login-error").textContent = message;
}

// -- live updates --------------------------------------------------------------------------------

function setLive(state, text) {
  const badge = $("#live");
  badge.dataset.state = state;
  badge.textContent = text;
}

async function connect() {
  clearTimeout(reconnectTimer);
  if (source) source.close();
  source = null;
  let grant;
  try {
    grant = await api("/v1/stream-token", { method: "POST" });
  } catch (error) {
    setLive("off", "offline");
    reconnectTimer = setTimeout(connect, 3000);
    return;
  }
  const stream = new EventSource(`/v1/stream?token=${encodeURIComponent(grant.token)}`);
  source = stream;
  stream.onopen = () => setLive("live", "live");
  stream.onerror = () => {
    // The token may have expired since: ask for a new one rather than let EventSource retry with it.
    setLive("off", "reconnecting");
    stream.close();
    reconnectTimer = setTimeout(() => { connect(); redraw(); }, 2000);
  };
  stream.addEventListener("notice", (message) => onNotice(JSON.parse(message.data)));
  stream.addEventListener("resync", () => redraw());
}

function onNotice(notice) {
  if (notice.topic === "allocation") addLogRow(noticeLogRow(notice), true);
  if (notice.job_id && notice.state) {
    for (const cell of document.querySelectorAll(`[data-job="${CSS.escape(notice.job_id)}"] .job-state`)) {
      cell.replaceChildren(stateBadge(notice.state));
    }
    const jobPage = $("#page-job");
    if (!jobPage.hidden && jobPage.dataset.job === notice.job_id) $("#job-state").replaceChildren(stateBadge(notice.state));
  }
  const page = currentPage();
  const touches = {
    map: notice.topic === "allocation" || notice.topic === "node",
    queues: notice.topic !== "node",
    jobs: notice.topic === "job" || notice.topic === "allocation",
    job: notice.job_id && notice.job_id === $("#page-job").dataset.job,
    log: false,
    analytics: false,
  };
  if (touches[page.name]) scheduleRedraw();
}

function scheduleRedraw() {
  // At most one redraw in flight per half second, however many notices arrive meanwhile.
  if (redrawTimer) return;
  redrawTimer = setTimeout(async () => { await redraw(); redrawTimer = null; }, 500);
}

// -- routing -------------------------------------------------------------------------------------

function currentPage() {
  const parts = (location.hash || "#/map").slice(2).split("/");
  if (parts[0] === "jobs" && parts[1]) return { name: "job", arg: decodeURIComponent(parts.slice(1).join("/")) };
  const name = ["map", "queues", "jobs", "log", "analytics"].includes(parts[0]) ? parts[0] : "map";
  return { name, arg: null };
}

function route() {
  const page = currentPage();
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== `page-${page.name}`;
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === page.name || (page.name === "job" && link.dataset.page === "jobs"));
  }
  redraw();
}

async function redraw() {
  if (!me) return;
  const page = currentPage();
  const section = $(`#page-${page.name}`);
  try {
    if (page.name === "map") await drawMap();
    else if (page.name === "queues") await drawQueues();
    else if (page.name === "jobs") await drawJobs();
    else if (page.name === "job") await drawJob(page.arg);
    else if (page.name === "log") await drawLog();
    else if (page.name === "analytics") await drawAnalytics();
    section.dataset.loaded = "true";
    section.classList.remove("failed");
  } catch (error) {
    if (error.status === 401) { sessionStorage.removeItem(TOKEN_KEY); showLogin("signed out: the token is no longer valid"); return; }
    section.classList.add("failed");
    section.dataset.error = String(error.message);
  }
}

// -- cluster map ---------------------------------------------------------------------------------

async function drawMap() {
  const [nodes, held] = await Promise.all([api("/v1/nodes"), allPages("/v1/allocations?held=true")]);
  const holders = new Map();  // "node/gpu" -> [{job_id, queue}]
  for (const row of held) {
    for (const gpu of row.gpus) {
      const key = `${row.node}/${gpu}`;
      if (!holders.has(key)) holders.set(key, []);
      holders.get(key).push({ job_id: row.job_id, queue: row.queue });
    }
  }
  const spines = new Map();
  for (const node of nodes.items) {
    const spine = node.spine || "no spine";
    const leaf = node.leaf || "no leaf";
    if (!spines.has(spine)) spines.set(spine, new Map());
    const leaves = spines.get(spine);
    if (!leaves.has(leaf)) leaves.set(leaf, []);
    leaves.get(leaf).push(node);
  }
  const queues = new Set();
  const counts = { free: 0, queue: 0, other: 0, cordoned: 0, degraded: 0 };
  const map = el("div", { class: "spines" });
  for (const [spine, leaves] of [...spines.entries()].sort()) {
    const spineBox = el("div", { class: "spine", "data-spine": spine }, el("h3", { text: `spine ${spine}` }));
    for (const [leaf, members] of [...leaves.entries()].sort()) {
      const leafBox = el("div", { class: "leaf", "data-leaf": leaf }, el("h4", { text: `leaf ${leaf}` }));
      for (const node of members) leafBox.append(nodeBox(node, holders, queues, counts));
      spineBox.append(leafBox);
    }
    map.append(spineBox);
  }
  $("#map").replaceChildren(map);
  $("#map-summary").textContent =
    `${nodes.items.length} nodes · ${counts.free} free · ${counts.queue + counts.other} held · ${counts.cordoned} cordoned · ${counts.degraded} degraded`;
  const legend = [
    el("span", { class: "gpu", "data-state": "free" }), " free ",
    el("span", { class: "gpu", "data-state": "cordoned" }), " cordoned / lost ",
    el("span", { class: "gpu", "data-state": "degraded" }), " degraded ",
  ];
  if (!me.admin) legend.push(el("span", { class: "gpu", "data-state": "other" }), " another tenant's ");
  for (const queue of [...queues].sort()) {
    legend.push(el("span", { class: "gpu", "data-state": "queue", style: `background:${queueColour(queue)}` }), ` ${queue} `);
  }
  $("#legend").replaceChildren(...legend);
}

function nodeBox(node, holders, queues, counts) {
  const cordon = node.cordon;
  const nodeDown = ["lost", "unregistered"].includes(node.state) || Boolean(cordon);
  const failed = new Set(node.cordoned_gpus || []);
  const health = node.gpu_health || {};
  const gpus = node.gpus || [];
  let visibleHeld = 0;
  for (const gpu of gpus) visibleHeld += holders.has(`${node.node}/${gpu.id}`) ? 1 : 0;
  // A tenant does not see other tenants' allocations: the node's count of held GPUs tells how many.
  let othersLeft = Math.max(0, (node.gpus_held || 0) - visibleHeld);
  const cells = el("div", { class: "gpus" });
  for (const gpu of gpus) {
    const held = holders.get(`${node.node}/${gpu.id}`) || [];
    let state = "free";
    if (held.length) state = "queue";
    else if (failed.has(gpu.id) || nodeDown) state = "cordoned";
    else if (health[gpu.id] === "degraded") state = "degraded";
    else if (othersLeft > 0) { state = "other"; othersLeft--; }
    counts[state] += 1;
    const title = [`${node.node}/${gpu.id} ${gpu.model}`, ...held.map((h) => `${h.job_id} (${h.queue})`)];
    if (health[gpu.id] && health[gpu.id] !== "healthy") title.push(`health: ${health[gpu.id]}`);
    const cell = el("a", {
      class: "gpu", "data-gpu": gpu.id, "data-state": state, title: title.join("\n"),
      "data-queue": held.length ? held[0].queue : null, "data-job": null,
      href: held.length ? `#/jobs/${encodeURIComponent(held[0].job_id)}` : null,
    });
    if (held.length) {
      queues.add(held[0].queue);
      cell.style.background = queueColour(held[0].queue);
      cell.dataset.holder = held[0].job_id;
    }
    if (health[gpu.id] === "degraded") cell.classList.add("degraded");
    if (nodeDown || failed.has(gpu.id)) cell.classList.add("cordoned");
    const slices = gpu.mig_enabled ? (gpu.mig_instances || []) : [];
    if (slices.length) {
      cell.classList.add("mig");
      cell.style.background = "";
      slices.forEach((slice, i) => {
        const holder = held[i];
        const part = el("span", {
          class: "slice", "data-profile": slice.profile,
          title: `${slice.profile}${holder ? ` — ${holder.job_id} (${holder.queue})` : " — free"}`,
        });
        if (holder) { part.style.background = queueColour(holder.queue); part.dataset.queue = holder.queue; }
        cell.append(part);
      });
    }
    cells.append(cell);
  }
  const label = cordon ? `${node.state}, ${cordon.mode === "drain" ? "draining" : "cordoned"}` : node.state;
  return el("div", { class: `node node-${node.state}${cordon ? " node-cordoned" : ""}`, "data-node": node.node },
    el("div", { class: "node-name", title: node.health_reason || "" }, node.node, el("small", { text: ` ${node.gpu_model || ""} · ${label}` })),
    cells);
}

// -- queues --------------------------------------------------------------------------------------

const WAITING = ["requested", "admitted", "queued", "pending", "requeued", "preempted"];

async function drawQueues() {
  const [queues, jobs] = await Promise.all([api("/v1/queues"), allPages("/v1/jobs?active=true", 500, 4)]);
  const body = [];
  for (const q of queues.items) {
    const unlimited = q.quota === "unlimited";
    const resources = new Set([
      ...Object.keys(unlimited ? {} : q.quota), ...Object.keys(q.usage || {}), ...Object.keys(q.charged || {}),
    ]);
    if (!resources.size) resources.add("-");
    const waiting = WAITING.reduce((n, s) => n + (q.jobs[s] || 0), 0);
    const running = [...RUNNING].reduce((n, s) => n + (q.jobs[s] || 0), 0);
    let first = true;
    for (const r of [...resources].sort()) {
      const nominal = unlimited ? "unlimited" : (q.quota[r] ? q.quota[r].nominal : 0);
      const used = q.charged ? (q.charged[r] || 0) : (q.usage[r] || 0);
      body.push(el("tr", { "data-queue": q.queue, "data-resource": r },
        el("td", { class: "q-name" }, first ? el("span", { class: "swatch", style: `background:${queueColour(q.queue)}` }) : null, first ? q.queue : ""),
        el("td", { text: first ? (q.cohort || "-") : "" }),
        el("td", { text: r }),
        el("td", { "data-k": "nominal", text: nominal }),
        el("td", { "data-k": "used", text: used, title: q.as_of ? `quota's figure as of ${when(q.as_of)}` : "" }),
        el("td", { "data-k": "held", text: (q.usage || {})[r] || 0 }),
        el("td", { "data-k": "borrowed", text: q.borrowed ? (q.borrowed[r] || 0) : "-" }),
        el("td", { "data-k": "lent", text: q.lent ? fmt(q.lent[r] || 0) : "-" }),
        el("td", { "data-k": "share", text: first ? (q.dominant_share === null ? (q.reported === "unlimited" ? "unlimited" : "not reported yet") : q.dominant_share.toFixed(3)) : "" }),
        el("td", { "data-k": "position", text: first && q.position ? `${q.position}/${q.of}` : "" }),
        el("td", { "data-k": "waiting", text: first ? waiting : "" }),
        el("td", { "data-k": "running", text: first ? running : "" })));
      first = false;
    }
  }
  $("#queues-table tbody").replaceChildren(...body);
  const rows = jobs.filter((j) => WAITING.includes(j.state)).map((j) =>
    el("tr", { "data-job": j.job_id },
      el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(j.job_id)}`, text: j.job_id })),
      el("td", { text: j.queue }), el("td", { class: "job-state" }, stateBadge(j.state)),
      el("td", { text: gpusOf(j) }), el("td", { text: j.reason || "" })));
  $("#waiting-table tbody").replaceChildren(...rows);
}

function fmt(value) { return Number.isInteger(value) ? String(value) : value.toFixed(2); }

// -- jobs ----------------------------------------------------------------------------------------

let jobsCache = [];

async function drawJobs() {
  const active = $("#job-active").checked;
  jobsCache = await allPages(active ? "/v1/jobs?active=true" : "/v1/jobs", 500, 4);
  filterJobs();
}

function filterJobs() {
  const words = $("#job-search").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  const rows = [];
  for (const j of jobsCache) {
    const text = `${j.job_id} ${j.queue} ${j.state} ${j.reason || ""} ${j.reason_code || ""} ${(j.nodes || []).join(" ")}`.toLowerCase();
    if (!words.every((w) => text.includes(w))) continue;
    rows.push(el("tr", { "data-job": j.job_id },
      el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(j.job_id)}`, text: j.job_id })),
      el("td", { text: j.queue }),
      el("td", { class: "job-state" }, stateBadge(j.state)),
      el("td", { text: gpusOf(j) }),
      el("td", { text: (j.nodes || []).join(", ") || "-" }),
      el("td", { text: when(j.submitted_at) }),
      el("td", { class: "reason", text: j.reason || "" })));
  }
  $("#jobs-table tbody").replaceChildren(...rows);
}

function eventSummary(e) {
  const d = e.data || {};
  if (d.placements) return d.placements.map((p) => `rank ${p.rank} on ${p.node} [${p.gpus.join(",")}]`).join("; ");
  if (d.reasons && d.reasons.length) return d.reasons.map((r) => `${r.code || r.plugin}: ${r.message}`).join("; ");
  return d.reason || d.message || "";
}

async function drawJob(jobId) {
  const section = $("#page-job");
  section.dataset.job = jobId;
  const view = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
  const job = view.job;
  $("#job-id").textContent = job.job_id;
  $("#job-state").replaceChildren(stateBadge(job.state));
  const traced = view.events.find((e) => e.traceparent);
  const traceId = traced ? traced.traceparent.split("-")[1] : null;
  const facts = [
    ["queue", job.queue], ["GPUs", gpusOf(job)], ["priority", job.priority],
    ["submitted by", job.submitted_by || "-"], ["attempt", job.attempt ?? "-"],
    ["trace id", traceId || "-"],
  ];
  const spec = job.spec || {};
  if (spec.min_workers != null || spec.max_workers != null) {
    // An elastic job: its workers now, its range, and every size it ran at (one per allocation).
    const range = `${spec.min_workers ?? job.workers}..${spec.max_workers ?? job.workers}`;
    const history = (view.sizes || []).map((s) => s.workers).join(" → ");
    facts.splice(2, 0, ["size", `${job.workers_now ?? "-"} of ${range} workers (${history || "not placed"})`]);
  }
  $("#job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { "data-k": k, id: k === "trace id" ? "job-trace" : null, text: v })]));
  const why = el("div", { class: view.why.pending ? "why pending" : "why" }, el("p", { class: "why-summary", text: view.why.summary }));
  if (view.why.reasons.length) {
    why.append(el("ul", { class: "reasons" }, ...view.why.reasons.map((r) =>
      el("li", { "data-code": r.code },
        el("strong", { text: r.code }), ` (${r.constraint}): ${r.message}`,
        r.unblock ? el("div", { class: "unblock", text: `would unblock: ${r.unblock}` }) : null))));
  }
  $("#job-why").replaceChildren(why);
  drawSteps(view.events, job.state);
  $("#job-timeline").replaceChildren(...view.events.map((e) =>
    el("li", { "data-type": shortType(e.type) },
      el("span", { class: "t-type", text: shortType(e.type) }),
      el("time", { text: when(e.time) }),
      el("span", { class: "t-source", text: e.source }),
      el("span", { class: "t-what", text: eventSummary(e) }))));
  $("#job-placement tbody").replaceChildren(...view.allocations.map((a) =>
    el("tr", { "data-allocation": a.allocation_id },
      el("td", { text: a.allocation_id }), el("td", { text: a.rank }), el("td", { text: a.node }),
      el("td", { text: a.gpus.join(", ") }), el("td", { text: when(a.granted_at) }),
      el("td", { text: a.released_at ? `${when(a.released_at)} (${a.release_reason})` : "held" }))));
}

const STEPS = ["job.requested", "job.admitted", "job.queued", "job.placed", "job.started"];
const ENDS = ["job.completed", "job.failed", "job.cancelled", "job.rejected"];

function drawSteps(events, state) {
  // requested → admitted → queued → placed → started → its end: when each first happened (the latest run).
  const first = new Map();
  for (const e of events) {
    const type = shortType(e.type);
    if (type === "job.requeued" || type === "job.preempted") for (const s of STEPS.slice(2)) first.delete(s);
    if (!first.has(type)) first.set(type, e.time);
  }
  const end = ENDS.find((t) => first.has(t)) || (state === "cancelled" ? "job.cancelled" : null);
  const steps = [...STEPS, end || "…"];
  $("#job-steps").replaceChildren(...steps.map((step) => {
    const at = first.get(step);
    return el("li", { class: at ? "done" : "", "data-step": step },
      el("span", { text: step.replace("job.", "") }), el("time", { text: at ? when(at).slice(11) : "" }));
  }));
}

// -- allocation log ------------------------------------------------------------------------------

let logLoaded = false;

function noticeLogRow(n) {
  return { event: n.id, rank: null, time: n.time, type: n.type, job_id: n.job_id, queue: n.queue, what: n.summary };
}

function addLogRow(row, live) {
  // The API lists one row per rank, a notice is one per event: a notice of an event listed is not added.
  if (logRows.some((r) => r.event === row.event && (r.rank === row.rank || row.rank === null))) return;
  logRows.push(row);
  logRows.sort((a, b) => (a.time < b.time ? 1 : a.time > b.time ? -1 : 0));
  if (logRows.length > 300) logRows.length = 300;
  if (live && currentPage().name === "log") renderLog();
}

async function drawLog() {
  if (!logLoaded) {
    const rows = await allPages("/v1/allocations", 500, 10);
    const listed = new Set(rows.flatMap((a) => [a.granted_event_id, a.released_event_id]));
    for (let i = logRows.length - 1; i >= 0; i--) if (listed.has(logRows[i].event)) logRows.splice(i, 1);
    for (const a of rows.slice(-300)) {
      addLogRow({ event: a.granted_event_id, rank: a.rank, time: a.granted_at, type: "allocation.granted", job_id: a.job_id, queue: a.queue, what: `rank ${a.rank} on ${a.node} [${a.gpus.join(",")}]` }, false);
      if (a.released_at) addLogRow({ event: a.released_event_id, rank: a.rank, time: a.released_at, type: "allocation.released", job_id: a.job_id, queue: a.queue, what: `rank ${a.rank} ${a.release_reason || ""}` }, false);
    }
    logLoaded = true;
  }
  renderLog();
}

function renderLog() {
  $("#log").replaceChildren(...logRows.map((r) =>
    el("li", { "data-type": r.type, "data-job": r.job_id },
      el("time", { text: when(r.time) }),
      el("span", { class: "t-type", text: r.type }),
      r.job_id ? el("a", { href: `#/jobs/${encodeURIComponent(r.job_id)}`, text: r.job_id }) : "",
      r.queue ? el("span", { class: "swatch", style: `background:${queueColour(r.queue)}`, title: r.queue }) : "",
      el("span", { class: "t-what", text: r.what }))));
}

// -- analytics -----------------------------------------------------------------------------------

async function drawAnalytics() {
  const status = $("#analytics-status");
  const [hourly, waited] = await Promise.all([api("/v1/analytics/gpu-hours?window=hour"), api("/v1/analytics/waits")]);
  const away = [hourly, waited].find((answer) => !answer.available);
  if (away) {
    status.textContent = `Analytics unavailable: ${away.detail}. The rest of the dashboard is live.`;
    status.dataset.state = "unavailable";
    $("#chart-utilisation").replaceChildren(el("p", { class: "empty", text: "no figures" }));
    $("#chart-waits").replaceChildren(el("p", { class: "empty", text: "no figures" }));
    $("#waits-latest tbody").replaceChildren();
    return;
  }
  const hours = hourly.figures, waits = waited.figures;
  status.dataset.state = "available";
  status.textContent = `From the analytics app: ${hours.length} hourly rows, ${waits.length} wait windows.`;
  barChart($("#chart-utilisation"), hours.slice(-96));
  lineChart($("#chart-waits"), seriesBy(waits, (r) => `${r.queue} ${r.gpu_model}`, (r) => r.p90_s), "s (p90)");
  drawLatestWaits(waits);
}

function drawLatestWaits(waits) {
  // The newest day-wide window of each series: its count and percentiles.
  const latest = new Map();
  for (const w of waits) {
    const key = `${w.queue} ${w.gpu_model}`;
    if (!latest.has(key) || latest.get(key).start < w.start) latest.set(key, w);
  }
  const rows = [...latest.entries()].sort().map(([key, w]) =>
    el("tr", { "data-series": key },
      el("td", {}, el("span", { class: "swatch", style: `background:${queueColour(key)}` }), key),
      el("td", { text: w.count }), el("td", { text: fmtS(w.p50_s) }), el("td", { text: fmtS(w.p90_s) }),
      el("td", { text: fmtS(w.p99_s) })));
  $("#waits-latest tbody").replaceChildren(...rows);
}

function fmtS(v) { return v === null || v === undefined ? "-" : `${fmt(Number(v))} s`; }

function barChart(container, rows) {
  // GPU-hours per hour window, one bar per queue and GPU model, its utilisation over it.
  const ns = "http://www.w3.org/2000/svg";
  if (!rows.length) { container.replaceChildren(el("p", { class: "empty", text: "no figures yet" })); return; }
  const starts = [...new Set(rows.map((r) => r.start))].sort();
  const names = [...new Set(rows.map((r) => `${r.queue} ${r.gpu_model}`))].sort();
  const w = 640, h = 220, pad = { l: 48, r: 12, t: 14, b: 28 };
  const top = Math.max(...rows.map((r) => r.gpu_hours)) || 1;
  const slot = (w - pad.l - pad.r) / starts.length;
  const bar = Math.max(2, Math.min(28, (slot - 8) / names.length));
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "line-chart");
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  add("line", { x1: pad.l, y1: h - pad.b, x2: w - pad.r, y2: h - pad.b, class: "axis" });
  add("line", { x1: pad.l, y1: pad.t, x2: pad.l, y2: h - pad.b, class: "axis" });
  add("text", { x: 4, y: pad.t + 4, class: "tick" }, `${fmt(top)} GPU-h`);
  add("text", { x: 4, y: h - pad.b, class: "tick" }, "0");
  starts.forEach((start, i) => {
    const x0 = pad.l + i * slot + (slot - bar * names.length) / 2;
    add("text", { x: pad.l + i * slot + slot / 2, y: h - 8, class: "tick", "text-anchor": "middle" }, when(start).slice(5, 16));
    names.forEach((name, j) => {
      const row = rows.find((r) => r.start === start && `${r.queue} ${r.gpu_model}` === name);
      if (!row) return;
      const height = (row.gpu_hours / top) * (h - pad.t - pad.b);
      const rect = add("rect", {
        x: x0 + j * bar, y: h - pad.b - height, width: bar - 1, height: Math.max(height, 1),
        fill: queueColour(name), "data-series": name,
      });
      const share = row.utilisation === null ? "" : `, ${(row.utilisation * 100).toFixed(2)} % of the model's GPUs`;
      const tip = document.createElementNS(ns, "title");
      tip.textContent = `${name} ${when(row.start)}: ${fmt(row.gpu_hours)} GPU-h${share}`;
      rect.append(tip);
      if (row.utilisation !== null && bar >= 14) {
        add("text", { x: x0 + j * bar + bar / 2, y: h - pad.b - height - 2, class: "tick", "text-anchor": "middle" },
          `${(row.utilisation * 100).toFixed(1)}%`);
      }
    });
  });
  const legend = el("div", { class: "chart-legend" }, ...names.flatMap((n) => [el("span", { class: "swatch", style: `background:${queueColour(n)}` }), ` ${n} `]));
  container.replaceChildren(svg, legend);
}

function seriesBy(rows, name, value) {
  const out = new Map();
  for (const r of rows) {
    const v = value(r);
    if (v === null || v === undefined) continue;
    const key = name(r);
    if (!out.has(key)) out.set(key, []);
    out.get(key).push([Date.parse(r.start), Number(v)]);
  }
  return [...out.entries()].map(([n, points]) => ({ name: n, points: points.sort((a, b) => a[0] - b[0]) }));
}

function lineChart(container, series, unit) {
  const ns = "http://www.w3.org/2000/svg";
  const w = 640, h = 220, pad = { l: 48, r: 12, t: 10, b: 28 };
  const points = series.flatMap((s) => s.points);
  if (!points.length) { container.replaceChildren(el("p", { class: "empty", text: "no figures yet" })); return; }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  if (x0 === x1) { x0 -= 3600e3; x1 += 3600e3; }
  const y1 = Math.max(...ys, 0) || 1;
  const X = (x) => pad.l + ((x - x0) / (x1 - x0)) * (w - pad.l - pad.r);
  const Y = (y) => h - pad.b - (y / y1) * (h - pad.t - pad.b);
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("class", "line-chart");
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  add("line", { x1: pad.l, y1: h - pad.b, x2: w - pad.r, y2: h - pad.b, class: "axis" });
  add("line", { x1: pad.l, y1: pad.t, x2: pad.l, y2: h - pad.b, class: "axis" });
  add("text", { x: 4, y: pad.t + 10, class: "tick" }, `${fmt(y1)} ${unit}`);
  add("text", { x: 4, y: h - pad.b, class: "tick" }, "0");
  add("text", { x: pad.l, y: h - 6, class: "tick" }, when(new Date(x0).toISOString()));
  add("text", { x: w - pad.r, y: h - 6, class: "tick", "text-anchor": "end" }, when(new Date(x1).toISOString()));
  const legend = el("div", { class: "chart-legend" });
  for (const s of series) {
    const colour = queueColour(s.name);
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    add("path", { d, stroke: colour, fill: "none", "stroke-width": 2, "data-series": s.name });
    for (const p of s.points) add("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, fill: colour });
    legend.append(el("span", { class: "swatch", style: `background:${colour}` }), ` ${s.name} `);
  }
  container.replaceChildren(svg, legend);
}

// -- start ---------------------------------------------------------------------------------------

window.addEventListener("hashchange", route);
$("#job-search").addEventListener("input", filterJobs);
$("#job-active").addEventListener("change", redraw);
$("#login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#token").value = "";
  signIn();
});
$("#logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  if (source) source.close();
  me = null;
  setLive("off", "offline");
  showLogin();
});

(function start() {
  // A link may carry the token in its fragment (never sent to a server): #token=...
  const found = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (found) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", `${location.pathname}#/map`);
  }
  if (token()) signIn(); else showLogin();
})();
