// privrec web page: choose a user, see the top-k with the UCB score split into
// estimate + exploration bonus, give feedback, watch the model learn, see the
// privacy budget. Plain JS, no build step, no network beyond this server.
//
// The loop after a click: POST /feedback -> poll /healthz (cheap: one Redis read)
// until the served model version passes the version the list was ranked with ->
// fetch one new /recommend and /budget. /recommend is not polled itself:
// every /recommend is a shown list, logged to the `recommendations` topic.
// When the answer says the model will not learn from it (`learning.learned` false: the user is
// at the contribution cap of this epoch, or at their lifetime budget; or a 403 of cap_policy =
// reject), nothing is waited for: the page says so and the user can go on at once.
//
// A user's own figures (/budget?user=U: their interactions and privacy loss) are sent only with U's token or
// the operator's (docs/serving.md, "Who can read per-user views"). The page gets tokens two ways: POST /session
// (when /users says the catalog takes new users) makes a new user of its own with its token, and a link
// `/?user=U#token=T` from the operator (`privrec token --user U`) carries U's token in the fragment, which the
// browser never sends to a server. Without a token the panel shows the public guarantee only.
"use strict";

(() => {
  const POLL_MS = 200;            // /healthz poll while learning
  const LEARN_TIMEOUT_MS = 15000; // then show the list anyway, and say so
  const IDLE_POLL_MS = 4000;      // background refresh of the version badge and the budget

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs = {}, ...children) => {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") n.className = v;
      else if (k === "text") n.textContent = v;
      else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "type" || k === "title")
        n.setAttribute(k, v);
      else n[k] = v;
    }
    for (const c of children) if (c != null) n.append(c);
    return n;
  };

  const state = {
    user: null,
    k: 8,
    rec: null,            // last /recommend response shown
    ranks: new Map(),     // item -> rank in the list shown before the current one
    version: null,        // latest served model version known to the page
    learning: null,       // {since, fromVersion, item, reward} while waiting for the model
    budget: null,
    local: null,          // local mode: GET /local/config (this page is then the user's device)
    modeKnown: false,     // GET /local/config answered (or 404: a server without local mode)
    modeError: null,      // GET /local/config failed: the mode is unknown, so no answer is sent at all
    session: null,        // {user, token}: the user POST /session made for this browser (localStorage)
    refused: null,        // the user whose token the server refused (403): said in the panel
  };

  // ---------- API ----------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, parameter, message, path, retryAfter = null, body = null) {
      super(message);
      this.status = status;
      this.parameter = parameter;
      this.path = path;
      this.retryAfter = retryAfter;  // seconds, from a 503's Retry-After
      this.retried = 0;              // how many times a 503 was retried before this answer
      this.body = body;              // the whole JSON answer (a 403 at the cap carries `learning`)
    }
  }

  // `retry503: n`: a 503 (the server's store is restarting; nothing was recorded) is retried up to n times,
  // each after the Retry-After it names (1 s if none, at most 10 s). The error of the last try carries
  // `retried`, so a 409 after a retry tells "recorded by a try whose answer was lost".
  async function api(path, options = {}) {
    const { retry503 = 0, ...init } = options;
    for (let attempt = 0; ; attempt++) {
      try {
        return await apiOnce(path, init);
      } catch (e) {
        if (!(e instanceof ApiError) || e.status !== 503 || attempt >= retry503) {
          if (e instanceof ApiError) e.retried = attempt;
          throw e;
        }
        await sleep(Math.min(10, Math.max(0.2, e.retryAfter ?? 1)) * 1000);
      }
    }
  }

  async function apiOnce(path, options) {
    let resp;
    try {
      resp = await fetch(path, { headers: { "Accept": "application/json" }, ...options });
    } catch (e) {
      throw new ApiError(0, null, `could not reach the server (${e.message})`, path);
    }
    let body = null;
    const text = await resp.text();
    try { body = text ? JSON.parse(text) : null; } catch { body = null; }
    if (!resp.ok) {
      const err = body && body.error;
      const message = err && err.message ? err.message : (text || resp.statusText);
      const after = parseFloat(resp.headers.get("Retry-After"));
      throw new ApiError(resp.status, err ? err.parameter : null, message, path, Number.isFinite(after) ? after : null,
                         body);
    }
    return body;
  }

  // ---------- tokens -------------------------------------------------------------------

  const SESSION_KEY = "privrec.session";  // localStorage: a returning visitor is the same user
  const TOKENS_KEY = "privrec.tokens";    // sessionStorage: tokens from links, by user ("*": for every user)

  function storedTokens() {
    try { return JSON.parse(sessionStorage.getItem(TOKENS_KEY)) || {}; } catch { return {}; }
  }
  function keepToken(user, token) {
    const t = storedTokens();
    if (token) t[user] = token; else delete t[user];
    sessionStorage.setItem(TOKENS_KEY, JSON.stringify(t));
  }
  function tokenFor(user) {
    if (state.session && state.session.user === user) return state.session.token;
    const t = storedTokens();
    return t[user] ?? t["*"] ?? null;
  }
  function forgetToken(user) {
    if (state.session && state.session.user === user) {
      state.session = null;
      localStorage.removeItem(SESSION_KEY);
    }
    const t = storedTokens();
    if (user in t) keepToken(user, null); else keepToken("*", null);
  }

  // `#token=T` (with `?user=U`: U's token; without: a token for every user, the operator's), kept for this tab and
  // taken out of the address bar.
  function takeFragmentToken() {
    const token = new URLSearchParams(window.location.hash.slice(1)).get("token");
    if (!token) return;
    keepToken(new URLSearchParams(window.location.search).get("user") ?? "*", token);
    const url = new URL(window.location.href);
    url.hash = "";
    history.replaceState(null, "", url);
  }

  // A user of this browser's own: POST /session makes a new user (an id nobody had) and gives its token, on a
  // catalog that takes new users (/users says `new_users`; on a fixed list only a link's token opens a view).
  async function startSession() {
    try { state.session = JSON.parse(localStorage.getItem(SESSION_KEY)); } catch { state.session = null; }
    if (state.session && state.session.user && state.session.token) return;
    state.session = null;
    try {
      const s = await api("/session", { method: "POST" });
      state.session = { user: s.user, token: s.token };
      localStorage.setItem(SESSION_KEY, JSON.stringify(state.session));
    } catch (e) {
      showError(e);
    }
  }

  // ---------- errors -------------------------------------------------------------------

  function showError(e) {
    const box = $("error");
    if (e instanceof ApiError) {
      const where = e.path.split("?")[0];
      $("error-title").textContent = e.status ? `${where} answered ${e.status}` : `${where} failed`;
      const param = e.parameter ? ` (parameter “${e.parameter}”)` : "";
      $("error-message").textContent = `${e.message}${param}`;
    } else {
      $("error-title").textContent = "Error";
      $("error-message").textContent = String(e && e.message ? e.message : e);
    }
    box.hidden = false;
  }
  function clearError() { $("error").hidden = true; }

  // ---------- formatting ---------------------------------------------------------------

  const fmt = (x, digits = 2) => (x == null || !isFinite(x) ? "–" : Number(x).toFixed(digits));
  const fmtEps = (x) => (x == null ? "∞" : x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
  const SUP = "⁰¹²³⁴⁵⁶⁷⁸⁹";
  // a lower bound of a wait, in words: "12 s", "5 min", "4.6 h", "3 days"
  const fmtWait = (seconds) => {
    if (seconds == null || !isFinite(seconds)) return "an unknown time";
    if (seconds < 90) return `${Math.max(1, Math.round(seconds))} s`;
    if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min`;
    if (seconds < 48 * 3600) return `${(seconds / 3600).toFixed(1)} h`;
    return `${Math.round(seconds / 86400)} days`;
  };
  const fmtDelta = (x) => {
    if (x == null || !isFinite(x)) return "–";
    if (x === 0) return "0";
    const [m, e] = x.toExponential(1).replace(".0e", "e").split("e");
    const exp = (e.startsWith("-") ? "⁻" : "") + e.replace(/^[-+]/, "").split("").map((c) => SUP[c]).join("");
    return (m === "1" ? "" : `${m}·`) + `10${exp}`;
  };

  // ---------- model state badge --------------------------------------------------------

  function setModelState(kind, text) {
    const s = $("model-state");
    s.dataset.state = kind;
    s.textContent = text;
  }
  function setVersion(v) {
    if (v == null) return;
    state.version = v;
    $("model-version").textContent = `v${v}`;
  }

  // ---------- recommendations ----------------------------------------------------------

  async function loadRecommendations() {
    const user = state.user;
    const q = new URLSearchParams({ user, k: String(state.k) });
    const rec = await api(`/recommend?${q}`);
    if (user !== state.user) return rec;  // another user was chosen meanwhile: not shown
    if (state.rec && state.rec.user === rec.user) {
      state.ranks = new Map(state.rec.items.map((it, i) => [it.item, i]));
    } else {
      state.ranks = new Map();
    }
    state.rec = rec;
    state.site = rec.site ?? null;  // federated mode: the site that serves (and learns from) this user
    setVersion(rec.model_version);
    renderItems();
    return rec;
  }

  function renderItems() {
    const list = $("items");
    list.replaceChildren();
    const rec = state.rec;
    $("items-empty").hidden = !!(rec && rec.items.length);
    if (!rec) return;
    const items = rec.items;
    $("legend-pop").hidden = !items.some((it) => it.popularity !== undefined);
    // one scale for all bars: from min(0, means) to max(0, scores)
    const lo = Math.min(0, ...items.map((it) => Math.min(it.mean, it.score)));
    const hi = Math.max(0, ...items.map((it) => Math.max(it.mean, it.score)));
    const span = hi - lo || 1;
    const pos = (x) => ((x - lo) / span) * 100;
    const zero = pos(0);

    items.forEach((it, i) => {
      const before = state.ranks.size ? state.ranks.get(it.item) : undefined;
      let moved = null;
      if (state.ranks.size) {
        if (before === undefined) moved = el("span", { class: "move new", text: "new", title: "new in the list" });
        else if (before > i) moved = el("span", { class: "move up", text: `▲${before - i}`, title: `up ${before - i}` });
        else if (before < i) moved = el("span", { class: "move down", text: `▼${i - before}`, title: `down ${i - before}` });
      }

      // stacked bar: estimate from 0 to mean, then the popularity term (if the server has one), then the bonus
      const popular = it.popularity ?? 0;
      const meanL = Math.min(zero, pos(it.mean)), meanW = Math.abs(pos(it.mean) - zero);
      const popL = Math.min(pos(it.mean), pos(it.mean + popular)), popW = Math.abs(pos(it.mean + popular) - pos(it.mean));
      const bonusL = Math.min(pos(it.mean + popular), pos(it.score));
      const bonusW = Math.abs(pos(it.score) - pos(it.mean + popular));
      const bar = el("div", {
        class: "bar", role: "img",
        "aria-label": `score ${fmt(it.score)}: estimate ${fmt(it.mean)}` +
          (it.popularity !== undefined ? ` plus popularity ${fmt(popular)}` : "") +
          ` plus exploration bonus ${fmt(it.bonus)}`,
      },
        el("span", { class: "seg mean" + (it.mean < 0 ? " negative" : "") }),
        el("span", { class: "seg bonus" }),
        el("span", { class: "axis" }),
        el("span", { class: "seg pop" }));
      bar.children[0].style.left = `${meanL}%`;
      bar.children[0].style.width = `${meanW}%`;
      bar.children[1].style.left = `${bonusL}%`;
      bar.children[1].style.width = `${Math.max(bonusW, 0.6)}%`;
      bar.children[2].style.left = `${zero}%`;
      bar.children[3].style.left = `${popL}%`;
      bar.children[3].style.width = `${popW}%`;

      const listen = el("button", { type: "button", class: "listen", text: "▶ listen",
        "aria-label": `Listen to ${it.name}`, "data-item": it.item });
      const skip = el("button", { type: "button", class: "skip", text: "skip",
        "aria-label": `Skip ${it.name}`, "data-item": it.item });
      listen.addEventListener("click", () => sendFeedback(it, 1, listen));
      skip.addEventListener("click", () => sendFeedback(it, 0, skip));

      const li = el("li", { class: "item", "data-item": it.item },
        el("span", { class: "rank", text: String(i + 1) }),
        el("div", { class: "what" },
          el("div", { class: "name" }, el("span", { text: it.name }), moved),
          it.name.includes(it.item) ? null : el("div", { class: "id", text: `item ${it.item}` })),
        el("div", { class: "scorebox" },
          bar,
          el("div", { class: "numbers" },
            el("span", { class: "score", text: fmt(it.score) }),
            el("span", { class: "split", text: it.popularity !== undefined
              ? ` = ${fmt(it.mean)} + ${fmt(it.popularity)} + ${fmt(it.bonus)}`
              : ` = ${fmt(it.mean)} + ${fmt(it.bonus)}` }))),
        el("div", { class: "actions" }, listen, skip));
      list.append(li);
    });
  }

  function lockList(chosenItem, reward) {
    for (const b of $("items").querySelectorAll("button")) b.disabled = true;
    const li = $("items").querySelector(`li[data-item="${CSS.escape(chosenItem)}"]`);
    if (li) li.classList.add(reward >= 0.5 ? "chosen-listen" : "chosen-skip");
  }

  async function sendFeedback(it, reward, button) {
    if (state.learning || !state.rec) return;
    clearError();
    const rec = state.rec;
    const verb = reward >= 0.5 ? "listened to" : "skipped";
    let answer = null;  // the server's answer to POST /feedback (its `learning` says whether it is learned)
    state.learning = { since: performance.now(), fromVersion: rec.model_version, item: it.item, reward };
    lockList(it.item, reward);
    setModelState("learning", "learning…");
    $("feedback-status").textContent = `You ${verb} “${it.name}”. Sending…`;
    try {
      if (state.local) {
        await sendReport(rec, it, reward);  // local mode: only a noisy report leaves the page
      } else if (!state.modeKnown || it.x !== undefined) {
        // the server may be in local mode (its config did not load, or it sends contexts): a raw
        // reward must not leave the page, so nothing is sent
        throw new Error(state.modeError
          ? `the server's mode is unknown (GET /local/config: ${state.modeError.message}); nothing was sent`
          : "this server sends item contexts (local mode) but GET /local/config did not say so; nothing was sent");
      } else {
        try {
          answer = await api("/feedback", {
            method: "POST", retry503: 5,
            headers: { "Content-Type": "application/json", "Accept": "application/json" },
            body: JSON.stringify({ rec_id: rec.rec_id, item: it.item, reward }),
          });
        } catch (e) {
          // 409 after a retried 503: an earlier try was recorded and its answer lost
          if (!(e instanceof ApiError && e.status === 409 && e.retried > 0)) throw e;
        }
      }
    } catch (e) {
      if (e instanceof ApiError && e.status === 403 && e.body && e.body.learning) {
        // cap_policy = reject: not recorded, and nothing from this user is accepted until the next epoch
        await notLearned(it, verb, e.body.learning, false);
        return;
      }
      state.learning = null;
      setModelState("error", "feedback not recorded");
      $("feedback-status").textContent = `Your feedback on “${it.name}” was not recorded.`;
      showError(e);
      // the shown list may be spent (409) or gone (404): show a fresh one
      try { await loadRecommendations(); } catch (e2) { showError(e2); }
      return;
    }
    if (answer && answer.learning && answer.learning.learned === false) {
      await notLearned(it, verb, answer.learning, true);  // no release will carry it: nothing to wait for
      return;
    }
    $("feedback-status").textContent =
      `You ${verb} “${it.name}”. Waiting for the model to learn it (served: v${rec.model_version})…`;
    await waitForModel(rec.model_version, it, verb);
  }

  // Why the model does not learn from this user now, from a /feedback answer's `learning` (the user's own
  // view of the public ledger) and the budget view's lifetime budget.
  function notLearnedText(learning) {
    if (learning.reason === "cap") {
      const n = learning.epoch_releases_left;
      const when = n == null ? "" : ` The next epoch starts after ${n.toLocaleString("en-US")} more ` +
        `release${n === 1 ? "" : "s"} (at the earliest in ${fmtWait(learning.epoch_seconds_left_at_least)}: at ` +
        "most one release a tick, and only when there is new feedback).";
      return "The model no longer learns from you until the next epoch: your answers already went into " +
        `${learning.cap} release ticks this epoch, the most one user may (this cap bounds your privacy loss).${when}`;
    }
    if (learning.reason === "budget") {
      const u = (state.budget && state.budget.user) || {};
      const budget = u.user_budget != null ? ` (ε = ${fmtEps(u.user_budget)})` : "";
      return `The model does not learn from it: one more contribution would take your privacy loss past your ` +
        `lifetime budget${budget}` + (u.at_budget ? ", so it will never learn from you again." : ".");
    }
    return "The model does not learn from it.";
  }

  // The answer will not be learned from (or, `recorded` false, was refused at the cap): say so and why, and
  // let the user go on at once. A recorded answer spent its list (one answer per shown list), so a fresh list
  // follows; a refused one did not, and its list is answerable again.
  async function notLearned(it, verb, learning, recorded) {
    setModelState("capped", learning.reason === "cap" ? "not learning: cap reached" : "not learning: budget spent");
    const said = recorded ? `You ${verb} “${it.name}”: recorded, but not learned from. `
                          : `Your answer on “${it.name}” was not accepted (this server refuses answers at the cap). `;
    const status = () => {
      $("feedback-status").textContent = said + notLearnedText(learning) +
        (recorded ? " You can keep listening and skipping." : "");
    };
    status();
    state.learning = null;  // nothing to wait for: the next list can be answered as soon as it is shown
    try {
      if (recorded) await Promise.all([loadRecommendations(), loadBudget()]);
      else { renderItems(); await loadBudget(); }
    } catch (e) { showError(e); }
    status();
  }

  // ---------- local mode: the page is the device ---------------------------------------

  // The device's step, under its lock: load the stored state, add the answer and draw the noise, store
  // the new state with the report pending, and only then send.
  async function sendReport(rec, it, reward) {
    const L = window.PrivrecLocal;
    const user = state.user;
    await L.exclusive(user, async () => {
      const st = L.load(state.local, user);
      L.buildReport(st, state.local, rec.rec_id, it.item, it.x, reward);
      L.save(st);  // the new state and the pending report are stored before anything is sent
      await sendPending(st);
    });
  }

  // Send the stored reports of `user`, oldest first, exactly as they were stored (a failed POST or a
  // reload re-sends the same bytes; noise is never redrawn). Returns how many were delivered.
  function flushReports(user) {
    const L = window.PrivrecLocal;
    return L.exclusive(user, () => sendPending(L.load(state.local, user)));
  }

  // (holding the device's lock) 202: delivered; 409: the server already has this list's report (an
  // earlier send whose answer was lost); 404 and 400: it can never be accepted (its list expired, or
  // it is malformed) — dropped and said, and its data stays in the later reports' running sum.
  // Anything else (no network, 5xx): kept for the next try, and the error is raised.
  async function sendPending(st) {
    const L = window.PrivrecLocal;
    let delivered = 0;
    while (st.pending.length) {
      const rep = st.pending[0];
      let dropped = null;
      try {
        // a separate shuffler: the report's content sealed to the analyzer, sent to the shuffler (seal.js)
        const dest = await window.PrivrecSeal.destination(state.local, rep);
        await api(dest.url, {
          method: "POST", retry503: 5,
          headers: { "Content-Type": "application/json", "Accept": "application/json" },
          body: JSON.stringify(dest.body),
        });
        delivered += 1;
      } catch (e) {
        if (!(e instanceof ApiError) || ![400, 404, 409].includes(e.status)) throw e;
        if (e.status !== 409) dropped = e;
      }
      L.acknowledge(st, rep.version);
      L.save(st);
      if (dropped) {
        $("feedback-status").textContent = `Report v${rep.version} was not accepted and is dropped: ${dropped.message}`;
        if (st.pending.length === 0) throw dropped;
      }
    }
    return delivered;
  }

  const hasPending = (user) => state.local && window.PrivrecLocal.load(state.local, user).pending.length > 0;

  async function waitForModel(fromVersion, it, verb) {
    const t0 = state.learning.since;
    let version = fromVersion;
    while (performance.now() - t0 < LEARN_TIMEOUT_MS) {
      await sleep(POLL_MS);
      try {
        const h = await api("/healthz");
        version = h.model_version;
        if (version != null && version > fromVersion) break;
      } catch (e) {
        if (!(e instanceof ApiError) || e.status !== 503) { showError(e); }
      }
    }
    const seconds = (performance.now() - t0) / 1000;
    try {
      await Promise.all([loadRecommendations(), loadBudget()]);
    } catch (e) { showError(e); }
    state.learning = null;
    if (state.rec && state.rec.model_version > fromVersion) {
      setModelState("fresh", `learned in ${seconds.toFixed(1)} s`);
      $("feedback-status").textContent =
        `You ${verb} “${it.name}”: model v${fromVersion} → v${state.rec.model_version}. The list below is re-ranked.`;
    } else {
      setModelState("stale", "still learning");
      $("feedback-status").textContent =
        `You ${verb} “${it.name}”, but after ${seconds.toFixed(0)} s the served model is still v${fromVersion}; ` +
        "it will appear in a later release. Showing a fresh list.";
    }
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  // ---------- budget -------------------------------------------------------------------

  // The user's own view with their token; the public statement without one (or when it is refused).
  async function loadBudget() {
    const user = state.user;
    const token = tokenFor(user);
    let b = null;
    if (token) {
      try {
        b = await api(`/budget?user=${encodeURIComponent(user)}`,
                      { headers: { "Accept": "application/json", "Authorization": `Bearer ${token}` } });
        if (state.refused === user) state.refused = null;
      } catch (e) {
        if (!(e instanceof ApiError && (e.status === 401 || e.status === 403))) throw e;
        forgetToken(user);  // e.g. a stack started again with a new secret
        state.refused = user;
      }
    }
    if (b === null) b = await api("/budget");
    if (user !== state.user) return b;  // another user was chosen meanwhile: not shown
    state.budget = b;
    renderBudget(b);
    return b;
  }

  function renderBudget(b) {
    const p = b.privacy || {};
    const u = b.user || {};
    const k = u.interactions ?? 0;
    $("user-interactions").textContent = String(k);
    $("tagline").textContent = p.private
      ? "Recommendations that learn from every listen — and publish only differentially private statistics."
      : "Recommendations that learn from every listen. Privacy is switched off on this server (ε = ∞).";
    if (!p.private) {
      $("user-epsilon").textContent = "ε = ∞";
      $("user-delta").textContent = "–";
      $("user-budget-note").textContent = "Privacy is switched off on this server (ε = ∞): the statistics behind " +
        "these recommendations are published without noise, so your feedback is not protected.";
      $("guarantee-plain").textContent = p.plain || "Nothing is protected (ε = ∞).";
      $("event-guarantee").textContent = "none (ε = ∞)";
      $("mechanism").textContent = "none";
      $("neighbours").textContent = "nothing";
      $("accounting").textContent = "–";
    } else {
      $("user-epsilon").textContent = `ε = ${fmtEps(u.epsilon)}`;
      $("user-delta").textContent = fmtDelta(u.delta);
      const validity = u.valid === false ? ` (${u.note})` : "";
      $("user-budget-note").textContent = k === 0
        ? "You have given no feedback yet, so nothing published depends on you: your privacy loss is zero."
        : u.unit === "user"
          ? `Covers your whole history together${validity}: your ${k} listens and skips fell into ` +
            `${u.ticks_this_epoch} of at most ${u.cap} release ticks this epoch` +
            (u.at_budget ? ` — you reached your lifetime budget (ε = ${fmtEps(u.user_budget)}), so the model ` +
                           "no longer learns from you, ever, and your privacy loss never grows again."
              : u.at_cap ? " — you reached the cap, so the model no longer learns from you this epoch, and your " +
                        "privacy loss stops growing." : `; it grows with each new tick you appear in, up to ε = ` +
                        `${fmtEps(p.epsilon)} at the cap` +
                        (u.user_budget ? `, and never past your lifetime budget ε = ${fmtEps(u.user_budget)}.` : "."))
          : `Covers all ${k} of your listens and skips together${validity}. It grows with each one you give ` +
            `(group privacy: ${k} × one interaction).`;
      // the server's words (models.accounting.statement.render_plain), per relation: add/remove or replace
      $("guarantee-plain").textContent = p.plain || p.statement || "";
      $("event-guarantee").textContent = `(ε, δ) = (${fmtEps(p.epsilon)}, ${fmtDelta(p.delta)})`;
      $("mechanism").textContent = `${p.mechanism}: ${p.mechanism_about}`;
      $("neighbours").textContent = p.neighbours;
      $("accounting").textContent = p.note + (p.valid === false ? " (not a valid (ε, δ) bound)" : "");
      if (p.public) $("public").textContent = p.public.join("; ");
    }
    if (b.local || state.local) renderLocal(b, p);
    renderMode(b, p);
    const t = b.tree || {};
    $("releases").textContent = `${b.releases}, covering ${b.events_released} interactions`;
    $("tree").textContent = t.per_unit
      ? `one tree per unit, ${t.levels} levels, ${t.unit_releases_per_epoch} of its releases per epoch`
      : `epoch ${t.epoch}, tick ${t.tick_in_epoch} of ${t.ticks_per_epoch} (${t.levels} levels)`;
    if (b.model) {
      const width = b.model.alpha === null ? "per-unit widths" : `α = ${b.model.alpha}`;
      $("about-model").textContent = `${b.model.algorithm} · d = ${b.model.d} · ${width} · ` +
        `λ = ${Number(b.model.lambda).toPrecision(3)} · ${b.model.units} units · catalog ${b.model.catalog}`;
    }
    renderSpark(b.history || [], !!p.private);
    if (!b.user) renderTokenless(b, p);
    if (state.version == null || b.releases > state.version) {
      // the page's list may be older than the latest release: the badge says so
      $("model-version").title = `latest release v${b.releases}`;
    }
  }

  // No token for this user: their own figures are theirs (and the operator's) alone; the rest is public.
  function renderTokenless(b, p) {
    const local = b.local || state.local;
    const g = local ? ((b.local && b.local.guarantee) || guaranteeFromConfig(state.local)) : null;
    $("user-interactions").textContent = "–";
    if (local ? g.unit === "user" : p.private) {  // a figure of this user's own history
      $("user-epsilon").textContent = "–";
      $("user-delta").textContent = "–";
    }
    const user = state.user;
    const refused = state.refused === user ? "The token this page held for this user was refused. " : "";
    $("user-budget-note").textContent = refused + (state.session
      ? `User ${user}'s own figures are shown only to them (with their token) and to the operator. This page ` +
        `made a user of your own, ${state.session.user}: choose it to see yours.`
      : `User ${user}'s own figures (interactions, privacy loss) are shown only with their token: open the link ` +
        "the operator gives each user, which carries it (privrec token --user " + user + ").");
  }

  // Local mode's guarantee as /local/config states it (when /budget has no "local" section).
  function guaranteeFromConfig(c) {
    if (!c) return {};
    const g = { algorithm: c.algorithm, epsilon: c.epsilon, delta: c.delta, shuffle_batch: c.shuffle_batch || 0,
                unit: c.unit || "event", cap: c.cap, user_budget: { epsilon: c.user_budget } };
    if (c.mechanism) g.mechanism = c.mechanism.name;
    if (c.noise) g.noise = c.noise.kind;
    if (c.noise && c.noise.kind === "laplace" && g.unit !== "user") {
      Object.assign(g, { epsilon: c.noise.epsilon0, delta: 0, central_epsilon: c.epsilon, central_delta: c.delta });
    }
    return g;
  }

  function renderLocal(b, p) {
    const fromBudget = b.local && b.local.guarantee;
    const g = fromBudget || guaranteeFromConfig(state.local);
    const u = (b.local && b.local.user) || {};
    const k = u.reports ?? (b.user && b.user.interactions) ?? 0;
    const shuffled = g.central_epsilon !== undefined || (g.unit === "user" && g.shuffle_batch > 0);
    $("tagline").textContent = "Recommendations that learn from every listen — your browser adds the noise: " +
      "your listens and skips never leave this page.";
    // the server's words for this device (its /budget, else the served statement, which carries the same)
    $("guarantee-plain").textContent = (fromBudget && g.plain) || p.plain || "";
    if (g.unit === "user") return renderLocalUser(g, u, k, p);
    $("user-epsilon-label").textContent = shuffled ? "each report's privacy loss, on your device"
                                                   : "privacy loss of each answer, on your device";
    $("user-epsilon").textContent = shuffled ? `ε₀ = ${fmtEps(g.epsilon)}` : `ε = ${fmtEps(g.epsilon)}`;
    $("user-delta").textContent = fmtDelta(g.delta);
    $("user-budget-note").textContent = k === 0
      ? "You have sent no report yet: nothing the server holds depends on you."
      : `${k} report${k === 1 ? "" : "s"} from this browser` + (u.bound ? `: ${u.bound}.` : ".");
    $("event-guarantee").textContent = shuffled
      ? `each report (ε₀, 0) = (${fmtEps(g.epsilon)}, 0) on your device; each shuffled batch ` +
        `(${fmtEps(g.central_epsilon)}, ${fmtDelta(g.central_delta)}) centrally`
      : `(ε, δ) = (${fmtEps(g.epsilon)}, ${fmtDelta(g.delta)}) on your device`;
    $("mechanism").textContent = g.mechanism ? `${g.mechanism} on your device` : `${g.noise} noise on your device`;
    if (fromBudget) {  // the server's own statement of the guarantee (and of the shuffled batches' bound)
      const central = shuffled && g.central_bound && g.central_bound.note ? ` ${g.central_bound.note}` : "";
      $("accounting").textContent = (g.statement || "") + central;
    } else {
      $("neighbours").textContent = "one answer of yours (its reward and which shown item you picked), on your device";
      $("accounting").textContent = "as /local/config states it (this server's /budget has no local section)";
    }
  }

  // Local mode at user level: the user's whole history, as the global mode's user level states it (the same
  // /budget fields: epsilon spent so far, ticks_this_epoch of cap, at_cap, user_budget, at_budget).
  function renderLocalUser(g, u, k, p) {
    const eps = u.epsilon ?? 0;
    $("user-epsilon-label").textContent = "your privacy loss so far, all your reports together";
    $("user-epsilon").textContent = `ε = ${fmtEps(eps)}`;
    $("user-delta").textContent = fmtDelta(u.delta ?? g.delta);
    const budget = g.user_budget && g.user_budget.epsilon;
    $("user-budget-note").textContent = k === 0
      ? "You have sent no report yet: nothing the server holds depends on you; your privacy loss is zero."
      : `Covers your whole history together: ${k} report${k === 1 ? "" : "s"} from this browser, ` +
        `${u.ticks_this_epoch ?? "?"} of at most ${g.cap} this epoch` +
        (u.at_budget ? ` — you reached your lifetime budget (ε = ${fmtEps(budget)}), so this browser sends no ` +
                       "more reports, ever, and your privacy loss never grows again."
          : u.at_cap ? " — you reached the cap, so this browser sends nothing more this epoch, and your privacy " +
                       "loss stops growing." : `; it grows with each report, up to ε = ${fmtEps(g.epsilon)} per ` +
                       "epoch" + (budget ? `, and never past your lifetime budget ε = ${fmtEps(budget)}.` : "."));
    $("event-guarantee").textContent =
      `(ε, δ) = (${fmtEps(g.epsilon)}, ${fmtDelta(g.delta)}) for all your reports of one epoch, on your device`;
    $("mechanism").textContent = g.mechanism ? `${g.mechanism} on your device` : `${g.noise} noise on your device`;
    $("neighbours").textContent = g.neighbours || "everything you did, on your device";
    $("accounting").textContent = g.statement || p.statement || "as /local/config states it";
  }

  function renderMode(b, p) {
    if (b.local || state.local) {
      const g = (b.local && b.local.guarantee) || guaranteeFromConfig(state.local);
      $("trust-mode").textContent = `local (${g.algorithm}): your browser adds the noise before anything is sent` +
        (g.shuffle_batch ? `; reports are shuffled in batches of ${g.shuffle_batch} users` : "");
      $("sites-row").hidden = true;
      return;
    }
    const fed = b.federated;
    if (!fed) {
      $("trust-mode").textContent = "global: this server adds the noise before anything is published";
      $("sites-row").hidden = true;
      return;
    }
    const star = fed.topology === "star";
    $("trust-mode").textContent = `federated, ${fed.sites.length} sites (${star ? "a coordinator sums their " +
      "releases" : `${fed.topology}: sites mix their neighbours' releases`}): your feedback stays at your site; ` +
      "the others see only its noisy releases";
    $("sites-row").hidden = false;
    $("sites").textContent = fed.sites.map((s) => {
      const g = s.privacy || p;
      const eps = g.private ? `ε = ${fmtEps(g.epsilon)}, δ = ${fmtDelta(g.delta)}` : "ε = ∞";
      const yours = state.site === s.site ? " (yours)" : "";
      return `site ${s.site}${yours}: ${eps}, ${s.releases ?? 0} releases of ${s.events_released ?? 0} interactions`;
    }).join(" · ");
  }

  function renderSpark(history, noisy) {
    const svg = $("sparkline");
    svg.replaceChildren();
    const NS = "http://www.w3.org/2000/svg";
    if (history.length < 2) {
      $("spark-caption").textContent = "Interactions covered by each release (appears after two releases)";
      return;
    }
    const xs = history.map((h) => h.version), ys = history.map((h) => h.count);
    const x0 = xs[0], x1 = xs[xs.length - 1], y1 = Math.max(1, ...ys);
    const W = 300, H = 48, pad = 3;
    const px = (x) => ((x - x0) / (x1 - x0 || 1)) * (W - 2 * pad) + pad;
    const py = (y) => H - pad - (y / y1) * (H - 2 * pad);
    const pts = history.map((h) => `${px(h.version).toFixed(1)},${py(h.count).toFixed(1)}`);
    const area = document.createElementNS(NS, "polygon");
    area.setAttribute("points", `${px(x0)},${H - pad} ${pts.join(" ")} ${px(x1)},${H - pad}`);
    area.setAttribute("class", "spark-area");
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("class", "spark-line");
    svg.append(area, line);
    $("spark-caption").textContent = `Interactions covered, release v${x0}–v${x1} (now ${ys[ys.length - 1]})` +
      (noisy ? "; every release adds fresh noise — released noise is never redrawn." : ".");
  }

  // ---------- wiring -------------------------------------------------------------------

  async function selectUser(user) {
    state.user = user;
    state.rec = null;
    state.ranks = new Map();
    const url = new URL(window.location.href);
    url.searchParams.set("user", user);
    history.replaceState(null, "", url);
    clearError();
    setModelState("idle", "loading…");
    try {
      if (!state.modeKnown) {  // (again, if it failed before; one request for concurrent callers)
        state.modeLoading = state.modeLoading || loadMode().finally(() => { state.modeLoading = null; });
        await state.modeLoading;
      }
      if (state.local) {  // re-send what a failed POST or a reload left, as it was; the list loads anyway
        try { await flushReports(user); } catch (e) { showError(e); }
      }
      const [, b] = await Promise.all([loadRecommendations(), loadBudget()]);
      const u = (b && b.user) || {};
      if (!state.local && u.unit === "user" && (u.at_cap || u.at_budget)) {
        setModelState("capped", u.at_budget ? "not learning: budget spent" : "not learning: cap reached");
        $("feedback-status").textContent = u.at_budget
          ? "You reached your lifetime privacy budget: the model no longer learns from you. You can still listen and skip."
          : `You reached the cap (${u.cap} release ticks this epoch): the model no longer learns from you until ` +
            "the next epoch. You can still listen and skip.";
      } else {
        setModelState("fresh", "up to date");
        $("feedback-status").textContent =
          "Pick “listen” or “skip” on one item: the model learns from it and the list updates.";
      }
    } catch (e) {
      renderItems();
      showError(e);
      if (e instanceof ApiError && e.status === 503 && state.user === user) {
        // no model published yet (the worker is starting): try again shortly
        setModelState("idle", "waiting for the first model…");
        setTimeout(() => { if (state.user === user && !state.rec) selectUser(user); }, 1000);
      } else {
        setModelState("error", "error");
      }
    }
  }

  async function idlePoll() {
    if (!state.learning && state.user && !document.hidden) {
      if (hasPending(state.user)) {  // local mode: a report whose POST failed goes again, as it was
        const user = state.user;
        try {
          const n = await flushReports(user);
          if (n) $("feedback-status").textContent = `An earlier report from this browser was delivered (${n}).`;
        } catch (e) { /* still unreachable: kept, tried again at the next poll */ }
      }
      try {
        const h = await api("/healthz");
        if (h.model_version != null && state.rec && h.model_version > state.rec.model_version) {
          setModelState("stale", `newer model v${h.model_version}: refresh`);
        }
        if (state.budget && h.model_version !== state.budget.releases) await loadBudget();
      } catch (e) {
        if (!(e instanceof ApiError && e.status === 503)) showError(e);
      }
    }
    setTimeout(idlePoll, IDLE_POLL_MS);
  }

  // Which mode the server runs: GET /local/config. 404 (a server without local mode): the global page.
  // Any other failure leaves the mode unknown, and then no answer is sent at all: a local-mode server
  // must never be sent a raw reward because its config did not load.
  async function loadMode() {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const c = await api("/local/config");
        state.local = c && c.mode === "local" ? c : null;
        state.modeKnown = true;
        state.modeError = null;
        return;
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) {
          Object.assign(state, { local: null, modeKnown: true, modeError: null });
          return;
        }
        state.modeError = e;
        await sleep(300 * (attempt + 1));
      }
    }
    showError(state.modeError);
  }

  async function init() {
    $("error-dismiss").addEventListener("click", clearError);
    $("controls").addEventListener("submit", (ev) => { ev.preventDefault(); if (!state.learning) selectUser(state.user); });
    $("user").addEventListener("change", (ev) => selectUser(ev.target.value));
    $("k").addEventListener("change", (ev) => { state.k = Number(ev.target.value); if (state.user) selectUser(state.user); });
    state.k = Number($("k").value);
    takeFragmentToken();
    // a link with a token opened on this very page is a fragment change, not a new page: take its token too
    window.addEventListener("hashchange", () => { takeFragmentToken(); if (state.user) selectUser(state.user); });

    let users;
    try {
      users = await api("/users");
    } catch (e) {
      setModelState("error", "error");
      showError(e);
      return;
    }
    if (users.new_users) await startSession();
    const select = $("user");
    for (const u of users.users) select.append(el("option", { value: u, text: `user ${u}` }));
    const wanted = new URLSearchParams(window.location.search).get("user");
    let first = users.users[0];
    if (state.session) {  // this browser's own user first
      select.prepend(el("option", { value: state.session.user, text: `you (${state.session.user})` }));
      first = state.session.user;
    }
    if (wanted != null && wanted !== first) {
      if (!users.users.includes(wanted) && !(state.session && state.session.user === wanted)) {
        // not in the first page of /users: ask the API anyway; its error says what is wrong
        select.prepend(el("option", { value: wanted, text: `user ${wanted}` }));
      }
      first = wanted;
    }
    if (first == null) {
      showError(new Error("the catalog has no users"));
      return;
    }
    select.value = first;
    await selectUser(first);
    setTimeout(idlePoll, IDLE_POLL_MS);
  }

  document.addEventListener("DOMContentLoaded", init);
})();
