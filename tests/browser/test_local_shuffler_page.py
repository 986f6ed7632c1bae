"""The page with a separate shuffler: it seals each report and sends it to the shuffler, never to the web server.

Against ``privrec up --mode local --shuffle-batch 3`` on LastFM (the broker, redis-server, shuffler, worker and web
server of :mod:`privrec.ops`): every request the page makes is recorded; the answers go to the shuffler's
``/submit`` (another origin: CORS) as envelopes with exactly the protocol's fields, the shuffler accepts them
(202), nothing goes to ``/report``, ``/feedback`` or ``/listen``, and the analyzer's key (read here from the
stack's state directory, as only the worker may) opens each envelope to a noisy vector of the calibrated size.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

from models.local.esa import parse_content, parse_envelope
from models.local.seal import AnalyzerKey
from pipeline.config.settings import Settings
from privrec import ops
from stacks import up_stack

ENVELOPE_FIELDS = {"schema", "user", "version", "rec_id", "sealed", "epoch"}  # epoch: user level, the cap


@pytest.fixture(scope="module")
def esa_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from producers.lastfm.raw import resolve_data_dir

    try:
        data = resolve_data_dir(None)
    except (OSError, ValueError):
        pytest.skip("the HetRec LastFM data directory is not available (set PRIVREC_DATA_DIR)")
    state = tmp_path_factory.mktemp("esa-page") / "stack"
    settings = Settings(mode="local", namespace="esapage", catalog="lastfm", data_dir=str(data),
                        local_algorithm="round", shuffle_batch=3, epsilon=2.0, tick_seconds=0.3, partitions=1)
    with up_stack(settings, state, timeout=120, supervise=False, loglevel="WARNING"):
        yield ops.read_stack(state)["http"], state


def test_the_page_seals_its_reports_and_sends_them_to_the_shuffler(esa_stack: tuple[str, Path], page: Any) -> None:
    base, state = esa_stack
    with urllib.request.urlopen(f"{base}/local/config") as resp:
        config = json.loads(resp.read())
    submit = config["esa"]["shuffler"]
    assert urlparse(submit).netloc != urlparse(base).netloc  # another origin
    user = "2"
    seen: list[dict[str, Any]] = []
    page.on("request", lambda r: seen.append({"url": r.url, "method": r.method, "body": r.post_data}))
    page.goto(f"{base}/?user={user}")
    page.locator("li.item").first.wait_for()
    page.locator("#trust-mode", has_text="local").wait_for()
    envelopes = []
    for kind, row in (("Listen to", 0), ("Skip", 1)):
        name = page.locator("li.item .name > span:first-child").nth(row).inner_text()
        with page.expect_response(lambda r: r.url == submit and r.request.method == "POST") as info:
            page.get_by_role("button", name=f"{kind} {name}", exact=True).click()
        assert info.value.status == 202, info.value.text()
        envelopes.append(json.loads(info.value.request.post_data))
        # a batch waits for 3 distinct users: the model does not move, and the page says so after its 15 s wait
        page.locator('#model-state[data-state="fresh"], #model-state[data-state="stale"]').wait_for(timeout=30_000)
    # the page's own session (POST /session: a new user id of the server's making, no feedback in it) aside
    sessions = [r for r in seen if r["method"] == "POST" and r["url"].endswith("/session")]
    assert all(not r["body"] for r in sessions) and len(sessions) <= 1
    posts = [r for r in seen if r["method"] == "POST" and r not in sessions]
    assert [r["url"] for r in posts] == [submit, submit]  # nothing to the web server: no /report, /feedback, /listen
    key = AnalyzerKey.from_pem((state / "esa" / "analyzer-key.pem").read_bytes())
    scale = config["noise"]["scale"]
    for version, body in enumerate(envelopes, start=1):
        assert set(body) == ENVELOPE_FIELDS and (body["user"], body["version"]) == (user, version)
        env = parse_envelope(json.dumps(body))  # the shuffler's parser takes what the page made
        m = parse_content(key.open(env.sealed), d=config["d"], algorithm="round")
        # r x + Laplace(scale)^d: the mean of 25 |L| / scale is Gamma(25, 1/25), outside (0.3, 2.3) with
        # probability below 5e-7 on each side (scipy); ||r x|| <= 1 moves the mean of |m| by at most
        # sqrt(25) / 25 = 0.2, under 0.05 * scale
        assert 0.3 * scale < float(np.mean(np.abs(m))) < 2.3 * scale
    assert not page.problems, page.problems
