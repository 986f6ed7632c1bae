// privrec dashboard: the privacy budget, from /budget and /budget/history. Plain JS and SVG; no network
// beyond this server. Figures are the server's numbers, shown as they are (a browser test compares them).
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const NS = "http://www.w3.org/2000/svg";
  const REFRESH_MS = 5000;

  // `/dashboard#token=T` with the operator token (`privrec token`): the exact figures under the add/remove relation
  // (without it the dashboard shows what is public: the guarantee, the releases and their noisy counts). Kept for
  // this tab and taken out of the address bar.
  const TOKEN_KEY = "privrec.dashboard.token";
  function takeFragmentToken() {
    const token = new URLSearchParams(window.location.hash.slice(1)).get("token");
    if (!token) return false;
    sessionStorage.setItem(TOKEN_KEY, token);
    const url = new URL(window.location.href);
    url.hash = "";
    history.replaceState(null, "", url);
    return true;
  }
  takeFragmentToken();

  async function api(path) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = { Accept: "application/json", ...(token ? { Authorization: `Bearer ${token}` } : {}) };
    const resp = await fetch(path, { headers });
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error((body.error && body.error.message) || `${path}: HTTP ${resp.status}`);
    return body;
  }

  const fmt = (x, digits = 3) => (x === null || x === undefined ? "–" : Number.isFinite(x) ? Number(x).toPrecision(digits) : "∞");

  function svgEl(name, attrs) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  // a line chart of several series [{name, color, points: [[x, y], ...]}] with axes and labels
  function lineChart(svg, series, { xLabel, yLabel, xTime = false } = {}) {
    svg.replaceChildren();
    const W = 480, H = 220, L = 48, R = 12, T = 12, B = 34;
    const pts = series.flatMap((s) => s.points);
    if (pts.length < 2) {
      svg.appendChild(Object.assign(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }),
        { textContent: "not enough releases yet" }));
      return;
    }
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = Math.max(1e-9, ...ys);
    const X = (x) => L + ((x - x0) / (x1 - x0 || 1)) * (W - L - R);
    const Y = (y) => H - B - (y / y1) * (H - T - B);
    svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    svg.appendChild(svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    for (const frac of [0, 0.5, 1]) {
      const y = y1 * frac;
      svg.appendChild(Object.assign(svgEl("text", { x: L - 4, y: Y(y) + 4, "text-anchor": "end", class: "tick" }),
        { textContent: fmt(y, 2) }));
    }
    const xText = (x) => (xTime ? new Date(x).toLocaleTimeString() : String(Math.round(x)));
    svg.appendChild(Object.assign(svgEl("text", { x: L, y: H - 8, class: "tick" }), { textContent: xText(x0) }));
    svg.appendChild(Object.assign(svgEl("text", { x: W - R, y: H - 8, "text-anchor": "end", class: "tick" }),
      { textContent: xText(x1) }));
    svg.appendChild(Object.assign(svgEl("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle", class: "tick" }),
      { textContent: xLabel || "" }));
    svg.appendChild(Object.assign(svgEl("text", { x: L + 6, y: T + 10, class: "tick" }), { textContent: yLabel || "" }));
    series.forEach((s, i) => {
      if (!s.points.length) return;
      const d = s.points.map((p, j) => `${j ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join("");
      svg.appendChild(svgEl("path", { d, fill: "none", stroke: s.color, "stroke-width": 2, class: "series" }));
      svg.appendChild(Object.assign(svgEl("text", { x: W - R - 4, y: T + 12 + 14 * i, "text-anchor": "end",
        fill: s.color, class: "tick" }), { textContent: s.name }));
    });
  }

  function histogram(svg, hist) {
    svg.replaceChildren();
    const W = 480, H = 220, L = 48, R = 12, T = 12, B = 34;
    const counts = hist ? hist.counts : [];
    if (!counts.length || counts.every((c) => c === 0)) {
      svg.appendChild(Object.assign(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }),
        { textContent: "no user has spent any budget yet" }));
      return;
    }
    const top = Math.max(...counts), bw = (W - L - R) / counts.length;
    counts.forEach((c, i) => {
      const h = (c / top) * (H - T - B);
      const bar = svgEl("rect", { x: L + i * bw + 1, y: H - B - h, width: bw - 2, height: h, class: "bar-fill",
        "data-count": c });
      bar.appendChild(Object.assign(svgEl("title"), { textContent: `${c} users with ε in [${hist.edges[i]}, ${hist.edges[i + 1]})` }));
      svg.appendChild(bar);
    });
    svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    svg.appendChild(Object.assign(svgEl("text", { x: L, y: H - 8, class: "tick" }), { textContent: "ε 0" }));
    svg.appendChild(Object.assign(svgEl("text", { x: W - R, y: H - 8, "text-anchor": "end", class: "tick" }),
      { textContent: `ε ${fmt(hist.edges[hist.edges.length - 1], 3)}` }));
    svg.appendChild(Object.assign(svgEl("text", { x: L - 4, y: T + 8, "text-anchor": "end", class: "tick" }),
      { textContent: String(top) }));
  }

  async function refresh() {
    try {
      const [b, h] = await Promise.all([api("/budget"), api("/budget/history")]);
      $("error").hidden = true;
      const p = b.privacy || {}, led = b.ledger || null;
      // the server's statement of the guarantee (models.accounting.statement.render), not words of the dashboard's
      let note = p.statement || (p.private ? "" : "No noise: nothing is protected (ε = ∞).");
      $("fig-releases").textContent = String(b.releases);
      $("fig-acl").textContent = b.redis_acl ? (b.redis_acl.enforced ? "yes" : "NO (--no-acl)") : "–";
      $("fig-eps-cap").textContent = p.private ? fmt(p.epsilon) : "∞ (no noise)";
      if (led) {
        $("fig-users").textContent = String(led.users);
        $("fig-at-cap").textContent = String(led.users_at_cap);
        $("fig-cap").textContent = String(led.cap);
        $("fig-spent-max").textContent = fmt(led.spent_max);
        $("fig-spent-median").textContent = fmt(led.spent_median);
        $("fig-capped").textContent = String(led.capped_events);
        $("fig-at-budget").textContent = led.user_budget === null ? "– (no budget)" :
          `${led.users_at_budget} (ε = ${fmt(led.user_budget)})`;
        $("fig-budget-events").textContent = String(led.budget_events);
      } else {
        for (const id of ["fig-users", "fig-at-cap", "fig-cap", "fig-spent-max", "fig-spent-median", "fig-capped",
                          "fig-at-budget", "fig-budget-events"]) {
          $(id).textContent = "–";
        }
        if (p.relation === "add-remove") {  // who took part is protected: the per-user figures are the operator's
          note += " Who took part, the users at the cap and the spent budgets are the operator's figures: open " +
            "this page as /dashboard#token=<the operator token> (privrec token) to see them.";
        }
      }
      $("dash-note").textContent = note;
      const hist = h.history || [];
      const withLedger = hist.filter((e) => e.ledger);
      lineChart($("chart-spent"), [
        { name: "largest", color: "#b3261e", points: withLedger.filter((e) => e.ledger.spent_max !== null).map((e) => [e.at_ms, e.ledger.spent_max]) },
        { name: "median", color: "#3d5afe", points: withLedger.filter((e) => e.ledger.spent_median !== null).map((e) => [e.at_ms, e.ledger.spent_median]) },
      ], { xLabel: "time", yLabel: "ε", xTime: true });
      lineChart($("chart-releases"), [{ name: "release version", color: "#0f8a5f", points: hist.map((e) => [e.at_ms, e.version]) }],
        { xLabel: "time", yLabel: "releases", xTime: true });
      histogram($("chart-hist"), led && led.spent_histogram);
      lineChart($("chart-at-cap"), [{ name: "users at the cap", color: "#a05f00",
        points: withLedger.map((e) => [e.at_ms, e.ledger.users_at_cap || 0]) }], { xLabel: "time", yLabel: "users", xTime: true });
      document.body.dataset.loaded = "true";
    } catch (err) {
      $("error").hidden = false;
      $("error-message").textContent = String(err.message || err);
    }
  }

  refresh();
  setInterval(refresh, REFRESH_MS);
  // a link with a token opened on this very page is a fragment change, not a new page: take its token too
  window.addEventListener("hashchange", () => { if (takeFragmentToken()) refresh(); });
})();
