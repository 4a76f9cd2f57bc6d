// The dashboard: a client of the public API, signed in with a key kept in session storage.
// Views by hash: #/batches, #/batch/ID, #/batch/ID/request/INDEX, #/webhooks, #/files, #/operator.
"use strict";

(() => {
  const KEY = "headroom_api_key";
  const main = document.getElementById("main");
  const banner = document.getElementById("banner");
  const nav = document.getElementById("nav");
  const operatorTab = document.getElementById("operator-tab");
  const signOutButton = document.getElementById("sign-out");
  let timer = null; // the current view's refresh
  let generation = 0; // bumped on each navigation: late answers of a left view are dropped
  let charts = []; // the operator view's uPlot instances

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // An element with attributes (on* names become listeners) and children (strings as text).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else if (name === "className") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function button(label, onclick, attrs) {
    return el("button", Object.assign({ type: "button", onclick }, attrs), label);
  }

  // A table head of column names.
  function head(names) {
    return el("thead", {}, el("tr", {}, names.map((h) => el("th", {}, h))));
  }

  // A table's only row, saying it is empty.
  function emptyRow(columns, text) {
    return el("tr", {}, el("td", { colspan: columns, className: "muted" }, text));
  }

  function showError(message) {
    banner.className = "";
    banner.textContent = message;
    banner.hidden = false;
  }

  function showInfo(message) {
    banner.className = "info";
    banner.textContent = message;
    banner.hidden = false;
  }

  function clearBanner() {
    banner.hidden = true;
    banner.textContent = "";
  }

  // The message of an API error body in either shape (Workers AI's or OpenAI's).
  function errorMessage(body, status) {
    if (body && Array.isArray(body.errors) && body.errors.length > 0) {
      const e = body.errors[0];
      return e.field ? `${e.message} (${e.field})` : e.message;
    }
    if (body && body.error && body.error.message) return body.error.message;
    return `HTTP ${status}`;
  }

  // Calls the API with the stored key; a 401 signs out. Answers the parsed body.
  async function api(path, options = {}) {
    const key = sessionStorage.getItem(KEY);
    const headers = Object.assign({ Authorization: `Bearer ${key}` }, options.headers || {});
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    let res;
    try {
      res = await fetch(path, {
        method: options.method || "GET",
        headers,
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
      });
    } catch (e) {
      throw new ApiError(0, `the server cannot be reached (${e.message})`);
    }
    let body = null;
    try {
      body = await res.json();
    } catch (e) {
      body = null;
    }
    if (!res.ok) {
      const message = errorMessage(body, res.status);
      if (res.status === 401) signOut(message);
      throw new ApiError(res.status, message);
    }
    return body;
  }

  // The result of a Workers-AI envelope.
  async function result(path, options) {
    return (await api(path, options)).result;
  }

  function when(unixSeconds) {
    if (unixSeconds === undefined || unixSeconds === null) return "";
    return new Date(unixSeconds * 1000).toLocaleString();
  }

  function ended(progress) {
    return progress.completed + progress.failed + progress.cancelled + progress.expired;
  }

  function isOpen(batch) {
    return batch.status === "queued" || batch.status === "running";
  }

  function progressBar(progress) {
    const total = progress.total || 0;
    const done = ended(progress);
    const pct = total === 0 ? 100 : Math.floor((100 * done) / total);
    const errors = progress.failed + progress.expired + progress.cancelled > 0;
    return el(
      "div",
      {
        className: "progress",
        role: "progressbar",
        "aria-valuemin": 0,
        "aria-valuemax": 100,
        "aria-valuenow": pct,
        "aria-label": `${done} of ${total} requests ended`,
      },
      el("div", { className: "bar" },
        el("div", { className: errors ? "fill with-errors" : "fill", style: `width:${pct}%` })),
      el("span", { className: "pct" }, `${pct}%`),
    );
  }

  function statusCell(status) {
    return el("span", { className: `status-${status}` }, status);
  }

  // Runs `refresh` now and again while this view is shown: every `ms` milliseconds (a number, or
  // a function answering one; null stops).
  function every(ms, refresh) {
    const mine = generation;
    const tick = async () => {
      if (mine !== generation) return;
      try {
        await refresh();
      } catch (e) {
        if (mine === generation && e.status !== 401) showError(e.message);
      }
      const next = typeof ms === "function" ? ms() : ms;
      if (mine === generation && next !== null) timer = setTimeout(tick, next);
    };
    tick();
  }

  // Runs `refresh` once for a button (its failure shown in the banner).
  function now(refresh) {
    refresh().catch((e) => { if (e.status !== 401) showError(e.message); });
  }

  // The first `pages` pages of a list paged by cursor (`data`, `has_more`, `after` the last id).
  async function pagedList(path, pages, idOf) {
    const rows = [];
    let after = "";
    for (let i = 0; i < pages; i++) {
      const page = await result(after ? `${path}&after=${encodeURIComponent(after)}` : path);
      rows.push(...page.data);
      if (!page.has_more || page.data.length === 0) return { rows, more: false };
      after = idOf(page.data[page.data.length - 1]);
    }
    return { rows, more: true };
  }

  // ---- sign-in ----

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    operatorTab.hidden = true;
    if (message) showError(message);
    route();
  }

  function renderSignIn() {
    nav.hidden = true;
    signOutButton.hidden = true;
    const input = el("input", {
      id: "api-key", type: "password", autocomplete: "off", required: true,
      placeholder: "hr_...",
    });
    const form = el(
      "form",
      { className: "sign-in", id: "sign-in" },
      el("h1", {}, "Sign in"),
      el("label", { for: "api-key" }, "API key"),
      input,
      el("p", { className: "muted" }, "The key stays in this browser tab (session storage)."),
      el("button", { type: "submit", className: "primary" }, "Sign in"),
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY, key);
      try {
        await api("/v1/async?limit=1");
      } catch (e) {
        if (e.status !== 401) showError(e.message);
        return;
      }
      clearBanner();
      checkOperator();
      if (!location.hash || location.hash === "#/" || location.hash === "#/sign-in") {
        location.hash = "#/batches";
      } else {
        route();
      }
    });
    main.replaceChildren(form);
    input.focus();
  }

  // Shows the Operator tab when the key may read the deployment's load.
  async function checkOperator() {
    try {
      await api("/v1/operator/stats");
      operatorTab.hidden = false;
    } catch (e) {
      operatorTab.hidden = true;
    }
  }

  // ---- batches ----

  function renderBatches() {
    const body = el("tbody");
    const table = el(
      "table",
      { id: "batches" },
      head(["Batch", "Model", "Status", "Progress", "Created", "Estimated completion", "Warnings"]),
      body,
    );
    const empty = el("p", { className: "muted", hidden: true }, "No batches yet.");
    let pages = 1;
    const older = button("Show older batches", () => { pages += 1; now(refresh); },
      { id: "older-batches", hidden: true });
    main.replaceChildren(
      el("h1", {}, "Batches"), table, empty, el("div", { className: "pager" }, older));
    let open = true;
    async function refresh() {
      const list = await pagedList("/v1/async?limit=50", pages, (b) => b.request_id);
      open = list.rows.some(isOpen);
      empty.hidden = list.rows.length > 0;
      older.hidden = !list.more;
      body.replaceChildren(...list.rows.map((b) => el(
        "tr",
        {
          className: "clickable", "data-batch": b.request_id,
          onclick: () => { location.hash = `#/batch/${b.request_id}`; },
        },
        el("td", {}, el("a", { href: `#/batch/${b.request_id}`, className: "mono" }, b.request_id)),
        el("td", {}, b.model),
        el("td", {}, statusCell(b.status)),
        el("td", {}, progressBar(b.progress)),
        el("td", {}, when(b.created_at)),
        el("td", {}, isOpen(b) ? when(b.estimated_completion_at) : ""),
        el("td", {}, (b.warnings || []).map((w) => w.message || w.code).join("; ")),
      )));
    }
    // Every 2 s while a batch is open; otherwise slower, to notice new ones.
    every(() => (open ? 2000 : 10000), refresh);
  }

  // ---- one batch ----

  const PAGE = 100;

  function responseRow(batchId, r) {
    const tokens = r.result && r.result.usage
      ? `${r.result.usage.prompt_tokens} + ${r.result.usage.completion_tokens}` : "";
    const status = r.status || (r.success ? "completed" : "failed");
    return el(
      "tr",
      {
        className: "clickable", "data-request": r.id, "data-status": status,
        onclick: () => { location.hash = `#/batch/${batchId}/request/${r.id}`; },
      },
      el("td", {}, el("a", { href: `#/batch/${batchId}/request/${r.id}` }, String(r.id))),
      el("td", {}, r.external_reference || ""),
      el("td", {}, statusCell(status)),
      el("td", {}, r.error ? r.error.message : tokens),
    );
  }

  function responsesTable(id) {
    return el("table", { id }, head(["#", "custom_id", "Status", "Tokens or error"]), el("tbody"));
  }

  function renderBatch(id) {
    const summary = el("div", { className: "summary" });
    const bar = el("div");
    const actions = el("div", { className: "actions" });
    const failedTable = responsesTable("failed-requests");
    const failedNote = el("p", { className: "muted" });
    const allTable = responsesTable("all-requests");
    let from = 0;
    const pageLabel = el("span", { className: "muted" });
    const prev = button("Previous", () => { from = Math.max(0, from - PAGE); now(refresh); });
    const next = button("Next", () => { from += PAGE; now(refresh); });
    main.replaceChildren(
      el("p", {}, el("a", { href: "#/batches" }, "Batches")),
      el("h1", {}, "Batch ", el("span", { className: "mono" }, id)),
      summary, bar, actions,
      el("h2", {}, "Failed requests"), failedNote, failedTable,
      el("h2", {}, "All requests"),
      el("div", { className: "pager" }, prev, pageLabel, next),
      allTable,
    );
    let open = true;
    const base = `/v1/async/${encodeURIComponent(id)}?include=partial`;
    async function refresh() {
      const b = await result(`${base}&from=${from}&limit=${PAGE}`);
      open = isOpen(b);
      const p = b.progress;
      summary.replaceChildren(...[
        ["Status", statusCell(b.status)], ["Model", b.model],
        ["Requests", String(p.total)], ["Completed", String(p.completed)],
        ["Failed", String(p.failed)], ["Cancelled", String(p.cancelled)],
        ["Expired", String(p.expired)], ["Created", when(b.created_at)],
        ["Finished", when(b.finished_at)],
        ["Estimated completion", open ? when(b.estimated_completion_at) : ""],
      ].map(([k, v]) => el("div", {}, el("span", {}, k), v)));
      bar.replaceChildren(progressBar(p));
      const buttons = [];
      if (open) {
        buttons.push(button("Cancel", () => act("cancel"), { id: "cancel" }));
      } else if (p.failed + p.expired + p.cancelled > 0) {
        buttons.push(button("Retry failed requests", () => act("retry"), { id: "retry" }));
      }
      actions.replaceChildren(...buttons);
      const failed = await result(`${base}&status=failed,expired,cancelled&limit=${PAGE}`);
      const failedRows = failed.responses || [];
      const numFailed = p.failed + p.expired + p.cancelled;
      failedNote.textContent = failedRows.length === 0 ? "None."
        : failedRows.length < numFailed ? `The first ${failedRows.length} of ${numFailed}.` : "";
      failedNote.hidden = failedNote.textContent === "";
      failedTable.hidden = failedRows.length === 0;
      failedTable.tBodies[0].replaceChildren(...failedRows.map((r) => responseRow(id, r)));
      const rows = b.responses || [];
      allTable.tBodies[0].replaceChildren(...rows.map((r) => responseRow(id, r)));
      pageLabel.textContent =
        rows.length ? `${from} to ${from + rows.length - 1} of ${p.total}` : "";
      prev.disabled = from === 0;
      next.disabled = from + PAGE >= p.total;
    }
    async function act(what) {
      try {
        const r = await result(`/v1/async/${encodeURIComponent(id)}/${what}`,
          { method: "POST", body: {} });
        if (what === "retry") {
          showInfo(`Retrying in batch ${r.request_id}`);
          location.hash = `#/batch/${r.request_id}`;
        } else {
          showInfo("Cancelled: requests not yet started end cancelled");
          now(refresh);
        }
      } catch (e) {
        showError(e.message);
      }
    }
    every(() => (open ? 2000 : null), refresh);
  }

  // ---- one request ----

  function renderRequest(id, index) {
    main.replaceChildren(el("p", { className: "muted" }, "Loading..."));
    const mine = generation;
    (async () => {
      const b = await result(
        `/v1/async/${encodeURIComponent(id)}?include=partial&from=${index}&limit=1`);
      if (mine !== generation) return;
      const r = (b.responses || [])[0];
      if (!r || r.id !== index) throw new ApiError(404, `the batch has no request ${index}`);
      const status = r.status || (r.success ? "completed" : "failed");
      const parts = [
        el("p", {},
          el("a", { href: `#/batch/${id}` }, "Batch ", el("span", { className: "mono" }, id))),
        el("h1", {}, `Request ${index}`),
        el("div", { className: "summary" },
          el("div", {}, el("span", {}, "Status"), statusCell(status)),
          el("div", {}, el("span", {}, "custom_id"), r.external_reference || "")),
      ];
      if (r.error) {
        parts.push(el("h2", {}, "Error"),
          el("pre", { id: "request-error" }, `${r.error.code}: ${r.error.message}`));
      }
      if (r.result) {
        parts.push(el("h2", {}, "Answer"),
          el("pre", { id: "request-answer" }, r.result.response ?? ""));
        if (r.result.tool_calls) {
          parts.push(el("h2", {}, "Tool calls"),
            el("pre", {}, JSON.stringify(r.result.tool_calls, null, 2)));
        }
        if (r.result.usage) {
          parts.push(el("h2", {}, "Usage"), el("pre", {}, JSON.stringify(r.result.usage, null, 2)));
        }
      }
      parts.push(el("details", {}, el("summary", {}, "The response object"),
        el("pre", { id: "request-json" }, JSON.stringify(r, null, 2))));
      main.replaceChildren(...parts);
    })().catch((e) => { if (e.status !== 401) showError(e.message); });
  }

  // ---- webhooks ----

  function renderWebhooks() {
    const endpoints = el("tbody");
    const deliveries = el("tbody");
    let pages = 1;
    const older = button("Show older deliveries", () => { pages += 1; now(refresh); },
      { id: "older-deliveries", hidden: true });
    main.replaceChildren(
      el("h1", {}, "Webhooks"),
      el("h2", {}, "Endpoints"),
      el("table", { id: "endpoints" }, head(["Endpoint", "URL", "Events", "Enabled"]), endpoints),
      el("h2", {}, "Deliveries"),
      el("table", { id: "deliveries" },
        head(["Delivery", "Event", "Batch", "Target", "Status", "Attempts", "Last error", ""]),
        deliveries),
      el("div", { className: "pager" }, older),
    );
    async function replay(id) {
      try {
        await result(`/v1/webhooks/deliveries/${encodeURIComponent(id)}/retry`,
          { method: "POST", body: {} });
        showInfo(`Delivery ${id} replayed: it is sent again`);
        await refresh();
      } catch (e) {
        showError(e.message);
      }
    }
    async function refresh() {
      const [eps, ds] = await Promise.all([
        result("/v1/webhooks"),
        pagedList("/v1/webhooks/deliveries?limit=100", pages, (d) => d.id),
      ]);
      older.hidden = !ds.more;
      endpoints.replaceChildren(...eps.data.map((e) => el("tr", {},
        el("td", { className: "mono" }, e.id), el("td", {}, e.url),
        el("td", {}, (e.event_types || []).join(", ")),
        el("td", {}, e.enabled === false ? `no (${e.disabled_reason || ""})` : "yes"))));
      if (eps.data.length === 0) {
        endpoints.replaceChildren(emptyRow(4, "None."));
      }
      deliveries.replaceChildren(...ds.rows.map((d) => el(
        "tr",
        { "data-delivery": d.id, "data-status": d.status },
        el("td", { className: "mono" }, d.id), el("td", {}, d.event_type || ""),
        el("td", { className: "mono" }, d.batch_id || ""), el("td", {}, d.url || ""),
        el("td", {}, statusCell(d.status)), el("td", {}, String(d.attempts ?? "")),
        el("td", {},
          d.last_error || (d.last_status_code >= 300 ? `HTTP ${d.last_status_code}` : "")),
        el("td", {}, button("Replay", () => replay(d.id), { className: "replay" })),
      )));
      if (ds.rows.length === 0) deliveries.replaceChildren(emptyRow(8, "None."));
    }
    every(3000, refresh);
  }

  // ---- files ----

  function renderFiles() {
    const body = el("tbody");
    main.replaceChildren(
      el("h1", {}, "Files"),
      el("table", { id: "files" },
        head(["File", "Name", "Bytes", "Purpose", "Created", "Status"]), body),
    );
    every(5000, async () => {
      const files = await api("/v1/files");
      body.replaceChildren(...files.data.map((f) => el("tr", {},
        el("td", { className: "mono" }, f.id), el("td", {}, f.filename),
        el("td", {}, String(f.bytes)), el("td", {}, f.purpose), el("td", {}, when(f.created_at)),
        el("td", {}, f.status || ""))));
      if (files.data.length === 0) body.replaceChildren(emptyRow(6, "None."));
    });
  }

  // ---- operator ----

  // Each chart: its series from a sample.
  function chartSpecs(models) {
    return [
      { name: "tokens", title: "Tokens per second", series: [
        ["sync", (s) => s.sync_tokens_per_s], ["async", (s) => s.async_tokens_per_s]] },
      { name: "ttft", title: "Sync time to first token (ms)", series: [
        ["p50", (s) => s.sync_ttft_p50_ms], ["p99", (s) => s.sync_ttft_p99_ms]] },
      { name: "queue", title: "Queued requests", series: models.map((m) => [
        m, (s) => (s.queued || {})[m] || 0]) },
      { name: "utilization", title: "Utilization and KV use (%)", series: [
        ["utilization", (s) => 100 * s.utilization], ["KV use", (s) => 100 * s.kv_used]] },
      { name: "credits", title: "Headroom credits per second", series: [
        ["credits", (s) => s.credits_per_s]] },
    ];
  }

  const COLORS = ["#2f6fde", "#e67e22", "#1e8e4e", "#8e44ad", "#c0392b", "#16a085"];

  function renderOperator() {
    const chartsBox = el("div", { className: "charts" });
    const windowNote = el("p", { className: "muted", id: "operator-window" });
    const note = el("p", { className: "muted", hidden: true },
      "Charts are not bundled in this build: the latest numbers are shown as a table.");
    const latest = el("table", { id: "latest", hidden: true });
    const workers = el("tbody");
    main.replaceChildren(
      el("h1", {}, "Operator"),
      windowNote, note, latest, chartsBox,
      el("h2", {}, "Workers"),
      el("table", { id: "workers" }, head([
        "Worker", "Model", "Sync load", "Async running", "Utilization", "KV use", "Credits/s",
        "State"]), workers),
    );
    charts.forEach((c) => c.plot.destroy());
    charts = [];
    let modelsKey = "";
    let intervalMs = 5000;

    // The latest sample's numbers, for a build without uPlot.
    function showTable(stats, models) {
      note.hidden = false;
      latest.hidden = false;
      const last = stats.samples[stats.samples.length - 1];
      latest.replaceChildren(...chartSpecs(models).flatMap((c) => c.series.map(([label, f]) => {
        const v = last ? f(last) : null;
        const text = v === null || v === undefined ? "-" : v.toFixed(1);
        return el("tr", {}, el("th", {}, `${c.title}: ${label}`), el("td", {}, text));
      })));
    }

    // One uPlot chart per spec, made again when the models change.
    function makeCharts(models) {
      charts.forEach((c) => c.plot.destroy());
      chartsBox.replaceChildren();
      charts = chartSpecs(models).map((spec) => {
        const box = el("div", { className: "chart", "data-chart": spec.name, "data-points": 0 },
          el("h3", {}, spec.title));
        chartsBox.append(box);
        const series = spec.series.map(([label], i) => ({
          label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
        }));
        const plot = new window.uPlot({
          width: Math.max(300, box.clientWidth - 16),
          height: 200,
          series: [{}, ...series],
          axes: [{}, { size: 60 }],
          scales: { x: { time: true } },
        }, [[], ...spec.series.map(() => [])], box);
        return { spec, box, plot };
      });
    }

    function drawCharts(stats, models) {
      if (modelsKey !== models.join("\n")) {
        modelsKey = models.join("\n");
        makeCharts(models);
      }
      const xs = stats.samples.map((s) => s.t);
      for (const c of charts) {
        const ys = c.spec.series.map(([, f]) => stats.samples.map((s) => f(s) ?? null));
        c.plot.setData([xs, ...ys]);
        c.box.setAttribute("data-points", String(xs.length));
      }
    }

    async function refresh() {
      const stats = await result("/v1/operator/stats");
      intervalMs = Math.max(250, stats.interval_s * 1000);
      const minutes = Math.round(stats.window_s / 60);
      windowNote.textContent = `${stats.samples.length} samples, one every ` +
        `${stats.interval_s} s, the last ${minutes} minutes`;
      const queuedModels = stats.samples.flatMap((s) => Object.keys(s.queued || {}));
      const models = Array.from(new Set([...stats.models, ...queuedModels])).sort();
      if (typeof window.uPlot === "function") drawCharts(stats, models);
      else showTable(stats, models);
      workers.replaceChildren(...stats.workers.map((w) => el(
        "tr",
        { "data-worker": w.id },
        el("td", { className: "mono" }, w.id), el("td", {}, w.model),
        el("td", {}, `${w.sync_load} / ${w.capacity}`), el("td", {}, String(w.async_running)),
        el("td", {}, `${(100 * w.utilization).toFixed(0)}%`),
        el("td", {}, w.kv_total_blocks ? `${w.kv_used_blocks} / ${w.kv_total_blocks} blocks` : ""),
        el("td", {}, w.credits_per_s.toFixed(1)),
        el("td", {}, w.draining ? "draining" : "serving"),
      )));
      if (stats.workers.length === 0) workers.replaceChildren(emptyRow(8, "No live workers."));
    }
    every(() => intervalMs, refresh);
  }

  // ---- routing ----

  function route() {
    generation += 1;
    clearTimeout(timer);
    if (!sessionStorage.getItem(KEY)) {
      renderSignIn();
      return;
    }
    nav.hidden = false;
    signOutButton.hidden = false;
    const parts = (location.hash || "#/batches").replace(/^#\/?/, "").split("/");
    const view = parts[0] || "batches";
    for (const a of nav.querySelectorAll("a[data-view]")) {
      a.classList.toggle("active", a.dataset.view === (view === "batch" ? "batches" : view));
    }
    if (view === "batch" && parts[1] && parts[2] === "request" && /^\d+$/.test(parts[3] || "")) {
      renderRequest(decodeURIComponent(parts[1]), Number(parts[3]));
    } else if (view === "batch" && parts[1]) {
      renderBatch(decodeURIComponent(parts[1]));
    } else if (view === "webhooks") {
      renderWebhooks();
    } else if (view === "files") {
      renderFiles();
    } else if (view === "operator") {
      renderOperator();
    } else {
      renderBatches();
    }
  }

  signOutButton.addEventListener("click", () => {
    clearBanner();
    signOut();
  });
  window.addEventListener("hashchange", () => {
    clearBanner();
    route();
  });
  route();
  if (sessionStorage.getItem(KEY)) checkOperator();
})();
