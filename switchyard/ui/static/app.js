// The page: log in when the gateway has an admin key, then three tabs. The dashboard polls
// /ui/api/live once a second while it is shown.
"use strict";

const $ = (sel) => document.querySelector(sel);
const esc = Charts.esc;
const fmt = (v, d = 1) => (v === null || v === undefined ? "–" : (+v).toFixed(d));
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });
const usd = (v) => (v === null || v === undefined ? "–" : `$${v < 0.01 && v > -0.01 ? (+v).toPrecision(3) : (+v).toFixed(2)}`);
const count = (n) => (n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e4 ? `${(n / 1e3).toFixed(1)}k` : `${n}`);

class Unauthorized extends Error {}

async function call(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  };
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store", ...opts });
  if (r.status === 401) { showLogin(); throw new Unauthorized(); }
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  return { status: r.status, data };
}

// --- login ---------------------------------------------------------------------------------

let authMode = "open";

function showLogin(msg) {
  $("#app").hidden = true;
  $("#tabs").hidden = true;
  $("#logout").hidden = true;
  $("#login").hidden = false;
  if (msg) $("#login-error").textContent = msg;
  $("#admin-key").focus();
}

async function boot() {
  const { data } = await call("/ui/api/session");
  if (data.auth === "locked") {
    document.body.insertAdjacentHTML("beforeend", `<div class="card narrow error">API keys are on and this gateway has
      no admin key: the UI stays locked. Serve with <code>--admin-key</code> to use it.</div>`);
    return;
  }
  authMode = data.auth;
  if (!data.ok) { showLogin(); return; }
  start();
}

$("#login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const r = await fetch("/ui/api/login", {
    method: "POST", headers: { "content-type": "application/json" }, credentials: "same-origin",
    body: JSON.stringify({ key: $("#admin-key").value }),
  });
  if (!r.ok) { $("#login-error").textContent = "wrong admin key"; return; }
  $("#admin-key").value = "";
  $("#login-error").textContent = "";
  start();
});

$("#logout").addEventListener("click", async () => {
  await fetch("/ui/api/logout", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  showLogin();
});

// --- tabs ----------------------------------------------------------------------------------

let started = false;
function start() {
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#tabs").hidden = false;
  $("#logout").hidden = authMode !== "admin";
  if (!started) {
    started = true;
    window.addEventListener("hashchange", showTab);
  }
  showTab();
}

function showTab() {
  const tab = (location.hash || "#dashboard").slice(1);
  for (const s of document.querySelectorAll(".tab")) s.hidden = s.id !== `tab-${tab}`;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === tab);
  if (tab === "dashboard") Dashboard.tick();
  if (tab === "policies") Policies.load();
  if (tab === "replay") Replay.load();
}

// --- dashboard -----------------------------------------------------------------------------

