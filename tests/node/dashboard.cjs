// The dashboard in headless Chromium (playwright-core), against a running headroom serve:
//   node dashboard.cjs NODE_MODULES BASE_URL OPERATOR_KEY TENANT_KEY SCREENSHOT_DIR
// Signs in (a wrong key first), watches a batch with a failing request reach 100%, opens the
// failed request, replays a webhook delivery, lists files, watches the operator's charts move
// under load, checks that a tenant's key gets no operator tab, and renders /docs. Fails on any
// console error or page error and on any request that leaves the server's origin.
"use strict";

const http = require("http");
const path = require("path");
const { chromium } = require(path.join(process.argv[2], "playwright-core"));

const [base, operatorKey, tenantKey, shots] = process.argv.slice(3);
const origin = new URL(base).origin;
const model = "@hr/tiny-reverse";
const problems = [];

function check(ok, message) {
  if (!ok) throw new Error(message);
}

async function call(method, route, key, body) {
  const res = await fetch(base + route, {
    method,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch (e) {
    json = null;
  }
  return { status: res.status, json, text };
}

// A webhook target on loopback that counts deliveries by batch.
function startReceiver() {
  const seen = [];
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => { body += c; });
    req.on("end", () => {
      try {
        seen.push({ id: req.headers["webhook-id"], event: JSON.parse(body) });
      } catch (e) {
        seen.push({ id: req.headers["webhook-id"], event: null });
      }
      res.writeHead(200).end("ok");
    });
  });
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => resolve({ server, seen, port: server.address().port }));
  });
}

