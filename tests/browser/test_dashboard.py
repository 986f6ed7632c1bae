"""The privacy dashboard in headless Chromium: its figures are /budget's, and its charts are drawn."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from stacks import LocalStack, web_stack


def _feedback(stack: LocalStack, user: str) -> None:
    status, rec = stack.get_json(f"/recommend?user={user}&k=2")
    assert status == 200
    status, _ = stack.post_json("/feedback", {"rec_id": rec["rec_id"], "item": rec["items"][0]["item"], "reward": 1})
    assert status == 202


def test_dashboard_figures_equal_budget_and_charts_are_drawn(stack: LocalStack, page: Any, tmp_path: Path) -> None:
    for user in ("7", "8"):  # users no other browser test touches
        _feedback(stack, user)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, b = stack.get_json("/budget")
        if status == 200 and b.get("ledger", {}).get("users", 0) >= 2:
            break
        time.sleep(0.3)
    page.goto(stack.base_url + "/")
    page.get_by_role("link", name="privacy dashboard").click()
    page.wait_for_url("**/dashboard")
    page.wait_for_selector("body[data-loaded=true]")
    for _ in range(20):  # the page polls; compare once both read the same release
        shown = {i: page.locator(f"#{i}").inner_text() for i in
                 ("fig-releases", "fig-users", "fig-at-cap", "fig-cap", "fig-spent-max", "fig-spent-median",
                  "fig-capped", "fig-budget-events", "fig-acl")}
        status, b = stack.get_json("/budget")
        led = b["ledger"]
        expected = {"fig-releases": str(b["releases"]), "fig-users": str(led["users"]),
                    "fig-at-cap": str(led["users_at_cap"]), "fig-cap": str(led["cap"]),
                    "fig-capped": str(led["capped_events"]), "fig-budget-events": str(led["budget_events"]),
                    "fig-acl": "yes" if b["redis_acl"]["enforced"] else "NO (--no-acl)"}
        # JavaScript's toPrecision(3): the same digits as Python's 3 significant ones
        js = page.evaluate("(xs) => xs.map((x) => Number(x).toPrecision(3))", [led["spent_max"], led["spent_median"]])
        expected["fig-spent-max"], expected["fig-spent-median"] = js
        if shown == expected:
            break
        page.reload()
        page.wait_for_selector("body[data-loaded=true]")
    assert shown == expected
    assert led["users"] >= 2 and led["spent_max"] > 0
    # every chart drew something: lines for the time series, bars for the distribution
    assert page.locator("#chart-releases path.series").count() == 1
    assert page.locator("#chart-spent path.series").count() >= 1
    assert page.locator("#chart-hist rect.bar-fill").count() == len(led["spent_histogram"]["counts"])
    assert page.locator("#chart-at-cap path.series").count() == 1
    assert page.problems == []
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)


def test_under_add_remove_the_dashboard_shows_participation_figures_to_the_operator_only(
        tmp_path: Path, page: Any) -> None:
    """The default model (the hierarchy, add/remove): without a token the dashboard shows the guarantee and the
    releases, "–" for every participation figure and says why; opened with the operator token in its fragment it
    shows the ledger's figures, equal to /budget asked with that token — and the token leaves the address bar."""
    from .conftest import SETTINGS

    settings = {k: v for k, v in SETTINGS.items() if k != "PRIVREC_ALGORITHM"}  # linucb: the hierarchy
    with web_stack(tmp_path / "stack", settings=settings) as stack:
        for user in ("1", "2"):
            _feedback(stack, user)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, b = stack.get_json("/budget", token=stack.operator_token)
            if status == 200 and b.get("ledger", {}).get("users", 0) >= 2:
                break
            time.sleep(0.3)
        assert b["privacy"]["relation"] == "add-remove" and b["ledger"]["users"] >= 2
        status, public = stack.get_json("/budget")
        assert status == 200 and "ledger" not in public and public["counts"].startswith("noisy")
        page.goto(stack.base_url + "/dashboard")
        page.wait_for_selector("body[data-loaded=true]")
        assert page.locator("#fig-users").inner_text() == "–"
        assert "operator" in page.locator("#dash-note").inner_text()
        page.goto(f"{stack.base_url}/dashboard#token={stack.operator_token}")
        page.wait_for_selector("body[data-loaded=true]")
        assert "#token" not in page.url
        for _ in range(20):  # the page polls; compare once both read the same release
            status, b = stack.get_json("/budget", token=stack.operator_token)
            shown = page.locator("#fig-users").inner_text()
            if shown == str(b["ledger"]["users"]):
                break
            page.reload()
            page.wait_for_selector("body[data-loaded=true]")
        assert shown == str(b["ledger"]["users"]) and int(shown) >= 2
        assert page.problems == []
