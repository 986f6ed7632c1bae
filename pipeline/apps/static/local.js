// privrec local mode: this page is the user's device. It keeps the user's exact statistic and noise
// state in localStorage, perturbs in the browser, and sends only the noisy report (POST /report); a raw
// reward never leaves the page. The protocol is docs/local-protocol.md; the Python twin is
// models.local.LocalClient. Noise comes from crypto.getRandomValues only (never Math.random).
// At user level (the server's config says unit "user") the page also keeps the device's ledger — the epoch
// of its last report and the reports made in it — and refuses an answer past the cap of the epoch or past
// the lifetime budget (config.report_limit reports), before anything changes or is sent (docs/local-protocol.md).
"use strict";

window.PrivrecLocal = (() => {
  const SCHEMA = "privrec.LocalReport/2";
  const STATE_SCHEMA = "privrec.LocalPageState/1";

  // ---------- randomness ---------------------------------------------------------------

  // a uniform double in (0, 1] from 53 random bits
  function uniform() {
    const w = new Uint32Array(2);
    crypto.getRandomValues(w);
    const hi = w[0] >>> 5, lo = w[1] >>> 6;          // 27 + 26 bits
    return (hi * 67108864 + lo + 1) / 9007199254740992; // (k + 1) / 2^53, k in [0, 2^53)
  }

  // N(0, sigma^2) by Box–Muller
  function gaussian(sigma) {
    const u1 = uniform(), u2 = uniform();
    return sigma * Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
  }

  // Laplace(0, scale) by the inverse CDF
  function laplace(scale) {
    const u = uniform() - 0.5;  // (-0.5, 0.5]
    const a = Math.max(1e-300, 1 - 2 * Math.abs(u));
    return -scale * Math.sign(u) * Math.log(a);
  }

  // ---------- state --------------------------------------------------------------------

  const zeros = (n) => new Array(n).fill(0);

  // what makes a stored state usable: the same algorithm and calibration (else it would release again)
  function fingerprint(config) {
    return JSON.stringify({ a: config.algorithm, d: config.d, e: config.epsilon, dl: config.delta,
                            m: config.mechanism, n: config.noise, s: config.shuffle_batch, u: config.unit || "event",
                            c: config.cap || null, es: config.epoch_seconds || null, b: config.user_budget ?? null });
  }

  function newState(config, user) {
    const d = config.d;
    const m = config.mechanism && config.mechanism.kind === "blt" ? config.mechanism.theta.length : 0;
    return { schema: STATE_SCHEMA, user, config: fingerprint(config), version: 0, exact: zeros(d),
             step: 0, eta: zeros(d), carry: zeros(d), buffers: Array.from({ length: m }, () => zeros(d)),
             pending: [], ledger: { epoch: -1, k: 0 } };
  }

  function key(user) { return `privrec.local.${location.host}.${user}`; }

  // The stored state of `user`, or a new one. A state made under another calibration is not reused
  // (its noise state belongs to another mechanism, and re-releasing its exact sum under a new one would
  // spend the budget again): the new state starts from zero but continues the version counter, which
  // the server requires to grow.
  function load(config, user) {
    const raw = localStorage.getItem(key(user));
    let s = null;
    try { s = raw ? JSON.parse(raw) : null; } catch { s = null; }
    if (s && s.schema === STATE_SCHEMA && s.user === user && s.config === fingerprint(config)) {
      if (!s.ledger) s.ledger = { epoch: -1, k: 0 };  // a state stored before user level
      return s;
    }
    const fresh = newState(config, user);
    if (s && Number.isInteger(s.version) && s.version > 0) fresh.version = s.version;
    return fresh;
  }

  function save(state) { localStorage.setItem(key(state.user), JSON.stringify(state)); }

  // The server has report `version`: forget it (by version, never by position).
  function acknowledge(state, version) {
    state.pending = state.pending.filter((p) => p.version !== version);
  }

  // Run `fn` with this user's device state to itself: every load-change-save holds the lock, so two
  // flushes (or two tabs, where the Web Locks API exists) never overwrite each other's state.
  const chains = new Map();
  function exclusive(user, fn) {
    const name = `privrec.local.${user}`;
    if (navigator.locks && navigator.locks.request) return navigator.locks.request(name, () => fn());
    const run = (chains.get(name) || Promise.resolve()).then(() => fn());
    chains.set(name, run.catch(() => {}));
    return run;
  }

  // ---------- the mechanisms -----------------------------------------------------------

  // One tick of the buffered-linear-Toeplitz mechanism (models.mechanisms.factorization.BLTMechanism):
  // z ~ N(0, scale^2)^d; eta = z + sum_j w_j S_j; S_j <- theta_j S_j + z; the release adds carry + eta;
  // after `capacity` ticks the epoch closes (carry absorbs eta, the buffers restart).
  // `draw(i)` gives the noise of coordinate i (tests pass zeros).
  function bltStep(state, mech, draw) {
    const d = state.exact.length;
    const z = Array.from({ length: d }, (_, i) => (draw ? draw(i) : gaussian(mech.scale)));
    const eta = z.slice();
    for (let j = 0; j < mech.w.length; j++) {
      for (let i = 0; i < d; i++) eta[i] += mech.w[j] * state.buffers[j][i];
    }
    for (let j = 0; j < mech.theta.length; j++) {
      for (let i = 0; i < d; i++) state.buffers[j][i] = mech.theta[j] * state.buffers[j][i] + z[i];
    }
    state.eta = eta;
    state.step += 1;
    const release = state.exact.map((b, i) => b + state.carry[i] + eta[i]);
    if (state.step >= mech.capacity) {
      state.carry = state.carry.map((c, i) => c + eta[i]);
      state.eta = zeros(d);
      state.buffers = state.buffers.map(() => zeros(d));
      state.step = 0;
    }
    return release;
  }

  // ---------- the ledger (user level) ---------------------------------------------------

  // The epoch of the next report, or an Error naming why the device may not make it ("cap: …" past the
  // epoch's cap, "budget: …" past the lifetime budget); null at event level (no cap). `now`: seconds since
  // the Unix epoch. A clock set back never reopens an epoch. The server checks both again.
  function check(state, config, now) {
    const limit = config.report_limit;
    if (Number.isInteger(limit) && state.version + 1 > limit) {
      return new Error(`budget: this browser made the ${limit} reports its lifetime budget allows ` +
                       `(ε = ${config.user_budget}); it sends no more`);
    }
    if (config.unit !== "user") return null;
    const led = state.ledger || { epoch: -1, k: 0 };
    const epoch = Math.max(led.epoch, Math.floor(now / config.epoch_seconds));
    if (epoch === led.epoch && led.k >= config.cap) {
      return new Error(`cap: this browser made its ${led.k} reports of epoch ${epoch} (cap ${config.cap} per ` +
                       `epoch of ${config.epoch_seconds} s); the next is allowed in epoch ${epoch + 1}`);
    }
    return epoch;
  }

  // The report of one answer: reward r on `item` (context x) of the list `recId`. Updates the state;
  // the caller saves it (with the report pending) before sending. The report names the list only: which
  // item the user acted on is protected, and lives only inside the noisy vector.
  function buildReport(state, config, recId, item, x, reward, draw, now) {
    if (!(typeof reward === "number" && reward >= 0 && reward <= 1)) throw new Error(`reward must be in [0, 1], got ${reward}`);
    if (!Array.isArray(x) || x.length !== state.exact.length || !x.every((v) => typeof v === "number" && isFinite(v))) {
      throw new Error(`item ${item} came without its ${state.exact.length} features ("x" in /recommend); nothing was sent`);
    }
    if (config.schema !== SCHEMA) throw new Error(`the server wants reports of schema ${config.schema}; this page makes ${SCHEMA}`);
    const tree = config.algorithm === "tree";
    if (tree && !(config.mechanism && config.mechanism.kind === "blt")) {
      throw new Error(`this page runs the BLT mechanism; the server's devices use ${config.mechanism && config.mechanism.name}`);
    }
    const noise = config.noise;
    const codes = noise && noise.kind === "blanket";
    if (codes && !(Array.isArray(config.codebook) && config.codebook.length === noise.codewords)) {
      throw new Error(`the server's codebook of ${noise.codewords} codewords is missing from /local/config`);
    }
    if (!tree && !(config.algorithm === "round" && noise && (codes || noise.kind === "gaussian" || noise.kind === "laplace"))) {
      throw new Error(`unknown local algorithm ${config.algorithm} or noise ${noise && noise.kind}`);
    }
    const epoch = check(state, config, now === undefined ? Date.now() / 1000 : now);
    if (epoch instanceof Error) throw epoch;
    // nothing above changed the state: a refused report leaves the device as it was
    const norm = Math.sqrt(x.reduce((s, v) => s + v * v, 0));
    const xc = norm > 1 ? x.map((v) => v / norm) : x.slice();
    state.exact = state.exact.map((b, i) => b + reward * xc[i]);
    state.version += 1;
    const report = { schema: SCHEMA, user: state.user, version: state.version, algorithm: config.algorithm,
                     rec_id: recId };
    if (epoch !== null) {
      report.epoch = epoch;
      const led = state.ledger || { epoch: -1, k: 0 };
      state.ledger = { epoch, k: epoch === led.epoch ? led.k + 1 : 1 };
    }
    if (tree) {
      report.b = bltStep(state, config.mechanism, draw);
    } else if (codes) {
      // the listen as its nearest codeword with probability r (else the dummy K), and every value of [0, K] with
      // probability p (the dummy is blanketed too, so a listen against no listen is the covered pair):
      // Bin(K + 1, p) + 1 messages whatever the data (models.local.client.codeword_messages)
      const K = noise.codewords;
      let code = 0, best = Infinity;
      config.codebook.forEach((w, c) => {
        const d2 = w.reduce((s, v, i) => s + (v - xc[i]) * (v - xc[i]), 0);
        if (d2 < best) { best = d2; code = c; }
      });
      const msgs = [];
      for (let c = 0; c <= K; c++) if (uniform() <= noise.p) msgs.push(c);
      msgs.push(uniform() <= reward ? code : K);
      report.m = xc.map(() => 0);
      report.msgs = msgs.sort((a, b) => a - b);
    } else {
      const one = (i) => (draw ? draw(i) : noise.kind === "laplace" ? laplace(noise.scale) : gaussian(noise.sigma));
      report.m = xc.map((v, i) => reward * v + one(i));
    }
    state.pending.push(report);
    return report;
  }

  return { uniform, gaussian, laplace, newState, load, save, key, acknowledge, exclusive, bltStep, buildReport,
           fingerprint, check };
})();
