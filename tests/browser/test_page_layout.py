"""The page's list at four window widths: the score breakdown never runs under the listen and skip buttons.

Each row of the list shows an item's score breakdown (the stacked bar and the numbers ``score = estimate
[+ popularity] + bonus``) beside its buttons. At 400, 1024, 1280 and 1920 px (800 px high) the drawn extent
of every row's breakdown — its box, and its text wherever the text runs, since text that overflows its box
leaves the box — must not intersect the box of any listen or skip button, every button must lie inside the
list, and the page must not scroll sideways. A screenshot of each case is kept in the test's ``tmp_path``.

Two lists per width: the list as the stack serves it, and the same list with the widest numbers the page
prints (negative, two digits before the point, with the popularity term of a catalog with an item term,
e.g. LastFM: ``-12.35 = -13.50 + 0.75 + 0.40``) and long names; the second is the case that ran under the
buttons at 1280 px before the layout was fixed (its numbers column was 128 px wide whatever it held).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacks import LocalStack

from .conftest import user_link

USER = "4"
WIDTHS = (400, 1024, 1280, 1920)

# Every row: the breakdown's drawn extent (the .scorebox's box, united with the boxes of its text) and every
# button's box; the list's box; the document's width.
_MEASURE = """() => {
  const box = (r) => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
  const union = (a, b) => ({left: Math.min(a.left, b.left), top: Math.min(a.top, b.top),
                            right: Math.max(a.right, b.right), bottom: Math.max(a.bottom, b.bottom)});
  const rows = [...document.querySelectorAll('li.item')].map((li) => {
    const sb = li.querySelector('.scorebox');
    const range = document.createRange();
    range.selectNodeContents(sb);
    let extent = box(sb.getBoundingClientRect());
    for (const r of range.getClientRects()) if (r.width > 0) extent = union(extent, box(r));
    return {item: li.dataset.item, breakdown: extent, text: li.querySelector('.numbers').textContent,
            buttons: [...li.querySelectorAll('.actions button')].map(
              (b) => ({name: b.getAttribute('aria-label'), ...box(b.getBoundingClientRect())}))};
  });
  return {rows, list: box(document.getElementById('items').getBoundingClientRect()),
          scrollWidth: document.documentElement.scrollWidth};
}"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    """Whether two boxes share an area (touching edges do not)."""
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def _widest(route: Any) -> None:
    """The served list with the widest numbers the page prints and long names (same rec_id and items)."""
    resp = route.fetch()
    body = resp.json()
    for it in body["items"]:
        it.update(score=-12.35, mean=-13.5, popularity=0.75, bonus=0.4,
                  name=f"The Extremely Long Name of an Artist Nobody Can Shorten {it['item']}")
    route.fulfill(response=resp, json=body)


@pytest.fixture(params=WIDTHS, ids=lambda w: f"w{w}")
def sized(request: pytest.FixtureRequest, browser: Any) -> Iterator[Any]:
    """A page at ``width`` × 800; ``page.problems`` collects console errors (as the ``page`` fixture does)."""
    context = browser.new_context(viewport={"width": request.param, "height": 800})
    pg = context.new_page()
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    pg.problems = problems
    pg.width = request.param
    pg.set_default_timeout(15_000)
    try:
        yield pg
    finally:
        context.close()


@pytest.mark.parametrize("numbers", ["served", "widest"])
def test_the_score_breakdown_never_overlaps_the_buttons(stack: LocalStack, sized: Any, numbers: str,
                                                        tmp_path: Path) -> None:
    page = sized
    if numbers == "widest":
        page.route("**/recommend?*", _widest)
    page.goto(user_link(stack, USER))  # with the user's token: their own figures too
    page.locator("li.item").first.wait_for()
    page.wait_for_function("document.getElementById('user-interactions').textContent !== '–'")
    m = page.evaluate(_MEASURE)
    rows = m["rows"]
    assert len(rows) == 8
    if numbers == "widest":
        assert rows[0]["text"] == "-12.35 = -13.50 + 0.75 + 0.40"
    buttons = [b for row in rows for b in row["buttons"]]
    assert len(buttons) == 16
    hits = [(row["item"], row["text"], b["name"]) for row in rows for b in buttons if _overlap(row["breakdown"], b)]
    assert hits == [], f"at {page.width} px the score breakdown overlaps buttons: {hits}"
    page.screenshot(path=str(tmp_path / f"list-{page.width}-{numbers}.png"), full_page=True)
    box = m["list"]
    outside = [b["name"] for b in buttons if b["left"] < box["left"] or b["right"] > box["right"]]
    assert outside == [], f"at {page.width} px buttons stick out of the list: {outside}"
    assert m["scrollWidth"] <= page.width
    assert page.problems == []
