"""Every relative link of the README, CHANGELOG.md and docs/ (notes included) names a file or folder that exists.

Links that leave the repository (``../shared/DESIGN.md``: the team's shared folder next to the checkout) are not
checked: a clean clone elsewhere has no such neighbour."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    targets = [t for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("mailto:")]
    inside = [t for t in targets if (page.parent / t).resolve().is_relative_to(ROOT)]
    missing = [t for t in inside if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("see [there](gone.md) and [here](p.md#top) and [web](https://example.org/x.md)")
    targets = [t for t in LINK.findall(page.read_text()) if "://" not in t]
    assert [t for t in targets if not (page.parent / t).exists()] == ["gone.md"]