const Dashboard = (() => {
  let timer = null, busy = false;

  function windowSel() { return $("#window").value; }

  async function tick() {
    clearTimeout(timer);
    if ($("#tab-dashboard").hidden || $("#app").hidden) return;
    if (!busy) {
      busy = true;
      try {
        const w = windowSel();
        const { status, data } = await call(`/ui/api/live?window=${w === "total" ? 300 : w}`);
        if (status === 200) { render(data); $("#conn").textContent = `updated ${clock(data.now)}`; }
      } catch (e) {
        if (e instanceof Unauthorized) return;
        $("#conn").textContent = "gateway unreachable";
      } finally { busy = false; }
    }
    timer = setTimeout(tick, 1000);
  }

  function badge(text, cls) { return `<span class="badge ${esc(cls || text)}">${esc(text)}</span>`; }

  function tokens(p) {
    const t = windowSel() === "total" ? p.tokens : p.tokens_window;
    const cost = windowSel() === "total" ? p.cost_usd : p.cost_window_usd;
    return `<span class="stat" data-tokens="${t.prompt}/${t.completion}/${t.cached}" title="prompt (cached) / completion">
        tokens <b>${count(t.prompt)}${t.cached ? ` (${count(t.cached)})` : ""} / ${count(t.completion)}</b></span>
      ${p.price ? `<span class="stat" title="at ${p.price.prompt} / ${p.price.completion} USD per million tokens">cost
        <b class="cost" data-usd="${cost}">${usd(cost)}</b></span>` : ""}`;
  }

  function costLine(lp) {
    const c = windowSel() === "total" ? lp.cost.total : lp.cost.window;
    if (!c) return "";
    const when = windowSel() === "total" ? "since start" : `in the last ${windowSel() === "60" ? "minute" : "5 minutes"}`;
    return `<div class="cost-line" data-cost-policy="${esc(lp.name)}" data-spent="${c.spent_usd}" data-baseline="${c.baseline_usd}"
        data-saved="${c.saved_usd}">${when}: spent <b>${usd(c.spent_usd)}</b> · ${esc(c.baseline_pool)}-only would have cost
        <b>${usd(c.baseline_usd)}</b> · routing saved <b class="${c.saved_usd >= 0 ? "ok" : "error"}">${usd(c.saved_usd)}</b>
        ${c.saved_pct !== null ? `(${fmt(c.saved_pct)}%)` : ""}</div>`;
  }

  function engine(r) {  // least_load pools: the replica's own reading (running/waiting, KV cache)
    const e = r.engine;
    if (!e) return "";
    if (e.running === undefined) return `<td class="num error" title="${esc(e.error || "")}">?</td>`;
    return `<td class="num" data-engine-running="${e.running}" title="read ${fmt(e.age_s, 1)} s ago by ${esc(e.read_by)}${
      e.error ? "; last error: " + esc(e.error) : ""}">${e.running}/${e.waiting}${e.kv_usage !== null ? ` · ${fmt(e.kv_usage * 100, 0)}%` : ""}</td>`;
  }

  function pool(p) {
    const engines = p.strategy === "least_load";
    const reps = p.replicas.map((r) => `
      <tr data-replica="${esc(r.name)}" data-state="${esc(r.state)}" class="${r.state === "healthy" ? "" : "down"}">
        <td>${esc(r.name)}</td><td class="state">${badge(r.state)}</td><td>${badge(r.circuit)}</td>
        <td class="num">${r.inflight}${r.remote_inflight ? ` +${r.remote_inflight}` : ""}</td>
        ${engines ? engine(r) || "<td></td>" : ""}
        <td class="num">${fmt(r.rps)}</td><td class="num count">${r.count}</td>
        <td class="num">${fmt(r.p50_ms)}</td><td class="num">${fmt(r.p99_ms)}</td><td class="num">${fmt(r.ewma_ms)}</td>
        <td class="num">${r.failures}</td>
      </tr>${r.health_error || r.circuit_error ? `<tr class="err"><td></td><td colspan="${engines ? 10 : 9}" class="why error">
        ${esc(r.health_error || r.circuit_error)}</td></tr>` : ""}`).join("");
    return `
    <div class="pool" data-pool="${esc(p.key)}" data-count="${p.count}" style="--c:${Charts.color(p.key)}">
      <div class="pool-head">
        <span class="name">${esc(p.name)}</span>
        <span class="muted">${esc(p.model)} · ${esc(p.strategy)}</span>
        <span class="stat">requests <b class="count">${p.count}</b></span>
        <span class="stat">req/s <b>${fmt(p.rps)}</b></span>
        <span class="stat">p50/p99 ms <b>${fmt(p.p50_ms)} / ${fmt(p.p99_ms)}</b></span>
        <span class="stat">queue <b>${p.queued}</b></span>
        <span class="stat">healthy <b class="healthy-count">${p.healthy}/${p.total}</b></span>
        ${tokens(p)}
        ${p.errors ? `<span class="stat error">5xx <b>${p.errors}</b></span>` : ""}
      </div>
      <table class="grid replicas">
        <thead><tr><th>replica</th><th>state</th><th>circuit</th><th class="num">in flight</th>
          ${engines ? `<th class="num" title="the engine's own running/waiting requests and KV-cache use">engine</th>` : ""}<th class="num">req/s</th>
          <th class="num">requests</th><th class="num">p50 ms</th><th class="num">p99 ms</th><th class="num">ewma ms</th>
          <th class="num">failures</th></tr></thead>
        <tbody>${reps}</tbody>
      </table>
    </div>`;
  }

  function render(d) {
    const totalReq = d.policies.reduce((s, lp) => s + lp.pools.reduce((a, p) => a + p.count, 0), 0);
    const rps = d.policies.reduce((s, lp) => s + lp.pools.reduce((a, p) => a + p.rps, 0), 0);
    const down = d.policies.flatMap((lp) => lp.pools.flatMap((p) => p.replicas)).filter((r) => r.state !== "healthy").length;
    $("#summary").innerHTML = [
      ["status", badge(d.status, d.status === "ok" ? "ok" : "bad")], ["requests", totalReq], ["req/s", fmt(rps)],
      ["replicas down", down], ["rejected", d.rejected], ["up", `${Math.round(d.uptime_s)} s`],
    ].map(([k, v]) => `<div class="kv"><span class="muted">${k}</span><b>${v}</b></div>`).join("");

    $("#policies-live").innerHTML = d.policies.map((lp) => `
      <div class="policy" data-policy="${esc(lp.name)}">
        <div class="policy-head"><h2>policy ${esc(lp.name)}</h2>
          <span class="muted">${esc(lp.file)} · classifier ${esc(lp.classifier)}</span>
          ${lp.last_reload && !lp.last_reload.ok ? `<span class="error">last edit rejected: ${esc(lp.last_reload.error)}</span>` : ""}
        </div>
        ${costLine(lp)}
        <div class="pools">${lp.pools.map(pool).join("")}</div>
      </div>`).join("");

    Charts.line($("#chart-pools"), d.series.t, d.series.pools, 300, $("#legend-pools"));
    Charts.line($("#chart-rules"), d.series.t, d.series.rules, 300, $("#legend-rules"));
    const split = windowSel() === "total" ? d.split.total : d.split.window;
    Charts.bars($("#split-pools"), split.pools, "data-split-pool");
    Charts.bars($("#split-rules"), split.rules, "data-split-rule");

    const fo = Object.entries(d.fail_open.total);
    $("#classifier").innerHTML = (d.classifier.length ? `<table class="grid"><thead><tr><th>kind</th>
        <th class="num">calls</th><th class="num">in window</th><th class="num">p50 ms</th><th class="num">p99 ms</th></tr></thead>
        <tbody>${d.classifier.map((c) => `<tr><td>${esc(c.kind)}</td><td class="num">${c.count}</td><td class="num">${c.window}</td>
        <td class="num">${fmt(c.p50_ms, 3)}</td><td class="num">${fmt(c.p99_ms, 3)}</td></tr>`).join("")}</tbody></table>`
        : `<span class="muted">no classifier calls yet</span>`) +
      `<h4>fail-opens</h4>` + (fo.length ? fo.map(([p, n]) =>
        `<div>${esc(p)}: <b>${n}</b> <span class="muted">(${d.fail_open.window[p] || 0} in window)</span></div>`).join("")
        : `<span class="muted">none</span>`);

    $("#recent tbody").innerHTML = d.recent.map((e) => `
      <tr data-pool="${esc(e.pool)}"><td>${clock(e.t)}</td><td>${esc(e.policy)}</td><td>${esc(e.rule)}</td>
        <td>${esc(e.pool)}${e.pool !== e.routed_pool ? ` <span class="muted">(fallback from ${esc(e.routed_pool)})</span>` : ""}</td>
        <td>${esc(e.replica)}</td>
        <td>${e.label ? `${esc(e.label)} ${fmt(e.confidence, 2)} <span class="muted">${esc(e.classifier)}</span>` : "–"}</td>
        <td>${e.status >= 400 ? badge(e.status, "bad") : e.status}</td>
        <td class="num">${fmt(e.latency_ms)}</td><td class="num">${fmt(e.overhead_ms, 3)}</td>
        <td class="why" title="${esc(e.session ? "session " + e.session : "")}">${esc(e.reason)}</td></tr>`).join("");
  }

  $("#window").addEventListener("change", tick);
  return { tick };
})();

