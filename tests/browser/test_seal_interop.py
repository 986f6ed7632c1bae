"""Python ↔ WebCrypto: envelopes sealed by the page (``pipeline/apps/static/seal.js``) open in Python.

The page is served from ``http://127.0.0.1`` (a secure context: WebCrypto's ``subtle`` exists only there or on
HTTPS) by Playwright's router; no stack is needed. The analyzer's key is made in Python
(:class:`models.local.seal.AnalyzerKey`), the page seals with its public key, and the shuffler's parser
(:func:`models.local.esa.parse_envelope`) and the analyzer's opening (:func:`models.local.esa.parse_content`)
take what the page made — bit-exact vectors, a fresh ciphertext each time, and the tag checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.local.esa import parse_content, parse_envelope
from models.local.seal import AnalyzerKey, SealError, b64encode

SEAL_JS = Path(__file__).resolve().parents[2] / "pipeline" / "apps" / "static" / "seal.js"
ORIGIN = "http://127.0.0.1:9/"


def _sealing_page(page: Any) -> Any:
    page.route(ORIGIN, lambda route: route.fulfill(status=200, content_type="text/html",
                                                   body=f"<html><script>{SEAL_JS.read_text()}</script></html>"))
    page.goto(ORIGIN)
    return page


def test_envelopes_sealed_by_the_page_open_in_python(page: Any) -> None:
    key = AnalyzerKey.generate()
    rng = np.random.default_rng(7)
    reports = [{"user": str(u), "version": v, "algorithm": "round", "rec_id": f"r{u}-{v}",
                "m": rng.laplace(scale=4.3, size=25).tolist()} for u in range(5) for v in (1, 2)]
    _sealing_page(page)
    envelopes = page.evaluate("""async ([pk, reports]) => Promise.all(
        reports.map((r) => PrivrecSeal.envelope({ esa: { public_key: pk } }, r)))""",
                              [b64encode(key.public_bytes()), reports])
    assert page.problems == []
    assert len({e["sealed"] for e in envelopes}) == len(reports)  # a fresh ephemeral key and nonce each time
    for rep, body in zip(reports, envelopes):
        env = parse_envelope(json.dumps(body))  # what the shuffler accepts
        assert (env.user, env.version, env.rec_id) == (rep["user"], rep["version"], rep["rec_id"])
        assert "m" not in body and str(rep["m"][0]) not in json.dumps(body)  # nothing of the content in the clear
        vector = parse_content(key.open(env.sealed), d=25, algorithm="round")  # what the analyzer opens
        assert vector.tolist() == rep["m"]  # bit for bit: JSON carries doubles exactly both ways
        tampered = bytearray(env.sealed)
        tampered[-5] ^= 0x40
        with pytest.raises(SealError, match="authentication failed"):
            key.open(bytes(tampered))
        with pytest.raises(SealError, match="authentication failed"):
            AnalyzerKey.generate().open(env.sealed)


def test_the_page_refuses_a_public_key_that_is_not_a_p256_point(page: Any) -> None:
    _sealing_page(page)
    message = page.evaluate("""async () => {
        try { await PrivrecSeal.seal(btoa("short"), new Uint8Array(3)); return "sealed"; }
        catch (e) { return String(e.message); } }""")
    assert "65-byte P-256 point" in message
    routed = page.evaluate("""async () => PrivrecSeal.destination({}, { user: "1", m: [1] })""")
    assert routed["url"] == "/report"  # no separate shuffler: the report goes to the web server as before