async function until(what, fn, ms = 60000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

// The refusals the page expects, which the browser logs as errors: the wrong key at sign-in
// (401) and a tenant's key on the operator's route (403).
function expectedRefusal(msg) {
  const m = /the server responded with a status of (\d+)/.exec(msg.text());
  if (!m) return false;
  const route = new URL(msg.location().url || base).pathname;
  return (m[1] === "401" && route === "/v1/async") ||
    (m[1] === "403" && route === "/v1/operator/stats");
}

function watch(page, name) {
  page.on("console", (msg) => {
    if (msg.type() !== "error" || expectedRefusal(msg)) return;
    problems.push(`${name} console error: ${msg.text()} (${msg.location().url || ""})`);
  });
  page.on("pageerror", (e) => problems.push(`${name} page error: ${e.message}`));
  page.on("request", (req) => {
    const url = req.url();
    if (url.startsWith("data:")) return;
    if (new URL(url).origin !== origin) {
      problems.push(`${name} requested ${url} (not the server's origin)`);
    }
  });
}

async function signIn(page, key) {
  await page.fill("#api-key", key);
  await page.click("#sign-in button[type=submit]");
}

async function main() {
  const receiver = await startReceiver();
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  const load = { on: false, loops: [] };
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    watch(page, "operator page");

    // No key: the sign-in form, not a blank page.
    await page.goto(`${base}/dashboard`);
    await page.waitForSelector("#sign-in", { state: "visible" });
    check(await page.isHidden("#nav"), "no navigation before signing in");
    await page.screenshot({ path: `${shots}/sign-in.png` });
    await signIn(page, "not-a-key-0123456789");
    await page.waitForSelector("#banner:not([hidden])");
    const refused = await page.textContent("#banner");
    check(/invalid API key/.test(refused), `a wrong key's error is shown: ${refused}`);
    check(await page.isVisible("#sign-in"), "a wrong key leaves the sign-in form");

    // A batch with one request that fails on the worker (its prompt is longer than the model's
    // context), and a webhook.
    const requests = [];
    for (let i = 0; i < 120; i++) {
      requests.push({ prompt: `reverse: request ${i}`, max_tokens: 16 });
    }
    requests[37] = { prompt: `reverse: ${"abcdefgh ".repeat(30)}` };
    const hook = `http://127.0.0.1:${receiver.port}/hook`;
    const submitted = await call("POST", `/ai/run/${model}?queueRequest=true`, operatorKey,
      { requests, webhook_url: hook });
    check(submitted.status === 200, `submit: ${submitted.status} ${submitted.text}`);
    const batch = submitted.json.result.request_id;

    await signIn(page, operatorKey);
    await page.waitForSelector("#batches");
    const bar = `tr[data-batch="${batch}"] [role=progressbar]`;
    await page.waitForSelector(bar);
    // On a loaded machine (the suite runs tests side by side) the batch may take a while; on a
    // timeout, the API's view of the batch tells a slow or stuck queue from a page that missed it.
    await until("the batch's progress bar at 100%", async () =>
      (await page.getAttribute(bar, "aria-valuenow")) === "100", 180000).catch(async (e) => {
      const seen = await call("GET", `/v1/async/${batch}`, operatorKey);
      throw new Error(`${e.message}; the page's bar: ` +
        `${await page.getAttribute(bar, "aria-valuenow")}; the API: ${seen.text.slice(0, 600)}`);
    });
    check((await page.textContent(`${bar} .pct`)) === "100%", "the bar says 100%");
    await page.screenshot({ path: `${shots}/batches.png` });

    // The batch: its failed request first; then that request's error.
    await page.click(`tr[data-batch="${batch}"] a`);
    await page.waitForSelector("#failed-requests tbody tr[data-request]");
    const failedRows = await page.$$eval("#failed-requests tbody tr[data-request]",
      (rows) => rows.map((r) => [r.dataset.request, r.dataset.status]));
    check(failedRows.length === 1 && failedRows[0][0] === "37" && failedRows[0][1] === "failed",
      `the failed requests list request 37 alone: ${JSON.stringify(failedRows)}`);
    const headings = await page.$$eval("main h2", (hs) => hs.map((h) => h.textContent));
    check(headings.indexOf("Failed requests") < headings.indexOf("All requests"),
      "failed requests come first");
    check((await page.$$("#all-requests tbody tr[data-request]")).length === 100,
      "all requests, a page of 100");
    check(await page.isVisible("#retry"), "an ended batch with a failure offers Retry");
    check(!(await page.isVisible("#cancel")), "an ended batch offers no Cancel");
    await page.screenshot({ path: `${shots}/batch.png` });
    await page.click('#failed-requests tbody tr[data-request="37"] a');
    await page.waitForSelector("#request-error");
    const error = await page.textContent("#request-error");
    check(/context/.test(error), `the request's error is shown: ${error}`);
    await page.screenshot({ path: `${shots}/request.png` });

    // Webhooks: the batch's completion event, delivered, then replayed from the page: the
    // receiver gets it a second time (the same webhook-id, the event's id).
    const completion = await until("the batch's batch.completed webhook", async () =>
      receiver.seen.find((d) => d.event && d.event.type === "batch.completed" &&
        d.event.data && d.event.data.id === batch));
    const received = () => receiver.seen.filter((d) => d.id === completion.id).length;
    check(received() === 1, `batch.completed received once before the replay (${received()})`);
    await page.click('nav a[data-view="webhooks"]');
    await page.waitForSelector("#deliveries tbody tr[data-delivery]");
    const row = await until("the delivery listed as delivered", async () => {
      await page.waitForTimeout(300);
      const rows = await page.$$eval("#deliveries tbody tr[data-delivery]", (rs) =>
        rs.map((r) => ({ id: r.dataset.delivery, status: r.dataset.status, text: r.textContent })));
      return rows.find((r) => r.text.includes(batch) && r.text.includes("batch.completed") &&
        r.status === "delivered");
    });
    await page.click(`#deliveries tr[data-delivery="${row.id}"] button.replay`);
    await page.waitForSelector("#banner.info:not([hidden])");
    check(/replayed/.test(await page.textContent("#banner")), "the replay is confirmed");
    await until("the replayed delivery", async () => received() === 2, 30000);
    await page.screenshot({ path: `${shots}/webhooks.png` });

    // Files.
    const form = new FormData();
    form.append("purpose", "batch");
    const line = JSON.stringify({ custom_id: "a", method: "POST", url: "/v1/chat/completions",
      body: { model, messages: [{ role: "user", content: "reverse: x" }] } });
    form.append("file", new Blob([line + "\n"]), "dashboard-input.jsonl");
    const uploaded = await fetch(`${base}/v1/files`, {
      method: "POST", headers: { Authorization: `Bearer ${operatorKey}` }, body: form });
    check(uploaded.status === 200, `upload: ${uploaded.status}`);
    await page.click('nav a[data-view="files"]');
    await until("the file listed", async () =>
      ((await page.textContent("#files").catch(() => "")) || "").includes("dashboard-input.jsonl"));

    // The operator's view while batches and sync calls run.
    await page.waitForSelector("#operator-tab:not([hidden])");
    load.on = true;
    load.loops.push((async () => {
      while (load.on) {
        const many = [];
        for (let i = 0; i < 300; i++) many.push({ prompt: `reverse: load ${i}`, max_tokens: 24 });
        await call("POST", `/ai/run/${model}?queueRequest=true`, operatorKey, { requests: many });
        await new Promise((r) => setTimeout(r, 300));
      }
    })());
    load.loops.push((async () => {
      while (load.on) {
        await call("POST", "/v1/chat/completions", operatorKey,
          { model, messages: [{ role: "user", content: "reverse: hello there" }], max_tokens: 16 });
      }
    })());
    await page.click("#operator-tab");
    await page.waitForSelector('[data-chart="tokens"] canvas');
    const points = async () =>
      Number(await page.getAttribute('[data-chart="tokens"]', "data-points"));
    const first = await points();
    await until("the charts to move", async () => (await points()) >= first + 4, 20000);
    check((await page.$$("[data-chart] canvas")).length >= 5, "five charts drawn");
    const stats = (await call("GET", "/v1/operator/stats", operatorKey)).json.result;
    check(stats.samples.some((s) => s.async_tokens_per_s > 0), "async tokens/s seen under load");
    check(stats.samples.some((s) => s.sync_tokens_per_s > 0), "sync tokens/s seen under load");
    check(stats.samples.some((s) => s.sync_ttft_p50_ms !== null), "a sync TTFT percentile seen");
    await page.waitForSelector("#workers tbody tr[data-worker]");
    await page.waitForTimeout(1500);
    await page.screenshot({ path: `${shots}/operator.png`, fullPage: true });
    load.on = false;
    await Promise.all(load.loops);

    // Signing out shows the sign-in form again.
    await page.click("#sign-out");
    await page.waitForSelector("#sign-in", { state: "visible" });

    // A tenant's key: no operator tab.
    const tenant = await context.newPage();
    watch(tenant, "tenant page");
    await tenant.goto(`${base}/dashboard`);
    await signIn(tenant, tenantKey);
    await tenant.waitForSelector("#batches");
    await tenant.waitForTimeout(1000);
    check(await tenant.isHidden("#operator-tab"), "a tenant's key shows no operator tab");

    // The API reference.
    const docs = await context.newPage();
    watch(docs, "docs page");
    await docs.goto(`${base}/docs`);
    await docs.waitForSelector(".swagger-ui .info .title", { timeout: 30000 });
    const title = await docs.textContent(".swagger-ui .info .title");
    check(/Headroom API/.test(title), `the reference's title: ${title}`);
    await docs.waitForSelector(".opblock-summary-path");
    check((await docs.$$(".opblock")).length >= 30, "the reference lists the operations");
    await docs.screenshot({ path: `${shots}/docs.png` });
  } finally {
    load.on = false;
    await Promise.all(load.loops).catch(() => {});
    await browser.close();
    receiver.server.close();
  }
  if (problems.length) throw new Error(problems.join("\n"));
  const names = ["sign-in", "batches", "batch", "request", "webhooks", "operator", "docs"];
  console.log(`dashboard: ok; screenshots ${names.map((n) => `${shots}/${n}.png`).join(" ")}`);
}

main().catch((e) => {
  console.error(`dashboard: ${e.message}${problems.length ? `\n${problems.join("\n")}` : ""}`);
  process.exit(1);
});
