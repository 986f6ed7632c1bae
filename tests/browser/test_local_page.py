"""The page in local mode is the user's device: it perturbs in the browser and sends only reports.

Against a real local-mode stack (``PRIVREC_MODE=local``, ``PRIVREC_LOCAL_ALGORITHM=tree``):

* every request the page sends is recorded (Playwright's ``request`` event): none goes to
  ``/feedback`` or ``/listen``, no URL or body carries a reward, every POST is a ``/report`` with
  exactly the protocol's fields, and each report's ``b`` is the exact ``b_u`` the test computes from
  the clicked items' contexts and rewards plus noise of the calibrated size (a chi-square check of
  ``b - b_u`` against the BLT's released variance);
* versions are 1, 2, 3, … and continue after a reload; the state is in ``localStorage``;
* a report is stored before it is sent, and a failed POST is re-sent byte for byte (by the idle
  poll and after a reload), never redrawn;
* a page that cannot learn the server's mode sends nothing; the privacy panel states the local
  guarantee, also when ``/budget`` has no ``local`` section;
* ``POST /feedback`` answers 400 naming local mode.

The page's pure functions are checked in the browser: the BLT step against the server's own
``BLTMechanism`` on the same noise (across an epoch boundary), the noise forced to zero giving
``b_u`` exactly, per-round reports, and the samplers' moments over many draws, with tolerances from
the sampling distributions (fixed tail probabilities, not tuned).
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest
from scipy import stats

from models.mechanisms.factorization import BLTMechanism
from stacks import LocalStack, web_stack

from .conftest import SETTINGS, user_link

D = int(SETTINGS["PRIVREC_D"])
#: No "item": the choice is protected; "epoch": user level (local mode's default), the device's epoch of the report.
REPORT_FIELDS = {"schema", "user", "version", "algorithm", "rec_id", "b", "epoch"}
#: Two-sided tail probability of each statistical check (a false failure about once in 10^6 runs).
TAIL = 1e-6


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    settings = {**SETTINGS, "PRIVREC_MODE": "local", "PRIVREC_LOCAL_ALGORITHM": "tree"}
    with web_stack(tmp_path_factory.mktemp("local-page"), settings=settings) as st:
        yield st


@pytest.fixture(scope="module")
def config(local: LocalStack) -> dict[str, Any]:
    with urllib.request.urlopen(f"{local.base_url}/local/config") as resp:
        cfg: dict[str, Any] = json.loads(resp.read())
    assert cfg["mode"] == "local" and cfg["algorithm"] == "tree" and cfg["d"] == D
    assert cfg["mechanism"]["kind"] == "blt" and cfg["mechanism"]["scale"] > 0
    return cfg


def _record(page: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    page.on("request", lambda r: seen.append({"url": r.url, "method": r.method, "body": r.post_data}))
    return seen


def _contexts(page: Any) -> dict[str, list[float]]:
    """Item -> its ``x`` as the page's ``/recommend`` responses gave it."""
    contexts: dict[str, list[float]] = {}

    def remember(resp: Any) -> None:
        if urlparse(resp.url).path == "/recommend" and resp.status == 200:
            for it in resp.json()["items"]:
                contexts[it["item"]] = it["x"]

    page.on("response", remember)
    return contexts


def _stored(page: Any, user: str) -> Any:
    raw = page.evaluate(f"() => localStorage.getItem('privrec.local.' + location.host + '.{user}')")
    return None if raw is None else json.loads(raw)


def _keys(obj: Any) -> set[str]:
    """Every key at any depth of a JSON value."""
    if isinstance(obj, dict):
        return set(obj) | set().union(*(_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj)) if obj else set()
    return set()


def _assert_no_raw_reward(requests: list[dict[str, Any]]) -> None:
    assert requests, "no request was recorded"
    for r in requests:
        path = urlparse(r["url"]).path
        assert path not in ("/feedback", "/listen"), r
        assert "reward" not in r["url"].lower(), r
        if r["method"] != "GET":
            assert r["method"] == "POST" and path == "/report", r
            body = json.loads(r["body"])
            assert set(body) == REPORT_FIELDS, r  # the protocol's fields, nothing else
        if r["body"]:
            assert not any("reward" in k.lower() for k in _keys(json.loads(r["body"]))), r


def _open(page: Any, stack: LocalStack, user: str) -> None:
    page.goto(user_link(stack, user))  # with the user's token: their own figures too
    page.locator("li.item").first.wait_for()
    page.locator("#trust-mode", has_text="local").wait_for()


