"""The page with codewords: each listen leaves the browser as sealed codeword messages, never in the clear.

Against ``privrec up --mode local --local-codewords 8`` on LastFM (the broker, redis-server, separate shuffler, worker
and web server of :mod:`privrec.ops`; batches of 100, cap 2 per epoch, a lifetime budget of 4 reports): every request
the page makes is recorded, and

* the clicks' envelopes go to the shuffler only (202), with exactly the protocol's fields and ``msgs``; each message
  is a sealed blob of the one size a sealed ``privrec.ItemMessage/1`` has (no codeword index, ``x``, ``m`` or reward
  in the request); between 1 and K + 2 of them per report;
* the analyzer's key (read here from the stack's state directory, as only the worker may) opens each message to
  exactly ``{"schema", "c"}`` with ``c`` in [0, K]: a listen carries the nearest codeword of the listened item, a
  skip the dummy ``K``; the rest are distinct fakes of [0, K] (the dummy is blanketed too);
* the page keeps the cap and the budget with codewords: the third answer of an epoch is refused on the page, the
  fifth report (the budget's ``report_limit``) too, also after a reload;
* the page's sealing in Chromium (``crypto.getRandomValues``: no seed can be fixed) draws ``Bin(K + 1, p) + 1``
  messages, with ``p`` read from ``/local/config``: over the 200 envelopes of rewards 1 and 0 the fakes' total and
  each value's count (the dummy's included) lie inside the exact binomial quantiles at tail probability 10⁻⁶, and
  at reward 1/2 the dummies follow the reward (their count inside the exact law of ``Bin(n, 1/2) + Bin(n, p)``).
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest
from scipy import stats

from models.local.esa import MESSAGE_SCHEMA, message_content, parse_envelope, parse_message
from models.local.seal import AnalyzerKey, b64decode
from pipeline.config.settings import Settings
from privrec import ops
from stacks import up_stack

K = 8  # codewords
BUDGET = 4.0  # at epsilon 2 and cap 2: report_limit = floor(4 / 2) * 2 = 4
ENVELOPE_FIELDS = {"schema", "user", "version", "rec_id", "sealed", "epoch", "msgs"}
#: Two-sided tail probability of each statistical check (a false failure about once in 10^6 runs).
TAIL = 1e-6
#: A sealed message: ephemeral P-256 point (65) + nonce (12) + the plaintext + GCM tag (16); K < 10: one digit.
SEALED_MESSAGE = 65 + 12 + len(message_content(0)) + 16


@pytest.fixture(scope="module")
def cw_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    from producers.lastfm.raw import resolve_data_dir

    try:
        data = resolve_data_dir(None)
    except (OSError, ValueError):
        pytest.skip("the HetRec LastFM data directory is not available (set PRIVREC_DATA_DIR)")
    state = tmp_path_factory.mktemp("cw-page") / "stack"
    settings = Settings(mode="local", namespace="cwpage", catalog="lastfm", data_dir=str(data), local_algorithm="round",
                        shuffle_batch=100, user_cap=2, user_budget=BUDGET, local_codewords=K, epsilon=2.0,
                        algorithm="linucb", tick_seconds=0.3, partitions=1)
    with up_stack(settings, state, timeout=120, supervise=False, loglevel="WARNING"):
        base = ops.read_stack(state)["http"]
        with urllib.request.urlopen(f"{base}/local/config") as resp:
            config = json.loads(resp.read())
        assert config["noise"]["kind"] == "blanket" and config["noise"]["codewords"] == K
        assert 0 < config["noise"]["p"] < 1 and len(config["codebook"]) == K
        assert config["unit"] == "user" and config["cap"] == 2 and config["report_limit"] == 4
        yield base, state, config


def _open_messages(key: AnalyzerKey, body: dict[str, Any]) -> list[int]:
    """The codeword of each sealed message of an envelope, checked to be exactly ``{"schema", "c"}``."""
    out = []
    for text in body["msgs"]:
        assert isinstance(text, str)
        sealed = b64decode(text)
        assert len(sealed) == SEALED_MESSAGE, len(sealed)
        plain = key.open(sealed)
        assert set(json.loads(plain)) == {"schema", "c"}
        out.append(parse_message(plain, codewords=K))  # the analyzer's parser: c in [0, K]
    return out


def _nearest(codebook: np.ndarray, x: list[float]) -> int:
    v = np.asarray(x, dtype=np.float64)
    v = v / max(1.0, float(np.linalg.norm(v)))  # the page clips x to norm 1 first
    return int(np.argmin(((codebook - v) ** 2).sum(axis=1)))


def _assert_fakes(codes: list[int], real: int) -> None:
    """``codes`` minus one ``real`` (the listen or the dummy): distinct fakes among the K + 1 values (the dummy is
    blanketed too: models.local.items.ItemBlanket.randomize)."""
    rest = list(codes)
    rest.remove(real)
    assert len(set(rest)) == len(rest) and all(0 <= c <= K for c in rest), codes


def test_the_page_sends_sealed_codeword_messages_and_keeps_its_cap_and_budget(
        cw_stack: tuple[str, Path, dict[str, Any]], page: Any) -> None:
    base, state, config = cw_stack
    submit = config["esa"]["shuffler"]
    codebook = np.asarray(config["codebook"], dtype=np.float64)
    seen: list[dict[str, Any]] = []
    page.on("request", lambda r: seen.append({"url": r.url, "method": r.method, "body": r.post_data}))
    contexts: dict[str, list[float]] = {}
    page.on("response", lambda r: contexts.update({it["item"]: it["x"] for it in r.json()["items"]})
            if urlparse(r.url).path == "/recommend" and r.status == 200 else None)
    # the page's clock (Playwright's): at the start of the server's current epoch, so that the test's own jumps
    # (past the page's 15 s wait for a model that moves only when a batch of 100 closes) never cross an epoch
    period = config["epoch_seconds"]
    epoch = math.floor(time.time() / period)
    page.clock.install(time=epoch * period + 1.0)
    user = "3"
    page.goto(f"{base}/?user={user}")
    page.locator("li.item").first.wait_for()
    page.locator("#trust-mode", has_text="local").wait_for()

    def click(kind: str, row: int) -> dict[str, Any]:
        item = page.locator("li.item").nth(row).get_attribute("data-item")
        name = page.locator("li.item .name > span:first-child").nth(row).inner_text()
        with page.expect_response(lambda r: r.url == submit and r.request.method == "POST") as info:
            page.get_by_role("button", name=f"{kind} {name}", exact=True).click()
        assert info.value.status == 202, info.value.text()
        settled = page.locator('#model-state[data-state="fresh"], #model-state[data-state="stale"]')
        for _ in range(100):  # the page polls /healthz for 15 s of its clock: move it on
            if settled.count():
                break
            page.clock.fast_forward(2_000)
            page.wait_for_timeout(50)
        settled.wait_for()
        page.locator("li.item button:enabled").first.wait_for()  # the next list
        return {"body": json.loads(info.value.request.post_data), "x": contexts[item], "listen": kind != "Skip"}

    def refused(reason: str) -> None:
        name = page.locator("li.item .name > span:first-child").first.inner_text()
        page.get_by_role("button", name=f"Skip {name}", exact=True).click()
        page.get_by_role("alert").filter(has_text=f"{reason}: this browser made").wait_for()
        page.locator("li.item button:enabled").first.wait_for()

    sent = [click("Listen to", 0), click("Skip", 1)]
    refused("cap")
    page.clock.set_system_time((epoch + 1) * period + 1.0)  # the next epoch
    sent += [click("Listen to", 0), click("Skip", 1)]
    refused("budget")
    page.reload()  # the device's state persists: still at its budget
    page.locator("li.item").first.wait_for()
    refused("budget")

    # the page's own session (POST /session: a new user id of the server's making, no feedback in it) aside
    sessions = [r for r in seen if r["method"] == "POST" and r["url"].endswith("/session")]
    assert all(not r["body"] for r in sessions) and len(sessions) <= 1
    posts = [r for r in seen if r["method"] == "POST" and r not in sessions]
    assert [r["url"] for r in posts] == [submit] * 4  # nothing to the web server, nothing past the cap or budget
    bodies = [s["body"] for s in sent]
    assert [(b["version"], b["epoch"]) for b in bodies] == [(1, epoch), (2, epoch), (3, epoch + 1), (4, epoch + 1)]
    key = AnalyzerKey.from_pem((state / "esa" / "analyzer-key.pem").read_bytes())
    total = 0
    for s, raw in zip(sent, (r["body"] for r in posts)):
        body = s["body"]
        assert set(body) == ENVELOPE_FIELDS and body["user"] == user and isinstance(body["msgs"], list)
        # nothing in the clear: no index, no vector, no reward, no message plaintext
        assert MESSAGE_SCHEMA not in raw and '"c"' not in raw and "reward" not in raw.lower()
        assert all(isinstance(body[f], str) for f in ("schema", "user", "rec_id", "sealed"))
        assert all(isinstance(v, str) for v in body["msgs"])  # the only numbers: the version and the epoch
        assert 1 <= len(body["msgs"]) <= K + 2 and len(set(body["msgs"])) == len(body["msgs"])
        env = parse_envelope(body)  # the shuffler's parser takes what the page made
        assert len(env.msgs) == len(body["msgs"])
        assert not np.any(json.loads(key.open(env.sealed))["m"])  # the content carries nothing: m = 0
        codes = _open_messages(key, body)
        real = _nearest(codebook, s["x"]) if s["listen"] else K  # a listen (reward 1) always sends its codeword
        _assert_fakes(codes, real)
        total += len(codes) - 1
    # the fakes of 4 reports: Bin(4 (K + 1), p)
    p = config["noise"]["p"]
    assert stats.binom.ppf(TAIL / 2, 4 * (K + 1), p) <= total <= stats.binom.isf(TAIL / 2, 4 * (K + 1), p), total
    assert not page.problems, page.problems


def test_the_pages_messages_follow_the_blanket(cw_stack: tuple[str, Path, dict[str, Any]], page: Any) -> None:
    """300 reports built and sealed by the page's own code in Chromium (``buildReport`` and ``envelope``, the path
    of a click's POST), with rewards 1, 0 and 0.5 in turn; every message opened with the analyzer's key."""
    base, state, config = cw_stack
    p = config["noise"]["p"]
    codebook = np.asarray(config["codebook"], dtype=np.float64)
    n = 300
    page.goto(f"{base}/?user=4")
    page.wait_for_function("window.PrivrecLocal !== undefined && window.PrivrecSeal !== undefined")
    page.evaluate("() => { Math.random = () => { throw new Error('Math.random used'); }; }")
    rng = np.random.default_rng(5)  # the listened items' contexts (the page's draws cannot be seeded)
    xs = rng.normal(size=(n, config["d"])) * 0.3
    rewards = [(1.0, 0.0, 0.5)[i % 3] for i in range(n)]
    # an event-level copy of the configuration: the page's cap and budget would stop it after 4 reports
    cfg = {**config, "unit": "event", "report_limit": None}
    bodies = page.evaluate("""async ([config, xs, rewards]) => {
      const L = window.PrivrecLocal, S = window.PrivrecSeal, st = L.newState(config, 'stats'), out = [];
      for (let i = 0; i < xs.length; i++) {
        out.push(await S.envelope(config, L.buildReport(st, config, 'r' + i, 'a', xs[i], rewards[i])));
      }
      return out;
    }""", [cfg, xs.tolist(), rewards])
    key = AnalyzerKey.from_pem((state / "esa" / "analyzer-key.pem").read_bytes())
    fakes: Counter[int] = Counter()
    known = 0
    dummies_at_half = 0
    for x, r, body in zip(xs, rewards, bodies):
        codes = _open_messages(key, body)
        assert 1 <= len(codes) <= K + 2
        if r == 0.5:  # the listen or the dummy, and a fake dummy with probability p: only their count is known
            dummies_at_half += codes.count(K)
            _assert_fakes(codes, K if codes.count(K) == 2 or _nearest(codebook, x.tolist()) not in codes else
                          _nearest(codebook, x.tolist()))
            continue
        real = _nearest(codebook, x.tolist()) if r == 1.0 else K
        _assert_fakes(codes, real)
        rest = list(codes)
        rest.remove(real)
        fakes.update(rest)
        known += 1
    # each of the K + 1 values (the dummy's blanket too) is a fake of a report independently with probability p:
    # its count over the known reports is Bin(known, p), the total Bin(known (K + 1), p) (each bound at tail 1e-6,
    # the per-value ones Bonferroni-split over the K + 1)
    total = sum(fakes.values())
    m = known * (K + 1)
    assert stats.binom.ppf(TAIL / 2, m, p) <= total <= stats.binom.isf(TAIL / 2, m, p), (total, m * p)
    lo, hi = stats.binom.ppf(TAIL / (2 * (K + 1)), known, p), stats.binom.isf(TAIL / (2 * (K + 1)), known, p)
    assert all(lo <= fakes[c] <= hi for c in range(K + 1)), (dict(fakes), lo, hi)
    # at reward 1/2 the dummies are Bin(half, 1/2) (the dummy in place of the listen) + Bin(half, p) (fakes): the
    # exact law by convolution, bounds at tail 1e-6
    half = n // 3
    law = np.convolve(stats.binom.pmf(np.arange(half + 1), half, 0.5), stats.binom.pmf(np.arange(half + 1), half, p))
    cdf = np.cumsum(law)
    lo_h, hi_h = int(np.searchsorted(cdf, TAIL / 2)), int(np.searchsorted(cdf, 1 - TAIL / 2))
    assert lo_h <= dummies_at_half <= hi_h, (dummies_at_half, lo_h, hi_h)
    assert not page.problems, page.problems