// --- policies ------------------------------------------------------------------------------

const Policies = (() => {
  const editor = new PolicyEditor($("#policy-text"), $("#hl"), $("#gutter"), $("#complete"), $("#key-hint"));
  let policies = [], current = null, seq = 0, timer = null, loaded = false;

  $("#preview-request").value = JSON.stringify({
    model: "auto", messages: [{ role: "user", content: "a hard problem: plan the migration" }],
  }, null, 2);

  async function load() {
    if (!editor.hints) {
      const { status, data } = await call("/ui/api/schema");
      if (status === 200) editor.hints = data;
    }
    const { data } = await call("/ui/api/policies");
    policies = data.policies;
    const sel = $("#policy-select");
    sel.innerHTML = policies.map((p) => `<option value="${esc(p.name)}">${esc(p.name)}</option>`).join("");
    if (!current || !policies.some((p) => p.name === current)) current = policies.length ? policies[0].name : null;
    sel.value = current;
    if (!loaded) { show(current, true); loaded = true; } else show(current, false);
  }

  function show(name, resetText) {
    const p = policies.find((x) => x.name === name);
    if (!p) return;
    current = name;
    $("#policy-file").textContent = p.file;
    const st = p.last_reload;
    $("#policy-reload").innerHTML = st ? (st.ok ? `running since ${clock(st.at)}`
      : `<span class="error">last edit of the file rejected at ${clock(st.at)}; the previous policy serves</span>`) : "";
    if (resetText) { editor.value = p.text; validate(); }
  }

  $("#policy-select").addEventListener("change", (e) => { show(e.target.value, true); });
  $("#revert").addEventListener("click", async () => { await load(); show(current, true); $("#apply-result").textContent = ""; });

  function renderIssues(issues, summary) {
    editor.setIssues(issues);
    $("#issues").innerHTML = issues.map((i) =>
      `<li data-line="${i.line}">line ${i.line}: ${esc(i.reason)}</li>`).join("");
    for (const li of document.querySelectorAll("#issues li")) li.addEventListener("click", () => editor.goto(+li.dataset.line));
    const v = $("#validity");
    if (issues.length) {
      v.className = "validity bad";
      v.textContent = `✗ ${issues.length} problem${issues.length > 1 ? "s" : ""}: this text would be refused`;
    } else if (summary) {
      v.className = "validity ok";
      v.textContent = `✓ valid: pools ${summary.pools.join(", ")}; routes ${summary.routes.join(", ")}`;
    }
  }

  async function validate() {
    const mine = ++seq;
    const { status, data } = await call("/ui/api/policies/validate", { name: current, text: editor.value });
    if (mine !== seq || status !== 200) return;
    renderIssues(data.issues, data.summary);
  }

  editor.onchange = () => {
    clearTimeout(timer);
    $("#apply-result").textContent = "";
    $("#validity").className = "validity";
    $("#validity").textContent = "checking…";
    timer = setTimeout(validate, 250);
  };

  $("#apply").addEventListener("click", async () => {
    const out = $("#apply-result");
    $("#apply").disabled = true;
    try {
      const { status, data } = await call("/ui/api/policies/apply", { name: current, text: editor.value });
      out.className = `result ${status === 200 ? "ok" : "bad"}`;
      out.textContent = data && data.message ? data.message : `apply failed (HTTP ${status})`;
      if (status === 200) {
        current = data.policy;
        renderIssues([], null);
        await load();
      } else if (data && data.issues) renderIssues(data.issues, null);
    } finally { $("#apply").disabled = false; }
  });

  function decisionCard(title, d) {
    if (!d) return "";
    const trace = d.trace.map((t) => `<tr class="${t.match ? "hit" : ""}"><td>${t.match ? "MATCH" : "no"}</td>
      <td>${esc(t.rule)}</td><td>${esc(t.when)}</td></tr>`).join("");
    return `<div class="card" data-decision="${title}"><h4>${title}</h4>
      <div>pool <b class="d-pool">${esc(d.pool)}</b> · rule <b class="d-rule">${esc(d.rule)}</b></div>
      <div class="muted">${esc(d.reason)}</div>
      <div>label ${d.label ? `${esc(d.label)} ${fmt(d.confidence, 3)} (${esc(d.classifier)})` : "–"}
        ${d.classifier_error ? `<span class="error">classifier failed: ${esc(d.classifier_error)}</span>` : ""}</div>
      ${d.fallbacks.length ? `<div>fallbacks ${d.fallbacks.map(esc).join(", ")}</div>` : ""}
      ${d.replicas ? `<div>replicas ${d.replicas.map((r) => `${esc(r.name)} ${esc(r.state)}`).join(", ")}</div>` : ""}
      <table class="grid trace">${trace}</table></div>`;
  }

  $("#preview").addEventListener("click", async () => {
    const out = $("#preview-out");
    let req;
    try { req = JSON.parse($("#preview-request").value); } catch (e) {
      out.innerHTML = `<p class="error">request body: ${esc(e.message)}</p>`; return;
    }
    const headers = {};
    for (const l of $("#preview-headers").value.split("\n")) {
      const i = l.indexOf(":");
      if (i > 0) headers[l.slice(0, i).trim()] = l.slice(i + 1).trim();
    }
    const { status, data } = await call("/ui/api/policies/preview",
      { name: current, text: editor.value, request: req, headers });
    if (status !== 200) { out.innerHTML = `<p class="error">${esc(data?.error?.message || "HTTP " + status)}</p>`; return; }
    const f = data.features;
    out.innerHTML = `<p class="muted">features: tools ${f.tools} · turns ${f.turns} · messages ${f.messages} ·
        prompt tokens ~${f.prompt_tokens} · model ${esc(f.model)}</p>` +
      (data.issues.length ? `<p class="error">the edited text has problems: showing the running policy only</p>` : "") +
      `<div class="decision">${decisionCard("edited", data.edited)}${decisionCard("running", data.running)}</div>`;
  });

  return { load };
})();

