"""The page on a catalog that takes new users: its first visit makes a user of its own (``POST /session``), whose
token it sends for that user's figures — and for no one else's.

A stack of its own (:func:`stacks.web_stack`) over a catalog directory (users it does not list are
placed by the public rule, :mod:`pipeline.data.catalog_open`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stacks import LocalStack, web_stack
from producers.catalog.generate import write_catalog

from .conftest import SETTINGS


@pytest.fixture(scope="module")
def open_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    root = tmp_path_factory.mktemp("session-page")
    catalog = write_catalog(root / "shop", n_items=60, n_users=20, n_events=0, seed=3)
    settings = {**SETTINGS, "PRIVREC_CATALOG": str(catalog), "PRIVREC_CATALOG_UNITS": "4", "PRIVREC_D": "8",
                "PRIVREC_CACHE_DIR": str(root / "cache")}
    with web_stack(root / "stack", settings=settings) as st:
        yield st


def _figures(page: Any) -> str:
    page.wait_for_function("document.getElementById('user-interactions').textContent !== '–'")
    return str(page.locator("#user-interactions").inner_text())


def test_a_new_visitor_gets_a_user_of_their_own_and_sees_only_their_figures(open_stack: LocalStack,
                                                                            page: Any) -> None:
    sent: list[tuple[str, str | None]] = []
    page.on("request", lambda r: sent.append((r.url, r.headers.get("authorization"))) if "/budget" in r.url else None)
    with page.expect_response(lambda r: r.url.endswith("/session")) as made:
        page.goto(open_stack.base_url + "/")
    session = made.value.json()
    assert made.value.status == 201 and session["user"].startswith("web-")
    user = session["user"]
    page.locator("li.item").first.wait_for()
    assert page.get_by_label("User").input_value() == user  # the page's own user is the one shown
    assert _figures(page) == "0"
    mine = [auth for url, auth in sent if "user=" in url]
    assert mine and set(mine) == {f"Bearer {open_stack.user_token(user)}"}  # the session's token, nothing else

    name = page.locator("li.item .name > span:first-child").first.inner_text()
    with page.expect_response(lambda r: r.url.endswith("/feedback")) as fb:
        page.get_by_role("button", name=f"Listen to {name}", exact=True).click()
    assert fb.value.status == 202
    page.locator('#model-state[data-state="fresh"]', has_text="learned in").wait_for(timeout=10_000)
    page.wait_for_function("document.getElementById('user-interactions').textContent === '1'")

    page.reload()  # a returning visitor is the same user (localStorage), with no new session
    page.locator("li.item").first.wait_for()
    assert page.get_by_label("User").input_value() == user and _figures(page) == "1"

    listed = page.locator("#user option").nth(1).get_attribute("value")  # a user the catalog lists
    assert listed and listed != user
    page.get_by_label("User").select_option(listed)
    note = page.locator("#user-budget-note", has_text="made a user of your own")
    note.wait_for()
    assert user in note.inner_text() and page.locator("#user-interactions").inner_text() == "–"
    assert not [url for url, _ in sent if f"user={listed}" in url]  # never asked for a view it has no token of
    assert page.problems == []


def test_another_visitor_gets_another_user(open_stack: LocalStack, browser: Any) -> None:
    users = []
    for _ in range(2):
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(open_stack.base_url + "/")
            page.locator("li.item").first.wait_for()
            users.append(page.get_by_label("User").input_value())
        finally:
            context.close()
    assert users[0] != users[1] and all(u.startswith("web-") for u in users)