def _click(page: Any, kind: str, row: int) -> dict[str, Any]:
    """Click listen/skip on ``row``; wait for the model; return the report the page sent (with the clicked item
    under ``"_clicked"``: the report itself never names it)."""
    item_id = page.locator("li.item").nth(row).get_attribute("data-item")
    name = page.locator("li.item .name > span:first-child").nth(row).inner_text()
    with page.expect_response(lambda r: urlparse(r.url).path == "/report") as info:
        page.get_by_role("button", name=f"{kind} {name}", exact=True).click()
    resp = info.value
    assert resp.status == 202, resp.text()
    report: dict[str, Any] = json.loads(resp.request.post_data)
    assert "item" not in report and "shown" not in report  # which item the user acted on stays on the page
    report["_clicked"] = item_id
    page.locator('#model-state[data-state="fresh"], #model-state[data-state="stale"]').wait_for(timeout=20_000)
    return report


def _released_variance(config: dict[str, Any], t: int) -> float:
    """Per-coordinate variance of the device's noise at tick ``t`` of its first epoch (the server's formula)."""
    m = config["mechanism"]
    mech = BLTMechanism(dim=config["d"], capacity=m["capacity"], theta=np.array(m["theta"]), w=np.array(m["w"]),
                        scale=m["scale"], seed=0)
    return mech.prefix_variance(t)


def test_the_page_sends_only_noisy_reports_and_keeps_its_state(local: LocalStack, config: dict[str, Any],
                                                               page: Any) -> None:
    user = "2"
    requests = _record(page)
    contexts = _contexts(page)
    _open(page, local, user)
    exact = np.zeros(D)
    reports = []
    lo, hi = stats.chi2.ppf([TAIL / 2, 1 - TAIL / 2], D)
    for kind, row, reward in (("Listen to", 0, 1.0), ("Skip", 1, 0.0), ("Listen to", 0, 1.0)):
        report = _click(page, kind, row)
        exact += reward * np.asarray(contexts[report["_clicked"]])
        noise = np.asarray(report["b"]) - exact
        assert np.abs(noise).max() > 1e-9, "a report equal to the exact b_u left the page"
        # b = b_u + BLT noise of the calibrated size: sum of squares / variance ~ chi-square(d)
        chi = float(noise @ noise) / _released_variance(config, len(reports) + 1)
        assert lo < chi < hi, (chi, lo, hi)
        reports.append(report)
    assert [r["version"] for r in reports] == [1, 2, 3]
    assert {(r["user"], r["algorithm"], r["schema"]) for r in reports} == {(user, "tree", config["schema"])}
    _assert_no_raw_reward(requests)
    # the device's state is in localStorage, the exact b_u on the device only
    stored = _stored(page, user)
    assert stored["version"] == 3 and stored["pending"] == [] and stored["step"] == 3
    np.testing.assert_allclose(stored["exact"], exact, rtol=0, atol=1e-12)
    # after a reload the state is still there and the versions continue
    page.reload()
    page.locator("li.item").first.wait_for()
    assert _stored(page, user)["version"] == 3
    report = _click(page, "Skip", 2)
    assert report["version"] == 4
    noise = np.asarray(report["b"]) - exact  # a skip: b_u is unchanged, the noise is new
    chi = float(noise @ noise) / _released_variance(config, 4)
    assert lo < chi < hi, (chi, lo, hi)
    _assert_no_raw_reward(requests)
    assert len([r for r in requests if r["method"] == "POST"]) == 4  # one report per click, nothing else
    # the page states the local guarantee
    page.locator("#guarantee-plain", has_text="this page is your device").wait_for()
    assert "on your device" in page.locator("#event-guarantee").inner_text()
    assert "your browser adds the noise" in page.locator("#trust-mode").inner_text()
    # user level: the loss of all of this user's reports together, from /budget (the global mode's fields)
    assert "all your reports together" in page.locator("#user-epsilon-label").inner_text()
    spent = _local_config(config).spent(4)[0]
    page.locator("#user-epsilon", has_text=f"ε = {spent:.2f}").wait_for()
    assert 0 < spent < config["epsilon"]  # 4 of the cap's 8 reports: less than a capped epoch
    assert f"4 of at most {config['cap']} this epoch" in page.locator("#user-budget-note").inner_text()
    assert "blt-exact" in page.locator("#accounting").text_content()  # the server's statement, from /budget
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    assert not page.problems, page.problems


