"""Browser tests: the web page in headless Chromium against a real stack.

The stack is started once per session (:func:`stacks.web_stack`): a
fresh Tansu broker, a redis-server of its own, one worker with a short release
tick, and ``python -m pipeline.apps.web``. The browser is Debian's Chromium
(``/usr/bin/chromium``; ``scripts/bootstrap.sh`` installs it) driven by
Playwright's Python package; ``playwright install`` is never run (it downloads a
browser build, which fails offline). Run with::

    .venv/bin/python -m pytest -m browser tests/browser

Every page records its console errors and uncaught exceptions in
``page.problems``; tests assert it stays empty where no error is expected.

A user's own figures on the page need their token: :func:`user_link` is the link the operator gives a user
(``privrec token --user U``), with the token in the URL fragment.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks import LocalStack, web_stack

#: Chromium binary (Debian's package); override with PRIVREC_CHROMIUM.
CHROMIUM = os.environ.get("PRIVREC_CHROMIUM", "/usr/bin/chromium")
#: Flags for an offline machine: no background connections, no GPU (Playwright adds --headless,
#: --no-sandbox and a fresh --user-data-dir itself).
CHROMIUM_FLAGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
#: The page must work at this size.
VIEWPORT = {"width": 1280, "height": 800}

#: The world of the browser stack: small, private (so the budget view has something to say),
#: and a short tick so that feedback reaches the served model within about a second.
SETTINGS = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "25", "PRIVREC_N_USERS": "10", "PRIVREC_N_ARMS": "200",
            "PRIVREC_ALGORITHM": "colin", "PRIVREC_EPSILON": "2", "PRIVREC_TICK_SECONDS": "0.3",
            "PRIVREC_LOGLEVEL": "WARNING"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.browser)


def user_link(stack: LocalStack, user: str) -> str:
    """The page for ``user`` with their token in the fragment (the link ``privrec token --user U`` prints)."""
    return f"{stack.base_url}/?user={user}#token={stack.user_token(user)}"


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Broker, redis, worker and web server, ready (a model is published)."""
    with web_stack(tmp_path_factory.mktemp("browser-stack"), settings=SETTINGS) as st:
        yield st


# Package scope, not session: Playwright's sync API keeps an asyncio loop marked running in the
# main thread while it is open, which breaks every later asyncio.run() (the replay tests).
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium under Playwright."""
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.fail(f"Chromium not found at {CHROMIUM}; run scripts/bootstrap.sh (installs Debian's chromium) "
                    f"or set PRIVREC_CHROMIUM")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the `playwright` package is missing; pip install -e '.[test]' (no `playwright install` needed)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context and page at 1280×800; ``page.problems`` collects console errors."""
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    pg.problems = problems
    pg.set_default_timeout(15_000)
    try:
        yield pg
    finally:
        context.close()
