// privrec local mode, encode-shuffle-analyze: the page seals each report's content to the analyzer's public key
// and sends the envelope to the shuffler (a separate service), never to the web server. WebCrypto twin of
// models/local/seal.py and models/local/esa.py (docs/local-parties.md):
//   ephemeral P-256 key pair (e, E); Z = ECDH(e, A); k = HKDF-SHA256(Z, salt = "", info = LABEL || E || A);
//   sealed = E (65 bytes) || nonce (12) || AES-256-GCM(k, nonce, content, aad = LABEL).
// The content holds the noisy vector only: no user, version, list or item (they would re-identify it).
"use strict";

window.PrivrecSeal = (() => {
  const LABEL = new TextEncoder().encode("privrec.Sealed/1");
  const CONTENT_SCHEMA = "privrec.ReportContent/1";
  const ENVELOPE_SCHEMA = "privrec.Envelope/1";

  const fromB64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  function toB64(bytes) {
    let s = "";
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(s);
  }
  function concat(...parts) {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) { out.set(p, at); at += p.length; }
    return out;
  }

  // seal(publicKeyB64, bytes) -> Uint8Array: E || nonce || ciphertext+tag
  async function seal(publicKeyB64, plaintext) {
    const A = fromB64(publicKeyB64);
    if (A.length !== 65 || A[0] !== 4) throw new Error("the analyzer's public key must be a 65-byte P-256 point");
    const subtle = crypto.subtle;
    const recipient = await subtle.importKey("raw", A, { name: "ECDH", namedCurve: "P-256" }, false, []);
    const eph = await subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, false, ["deriveBits"]);
    const E = new Uint8Array(await subtle.exportKey("raw", eph.publicKey));
    const Z = await subtle.deriveBits({ name: "ECDH", public: recipient }, eph.privateKey, 256);
    const ikm = await subtle.importKey("raw", Z, "HKDF", false, ["deriveKey"]);
    const k = await subtle.deriveKey({ name: "HKDF", hash: "SHA-256", salt: new Uint8Array(0), info: concat(LABEL, E, A) },
                                     ikm, { name: "AES-GCM", length: 256 }, false, ["encrypt"]);
    const nonce = crypto.getRandomValues(new Uint8Array(12));
    const c = new Uint8Array(await subtle.encrypt({ name: "AES-GCM", iv: nonce, additionalData: LABEL }, k, plaintext));
    return concat(E, nonce, c);
  }

  // The content of a report (what the analyzer opens): the algorithm and the noisy vector, nothing else.
  function content(report) {
    const m = report.m || report.b;
    return new TextEncoder().encode(JSON.stringify({ schema: CONTENT_SCHEMA, algorithm: report.algorithm, m }));
  }

  // envelope(config, report) -> the JSON body for the shuffler (config.esa from GET /local/config)
  async function envelope(config, report) {
    const sealed = await seal(config.esa.public_key, content(report));
    const body = { schema: ENVELOPE_SCHEMA, user: report.user, version: report.version, rec_id: report.rec_id,
                   sealed: toB64(sealed) };
    if (report.epoch !== undefined && report.epoch !== null) body.epoch = report.epoch;  // user level: the cap's epoch
    if (report.msgs && report.msgs.length) {  // codewords: each message sealed on its own (privrec.ItemMessage/1)
      const one = (c) => new TextEncoder().encode(JSON.stringify({ schema: "privrec.ItemMessage/1", c }));
      body.msgs = await Promise.all(report.msgs.map(async (c) => toB64(await seal(config.esa.public_key, one(c)))));
    }
    return body;
  }

  // Where and what to POST for `report`: the shuffler and the envelope when the stack has one, else /report.
  async function destination(config, report) {
    if (!config.esa) return { url: "/report", body: report };
    return { url: config.esa.shuffler, body: await envelope(config, report) };
  }

  return { seal, content, envelope, destination, toB64, fromB64 };
})();