def test_a_failed_report_is_stored_first_and_resent_as_it_was(local: LocalStack, page: Any) -> None:
    user = "5"
    contexts = _contexts(page)
    held: list[Any] = []
    attempts: list[str] = []

    def hold_then_fail(route: Any) -> None:
        attempts.append(route.request.post_data)
        if not held:
            held.append(route)  # the first POST hangs until the test has looked at localStorage
        else:
            route.abort()

    page.route("**/report", hold_then_fail)
    _open(page, local, user)
    item = page.locator("li.item").first.get_attribute("data-item")
    name = page.locator("li.item .name > span:first-child").first.inner_text()
    page.get_by_role("button", name=f"Listen to {name}", exact=True).click()
    while not held:
        page.wait_for_timeout(20)
    # the POST is in flight: the new state and the report are already stored
    stored = _stored(page, user)
    assert stored["version"] == 1 and len(stored["pending"]) == 1
    first = attempts[0]
    assert json.loads(first) == stored["pending"][0]
    np.testing.assert_allclose(stored["exact"], contexts[item], rtol=0, atol=1e-12)
    held[0].abort()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "/report failed" in alert.inner_text()
    assert "not recorded" in page.locator("#feedback-status").inner_text()
    # the idle poll tries again: the same bytes
    while len(attempts) < 2:
        page.wait_for_timeout(100)
    assert attempts[1] == first
    assert _stored(page, user)["pending"] == stored["pending"]

    # a reload (a new page on the same browser storage) sends it again, as it was, and it is accepted
    context = page.context
    page.close()
    again = context.new_page()
    requests = _record(again)
    with again.expect_response(lambda r: urlparse(r.url).path == "/report") as info:
        _open(again, local, user)
    assert info.value.status == 202 and info.value.request.post_data == first
    assert _stored(again, user)["pending"] == []
    report = _click(again, "Skip", 1)
    assert report["version"] == 2
    assert all(a == first for a in attempts)
    _assert_no_raw_reward(requests)


def test_without_the_servers_mode_the_page_sends_nothing(local: LocalStack, page: Any) -> None:
    requests = _record(page)
    page.route("**/local/config", lambda route: route.abort())
    page.goto(f"{local.base_url}/?user=6")
    page.locator("li.item").first.wait_for()
    alert = page.get_by_role("alert")
    alert.wait_for()
    name = page.locator("li.item .name > span:first-child").first.inner_text()
    page.get_by_role("button", name=f"Listen to {name}", exact=True).click()
    page.locator("#feedback-status", has_text="not recorded").wait_for()
    assert "mode is unknown" in alert.inner_text() and "nothing was sent" in alert.inner_text()
    assert not [r for r in requests if r["method"] == "POST"], requests


def test_the_local_guarantee_without_a_local_budget_section(local: LocalStack, config: dict[str, Any],
                                                            page: Any) -> None:
    def strip_local(route: Any) -> None:
        resp = route.fetch()
        body = resp.json()
        body.pop("local", None)
        route.fulfill(response=resp, json=body)

    page.route("**/budget*", strip_local)
    _open(page, local, "7")
    plain = page.locator("#guarantee-plain")
    plain.filter(has_text="this page is your device").wait_for()
    assert f"(ε, δ) = ({config['epsilon']:.2f}" in plain.inner_text()
    assert f"at most {config['cap']} reports per epoch" in plain.inner_text()
    assert "everything you did in an epoch" in plain.inner_text()
    assert "on your device" in page.locator("#event-guarantee").inner_text()
    assert "blt-exact" in page.locator("#mechanism").text_content()  # inside the closed <details>
    assert not page.problems, page.problems


def _local_config(config: dict[str, Any]) -> Any:
    from producers.devices import config_from_public

    return config_from_public(config)


def test_the_page_keeps_its_cap_per_epoch_and_its_lifetime_budget(local: LocalStack, config: dict[str, Any],
                                                                  page: Any) -> None:
    """The page's /local/config is intercepted to a cap of 2 per epoch and a budget of 3 reports; the page's clock
    is set (Playwright's clock) to cross an epoch. Every POST is recorded: 2 in the first epoch, the third click
    refused on the page ("cap"), 1 in the next epoch, then refused ("budget") — also after a reload."""
    assert config["unit"] == "user" and config["cap"] >= 2 and config["report_limit"] > 3

    def small(route: Any) -> None:
        resp = route.fetch()
        route.fulfill(response=resp, json={**resp.json(), "cap": 2, "report_limit": 3})

    user = "8"
    page.route("**/local/config", small)
    start = time.time()
    page.clock.set_fixed_time(start)
    epoch = math.floor(start / config["epoch_seconds"])
    requests = _record(page)
    _open(page, local, user)

    def posts() -> list[dict[str, Any]]:
        return [json.loads(r["body"]) for r in requests if r["method"] == "POST"]

    def refused(reason: str) -> None:
        name = page.locator("li.item .name > span:first-child").first.inner_text()
        page.get_by_role("button", name=f"Skip {name}", exact=True).click()
        page.get_by_role("alert").filter(has_text=f"{reason}: this browser made").wait_for()
        page.locator("li.item button:enabled").first.wait_for()  # a fresh list after the refusal

    _click(page, "Listen to", 0)
    _click(page, "Skip", 1)
    refused("cap")
    assert [(p["version"], p["epoch"]) for p in posts()] == [(1, epoch), (2, epoch)]
    assert _stored(page, user)["ledger"] == {"epoch": epoch, "k": 2}
    page.clock.set_fixed_time(start + config["epoch_seconds"])  # the next epoch
    _click(page, "Skip", 0)
    refused("budget")
    assert [(p["version"], p["epoch"]) for p in posts()] == [(1, epoch), (2, epoch), (3, epoch + 1)]
    page.reload()  # the state persists: still at the budget
    page.locator("li.item").first.wait_for()
    refused("budget")
    assert len(posts()) == 3 and _stored(page, user)["version"] == 3
    _assert_no_raw_reward(requests)