// --- replay reports ------------------------------------------------------------------------

const Replay = (() => {
  let chosen = null;

  async function load() {
    const { data } = await call("/ui/api/reports");
    const el = $("#reports");
    if (!data.dir) {
      el.innerHTML = `<div class="card muted">No reports folder: serve with <code>--reports DIR</code>, where
        <code>switchyard replay --out DIR/NAME</code> writes its reports.</div>`;
      return;
    }
    if (!data.reports.length) {
      el.innerHTML = `<div class="card muted">No reports in ${esc(data.dir)} yet.</div>`;
      return;
    }
    el.innerHTML = data.reports.map((r) => `
      <div class="card report" data-report="${esc(r.id)}">
        <b>${esc(r.name)}</b> <span class="muted">${new Date(r.mtime * 1000).toLocaleString()}</span>
        ${r.runs.map((run) => `<div>${esc(run.name)} <span class="muted">${esc(run.mode)}</span>:
          ${run.cases ?? "–"} cases${run.score !== null && run.score !== undefined ? `, score ${fmt(run.score)}` : ""}${
          run.large_share !== null && run.large_share !== undefined ? `, large ${fmt(run.large_share * 100)}%` : ""}${
          run.cost_usd !== null && run.cost_usd !== undefined ? `, cost ${usd(run.cost_usd)}` : ""}${
          run.saved_pct !== null && run.saved_pct !== undefined ? `, saved ${fmt(run.saved_pct)}% vs large-only` : ""}</div>`).join("")}
      </div>`).join("");
    for (const c of el.querySelectorAll(".report")) c.addEventListener("click", () => open(c.dataset.report));
    open(chosen && data.reports.some((r) => r.id === chosen) ? chosen : data.reports[0].id);
  }

  function open(id) {
    chosen = id;
    for (const c of document.querySelectorAll(".report")) c.classList.toggle("sel", c.dataset.report === id);
    const src = `/ui/reports/${encodeURIComponent(id)}/report.html`;
    if ($("#report-frame").getAttribute("src") !== src) $("#report-frame").setAttribute("src", src);
  }

  return { load };
})();

boot();
