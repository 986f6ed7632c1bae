"""The page at the user-level contribution cap, against real stacks with ``user_cap = 2`` and 0.3 s ticks.

A user who answers past the cap is told on the page, at once, that the model no longer learns from them until
the next epoch (and after how many releases it starts), and the list can be answered again; with the
default ``cap_policy = ignore`` the answer is recorded and ``/feedback`` says ``learning.learned`` false
(reason ``"cap"``), with ``cap_policy = reject`` it is refused with a 403 that says the same. A user under the
cap still sees the page wait for the model and the model learn. Before the page read ``learning``, the
ignored answer left the page on "Waiting for the model to learn it" with every button disabled until the
page gave up after 15 s (no release comes: the capped answer changes no statistic), and the refused one showed
as an error.

One stack per cap policy (module scope); each has its own users, untouched by the other tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.serve.openapi import COMPONENTS
from stacks import LocalStack, web_stack

from .conftest import SETTINGS, user_link

CAP = 2
CAPPED_USER = "5"
FREE_USER = "6"

# Records every text the feedback line and the model-state badge show (a short state is seen even if it
# lasts less than a polling interval of the test).
_RECORD = """() => {
  window.__texts = [];
  for (const id of ['feedback-status', 'model-state']) {
    const n = document.getElementById(id);
    new MutationObserver(() => window.__texts.push(id + ':' + (n.dataset.state || '') + ':' + n.textContent))
      .observe(n, {childList: true, characterData: true, subtree: true, attributes: true});
  }
}"""


@pytest.fixture(scope="module", params=["ignore", "reject"])
def capped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A stack whose users contribute to at most ``CAP`` release ticks per epoch; ``cap_policy`` as the param."""
    settings = {**SETTINGS, "PRIVREC_D": "5", "PRIVREC_N_ARMS": "40", "PRIVREC_USER_CAP": str(CAP),
                "PRIVREC_CAP_POLICY": request.param}
    with web_stack(tmp_path_factory.mktemp(f"page-cap-{request.param}"), settings=settings) as st:
        yield st


def _listen(page: Any) -> tuple[int, dict[str, Any], float]:
    """Click "listen" on the first row; the /feedback answer's status and JSON (its ``learning`` checked against
    the OpenAPI document), and the time of the click."""
    from openapi_schema_validator import OAS30Validator

    name = page.locator("li.item .name > span:first-child").first.inner_text()
    page.evaluate(_RECORD)
    with page.expect_response(lambda r: r.url.endswith("/feedback")) as info:
        t0 = time.monotonic()
        page.get_by_role("button", name=f"Listen to {name}", exact=True).click()
    resp = info.value
    body = resp.json()
    OAS30Validator(COMPONENTS["schemas"]["Learning"]).validate(body["learning"])
    return resp.status, body, t0


def _ticks(stack: LocalStack, user: str) -> int:
    status, b = stack.get_json(f"/budget?user={user}", token=stack.user_token(user))
    assert status == 200, b
    return int(b["user"]["ticks_this_epoch"])


def _open(stack: LocalStack, page: Any, user: str) -> None:
    page.goto(user_link(stack, user))  # with the user's token: their own figures
    page.locator("li.item").first.wait_for()
    page.wait_for_function("document.getElementById('user-interactions').textContent !== '–'")


def _learned(page: Any, stack: LocalStack, user: str, ticks: int) -> None:
    """One answer under the cap: learned, the page waits for the model and says it learned."""
    status, body, _ = _listen(page)
    assert status == 202, body
    assert body["learning"]["learned"] is True and body["learning"]["reason"] is None, body
    assert page.locator("li.item button:enabled").count() == 0  # the list waits for the model
    page.locator('#model-state[data-state="fresh"]', has_text="learned in").wait_for(timeout=10_000)
    texts = page.evaluate("window.__texts")
    assert any(t.startswith("feedback-status::") and "Waiting for the model to learn it" in t for t in texts), texts
    assert any(t.startswith("model-state:learning:") for t in texts), texts
    assert "The list below is re-ranked" in page.locator("#feedback-status").inner_text()
    deadline = time.monotonic() + 10
    while _ticks(stack, user) < ticks:  # the ledger counts the tick (it is what the next answer is judged by)
        assert time.monotonic() < deadline, f"the ledger never counted tick {ticks} of user {user}"
        time.sleep(0.1)


def test_an_answer_past_the_cap_is_said_at_once_and_the_list_can_be_answered(capped: LocalStack, page: Any,
                                                                            tmp_path: Path) -> None:
    _open(capped, page, CAPPED_USER)
    for k in range(1, CAP + 1):
        _learned(page, capped, CAPPED_USER, k)

    policy = capped.env["PRIVREC_CAP_POLICY"]
    for _ in range(2):  # past the cap, and once more: each answer is told, none waits
        first_before = page.evaluate("document.querySelector('li.item').dataset.item")
        status, body, t0 = _listen(page)
        learning = body["learning"]
        if policy == "reject":
            assert status == 403 and body["error"]["parameter"] == "user", body
        else:
            assert status == 202 and body["accepted"] is True, body
        assert learning["learned"] is False and learning["reason"] == "cap", learning
        assert learning["cap"] == CAP and learning["ticks_this_epoch"] == CAP, learning
        left = learning["epoch_releases_left"]
        assert 1 <= left <= (1 << 14) - 1 and learning["epoch_seconds_left_at_least"] == pytest.approx(left * 0.3)

        # the buttons come back at once (the old page kept them disabled until its 15 s learning timeout)
        page.wait_for_function("document.querySelectorAll('li.item button:enabled').length === 16", timeout=5_000)
        waited = time.monotonic() - t0
        text = page.locator("#feedback-status").inner_text()
        assert "no longer learns from you until the next epoch" in text, text
        assert f"after {left:,} more releases" in text, text
        assert "Waiting" not in text and "still learning" not in text, text
        assert waited < 5.0, f"the buttons came back after {waited:.1f} s"  # not the 15 s learning timeout
        assert page.locator("#model-state").get_attribute("data-state") == "capped"
        assert not page.get_by_role("alert").is_visible()  # not an error
        if policy == "ignore":  # recorded: the list is spent, a fresh one is shown
            assert "recorded, but not learned from" in text, text
        else:  # refused: nothing was recorded, the same list is answerable again
            assert "was not accepted" in text, text
            assert page.evaluate("document.querySelector('li.item').dataset.item") == first_before
        assert _ticks(capped, CAPPED_USER) == CAP
        page.screenshot(path=str(tmp_path / f"past-the-cap-{policy}.png"))

    # opened again, the page says so before any answer
    _open(capped, page, CAPPED_USER)
    page.locator('#model-state[data-state="capped"]').wait_for(timeout=5_000)
    assert "You reached the cap" in page.locator("#feedback-status").inner_text()
    assert page.locator("li.item button:enabled").count() == 16
    # the browser logs a refused request itself
    assert [p for p in page.problems if "status of 403" not in p] == []


def test_a_user_under_the_cap_still_sees_the_model_learn(capped: LocalStack, page: Any) -> None:
    _open(capped, page, FREE_USER)
    assert page.locator("#model-state").get_attribute("data-state") == "fresh"
    _learned(page, capped, FREE_USER, 1)
    assert page.problems == []