def test_feedback_with_a_raw_reward_is_refused_in_local_mode(local: LocalStack) -> None:
    status, rec = local.get_json("/recommend?user=2&k=2")
    assert status == 200 and all(len(it["x"]) == D for it in rec["items"])
    status, body = local.post_json("/feedback", {"rec_id": rec["rec_id"], "item": rec["items"][0]["item"],
                                                 "reward": 1})
    assert status == 400 and "local mode" in body["error"]["message"]


# ---------- the pure functions, in the browser -------------------------------------------


def test_blt_step_is_the_servers_mechanism(local: LocalStack, config: dict[str, Any], page: Any) -> None:
    page.goto(f"{local.base_url}/?user=2")
    page.wait_for_function("window.PrivrecLocal !== undefined")
    cap, ticks = 3, 8  # two epoch boundaries
    cfg = {**config, "mechanism": {**config["mechanism"], "capacity": cap}}
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(ticks, D)) * 0.2
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    zs = rng.normal(size=(ticks, D)) * cfg["mechanism"]["scale"]
    out = page.evaluate("""([config, xs, rewards, zs]) => {
      const L = window.PrivrecLocal;
      const st = L.newState(config, 'probe'), zero = L.newState(config, 'zero');
      const reps = [], exact = [];
      xs.forEach((x, t) => {
        reps.push(L.buildReport(st, config, 'r' + t, 'a', x, rewards[t], (i) => zs[t][i]).b);
        exact.push(L.buildReport(zero, config, 'r' + t, 'a', x, rewards[t], () => 0).b);
      });
      return {reps, exact, versions: st.pending.map((p) => p.version), step: st.step};
    }""", [cfg, xs.tolist(), rewards, zs.tolist()])

    class Fixed:  # the same z the page drew: tick t of epoch e is global tick e * cap + t - 1
        def normal(self, scale: float, shape: tuple[int, ...], *, epoch: int, level: int, index: int) -> Any:
            return zs[epoch * cap + index - 1]

    m = cfg["mechanism"]
    mech = BLTMechanism(dim=D, capacity=cap, theta=np.array(m["theta"]), w=np.array(m["w"]), scale=m["scale"], seed=0)
    mech._source = Fixed()
    state, running = mech.init_state(), np.zeros(D)
    for t in range(ticks):
        running = running + rewards[t] * xs[t]
        release, state, _ = mech.step_to(state, running)
        np.testing.assert_allclose(out["reps"][t], release, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out["exact"][t], running, rtol=0, atol=1e-12)  # no noise: b_u exactly
    assert out["versions"] == list(range(1, ticks + 1)) and out["step"] == ticks % cap


