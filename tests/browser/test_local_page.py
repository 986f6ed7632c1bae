"""The page in local mode is the user's device: it perturbs in the browser and sends only reports.

Every request the page sends is recorded (Playwright's ``request`` event): none goes to ``/feedback`` or
``/listen``, no body carries a reward, and each ``POST /report`` carries a vector that differs from the
exact ``b_u`` the test computes itself from the clicked items' contexts and rewards. The state survives a
reload (versions continue). The page's pure functions are checked in the browser: the BLT step with its
noise forced to zero reproduces ``b_u`` exactly, and the Gaussian sampler's mean and variance over 20,000
draws fall within tolerances derived from their sampling distributions.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from privrec.bench.serve import LocalStack, local_stack

from .conftest import SETTINGS

USER = "2"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    settings = {**SETTINGS, "PRIVREC_MODE": "local", "PRIVREC_LOCAL_ALGORITHM": "tree", "PRIVREC_ALGORITHM": "linucb"}
    with local_stack(tmp_path_factory.mktemp("local-page"), settings=settings) as st:
        yield st


def _record(page: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    page.on("request", lambda r: seen.append({"url": r.url, "method": r.method, "body": r.post_data}))
    return seen


def _click(page: Any, kind: str, row: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Click listen/skip on ``row``; return (the clicked item as /recommend gave it, the report sent)."""
    item_id = page.locator("li.item").nth(row).get_attribute("data-item")
    name = page.locator("li.item .name > span:first-child").nth(row).inner_text()
    with page.expect_response(lambda r: r.url.endswith("/report")) as info:
        page.get_by_role("button", name=f"{kind} {name}", exact=True).click()
    resp = info.value
    assert resp.status == 202, resp.text()
    report = json.loads(resp.request.post_data)
    assert report["item"] == item_id
    page.locator('#model-state[data-state="fresh"], #model-state[data-state="stale"]').wait_for(timeout=15_000)
    return {"item": item_id}, report


def test_the_page_sends_only_noisy_reports_and_keeps_its_state(local: LocalStack, page: Any) -> None:
    requests = _record(page)
    contexts: dict[str, list[float]] = {}

    def remember(resp: Any) -> None:
        if "/recommend" in resp.url and resp.status == 200:
            for it in resp.json()["items"]:
                contexts[it["item"]] = it["x"]

    page.on("response", remember)
    page.goto(f"{local.base_url}/?user={USER}")
    page.locator("li.item").first.wait_for()
    assert "local" in page.locator("#trust-mode").inner_text()
    assert "browser adds the noise" in page.locator("#trust-mode").inner_text()
    exact = np.zeros(int(SETTINGS["PRIVREC_D"]))
    reports = []
    for kind, row, reward in (("Listen to", 0, 1.0), ("Skip", 1, 0.0), ("Listen to", 0, 1.0)):
        item, report = _click(page, kind, row)
        x = np.asarray(contexts[item["item"]])
        exact += reward * x
        b = np.asarray(report["b"])
        assert np.abs(b - exact).max() > 1e-6, "a report equal to the exact b_u left the page"
        reports.append(report)
    assert [r["version"] for r in reports] == [1, 2, 3]
    # nothing but reports: no /feedback, no /listen, no reward anywhere in a request
    assert not [r for r in requests if r["url"].endswith(("/feedback", "/listen"))]
    for r in requests:
        if r["body"]:
            assert "reward" not in json.loads(r["body"]), r
    # the device's state is in localStorage; after a reload the versions continue
    stored = json.loads(page.evaluate(f"() => localStorage.getItem('privrec.local.' + location.host + '.{USER}')"))
    assert stored["version"] == 3 and stored["pending"] == []
    np.testing.assert_allclose(stored["exact"], exact, atol=1e-12)  # on the device only
    page.reload()
    page.locator("li.item").first.wait_for()
    _, report = _click(page, "Skip", 2)
    assert report["version"] == 4
    # the page states the local guarantee
    page.locator("#guarantee-plain", has_text="this page is your device").wait_for()
    assert "on your device" in page.locator("#event-guarantee").inner_text()
    assert not page.problems, page.problems


def test_feedback_with_a_raw_reward_is_refused_in_local_mode(local: LocalStack) -> None:
    status, rec = local.get_json(f"/recommend?user={USER}&k=2")
    status, body = local.post_json("/feedback", {"rec_id": rec["rec_id"], "item": rec["items"][0]["item"],
                                                 "reward": 1})
    assert status == 400 and "local mode" in body["error"]["message"]


def test_the_pages_noise_and_mechanism_in_the_browser(local: LocalStack, page: Any) -> None:
    page.goto(f"{local.base_url}/?user={USER}")
    page.locator("li.item").first.wait_for()
    with urllib.request.urlopen(f"{local.base_url}/local/config") as resp:
        config = json.loads(resp.read())
    # with the noise forced to zero the BLT step releases the exact running sum
    d = config["d"]
    out = page.evaluate("""(config) => {
      const L = window.PrivrecLocal;
      const st = L.newState(config, 'probe');
      const reps = [];
      for (let t = 0; t < 5; t++) {
        const x = Array.from({length: config.d}, (_, i) => 0.03 * ((i + t) % 7) - 0.05);
        reps.push(L.buildReport(st, config, 'r' + t, 'a', x, t % 2, () => 0).b);
      }
      return {reps, exact: st.exact};
    }""", config)
    running = np.zeros(d)
    for t, b in enumerate(out["reps"]):
        running += (t % 2) * np.array([0.03 * ((i + t) % 7) - 0.05 for i in range(d)])
        np.testing.assert_allclose(b, running, atol=1e-12)
    # the Gaussian sampler: 20,000 draws of N(0, 1)
    n = 20_000
    stats = page.evaluate(f"""() => {{
      const L = window.PrivrecLocal; let s = 0, s2 = 0;
      for (let i = 0; i < {n}; i++) {{ const z = L.gaussian(1); s += z; s2 += z * z; }}
      const m = s / {n}; return {{mean: m, var: s2 / {n} - m * m, u: L.uniform()}};
    }}""")
    # sample mean ~ N(0, 1/n); sample variance ~ N(1, 2/n): six standard errors
    assert abs(stats["mean"]) < 6 / math.sqrt(n)
    assert abs(stats["var"] - 1.0) < 6 * math.sqrt(2 / n)
    assert 0 < stats["u"] <= 1
    # the page's noise scale is the server's calibration (the BLT scale every device of this stack uses)
    assert config["mechanism"]["kind"] == "blt" and config["mechanism"]["scale"] > 0