def test_round_reports_and_the_samplers(local: LocalStack, config: dict[str, Any], page: Any) -> None:
    page.goto(f"{local.base_url}/?user=2")
    page.wait_for_function("window.PrivrecLocal !== undefined")
    page.evaluate("() => { Math.random = () => { throw new Error('Math.random used'); }; }")
    n = 20_000
    sigma = config["mechanism"]["scale"]
    out = page.evaluate("""([n, sigma, schema]) => {
      const L = window.PrivrecLocal;
      const moments = (zs) => { let s = 0, s2 = 0, a = 0; const k = zs.length;
        for (const z of zs) { s += z; s2 += z * z; a += Math.abs(z); }
        return {mean: s / k, var: (s2 - s * s / k) / (k - 1), abs: a / k, n: k}; };
      const draws = (f) => Array.from({length: n}, f);
      let lo = 1, hi = 0;
      for (let i = 0; i < n; i++) { const u = L.uniform(); lo = Math.min(lo, u); hi = Math.max(hi, u); }
      // per-round reports: m = r x (clipped to norm 1) + the configured noise
      const round = (noise) => ({mode: 'local', algorithm: 'round', d: 3, epsilon: 1, delta: 1e-5, schema,
                                 mechanism: null, noise, shuffle_batch: 0});
      const st = L.newState(round({kind: 'gaussian', sigma: 1}), 'r');
      const exactM = L.buildReport(st, round({kind: 'gaussian', sigma: 1}), 'q', 'a', [3, 0, 4], 1, () => 0).m;
      const noiseOf = (noise) => { const c = round(noise), s = L.newState(c, 'r'), zs = [];
        for (let i = 0; i < n / 4; i++) zs.push(...L.buildReport(s, c, 'q' + i, 'a', [0.5, 0.5, 0.5], 0).m);
        return zs; };
      const g = noiseOf({kind: 'gaussian', sigma: 1}), l = noiseOf({kind: 'laplace', scale: 1, epsilon0: 1});
      return {gauss: moments(draws(() => L.gaussian(sigma))), laplace: moments(draws(() => L.laplace(2))), lo, hi,
              exactM, version: st.version, roundGauss: moments(g), roundLaplace: moments(l)};
    }""", [n, sigma, config["schema"]])
    assert 0 < out["lo"] and out["hi"] <= 1

    def gaussian_ok(m: dict[str, float], s: float) -> None:
        k = int(m["n"])
        assert abs(m["mean"]) < 4 * s / math.sqrt(k), m  # the sample mean ~ N(0, s^2 / k)
        lo, hi = stats.chi2.ppf([TAIL / 2, 1 - TAIL / 2], k - 1) / (k - 1)  # (k - 1) S^2 / s^2 ~ chi2(k - 1)
        assert lo < m["var"] / s**2 < hi, (m, lo, hi)

    def laplace_ok(m: dict[str, float], b: float) -> None:
        k = int(m["n"])
        z = stats.norm.ppf(1 - TAIL / 2)
        assert abs(m["mean"]) < 4 * math.sqrt(2) * b / math.sqrt(k), m  # variance 2 b^2
        assert abs(m["var"] - 2 * b**2) < z * math.sqrt(20 / k) * b**2, m  # Var(X^2) = 24 b^4 - 4 b^4
        assert abs(m["abs"] - b) < z * b / math.sqrt(k), m  # |X| ~ Exp(b): mean b, sd b

    assert out["gauss"]["n"] == out["laplace"]["n"] == n
    gaussian_ok(out["gauss"], sigma)
    laplace_ok(out["laplace"], 2.0)
    # a per-round report without noise is r x, x clipped to norm 1; with noise, the configured kind
    np.testing.assert_allclose(out["exactM"], [0.6, 0.0, 0.8], rtol=0, atol=1e-15)
    assert out["version"] == 1
    assert out["roundGauss"]["n"] == out["roundLaplace"]["n"] == 3 * (n // 4)
    gaussian_ok(out["roundGauss"], 1.0)
    laplace_ok(out["roundLaplace"], 1.0)


def test_the_dashboard_shows_the_devices_ledger(local: LocalStack, page: Any) -> None:
    """Local mode at user level: the dashboard's figures are /budget's ledger (the global mode's fields), from the
    ledger the worker keeps of the devices' reports."""
    status, b = local.get_json("/budget")
    assert status == 200 and b["privacy"]["mode"] == "local" and b["privacy"]["unit"] == "user"
    page.goto(local.base_url + "/dashboard")
    page.wait_for_selector("body[data-loaded=true]")
    for _ in range(20):
        shown = {i: page.locator(f"#{i}").inner_text() for i in ("fig-users", "fig-at-cap", "fig-cap", "fig-capped")}
        status, b = local.get_json("/budget")
        led = b["ledger"]
        expected = {"fig-users": str(led["users"]), "fig-at-cap": str(led["users_at_cap"]),
                    "fig-cap": str(led["cap"]), "fig-capped": str(led["capped_events"])}
        if shown == expected:
            break
        page.reload()
        page.wait_for_selector("body[data-loaded=true]")
    assert shown == expected and led["users"] >= 1 and led["cap"] == b["privacy"]["cap"]
    assert page.locator("#dash-note").inner_text() == b["privacy"]["statement"]  # the server's words, not its own
    assert b["privacy"]["statement"].startswith("per epoch of ") and "a device makes at most" in b["privacy"]["statement"]
    assert not page.problems, page.problems
