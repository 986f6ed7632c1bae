"""``scripts/restructure.py``: the flat ``pipeline/`` layout rewritten to the subpackages, idempotently.

The lead re-runs the script after merging code written against the flat layout; these tests check
that the tree is already in the new layout (a run would change nothing) and that code in the old
layout is rewritten to imports that exist, the same way a second time.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "restructure.py"


@pytest.fixture(scope="module")
def restructure():
    spec = importlib.util.spec_from_file_location("restructure", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_tree_is_in_the_new_layout() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 moves, 0 files to rewrite" in out.stdout
    assert "still directly in pipeline/" not in out.stdout


def test_every_new_module_exists(restructure) -> None:
    for old, new in restructure.MOVES.items():
        assert not restructure._exists(old), old
        if old not in {"pipeline.esa", "pipeline.shuffler_service", "pipeline.httpstats"}:  # other branches' modules
            assert restructure._exists(new), new
    # no new package is named like an old module: a name is old or new without context
    old_names = {m.split(".")[1] for m in restructure.MOVES}
    new_packages = {p for m in restructure.MOVES.values() for p in m.split(".")[1:-1]}
    assert not old_names & new_packages


OLD_WEB = '''"""The HTTP API: ``python -m pipeline.web``; see :mod:`pipeline.serving`."""
from . import faults, services
from .keys import PublicKeys
from .local_http import add_routes as add_local_routes
from .serving import (
    MAX_K,
    Recommender,
)
from pipeline import acl, services
from pipeline.trusted import TrustedStore
STATIC = "pipeline/static"
PATH = "pipeline/outbox.py"
'''

NEW_WEB = '''"""The HTTP API: ``python -m pipeline.apps.web``; see :mod:`pipeline.serve.serving`."""
from ..config import faults
from .. import services
from ..config.keys import PublicKeys
from ..modes.local.local_http import add_routes as add_local_routes
from ..serve.serving import (
    MAX_K,
    Recommender,
)
from pipeline.config import acl
from pipeline import services
from pipeline.state.trusted import TrustedStore
STATIC = "pipeline/apps/static"
PATH = "pipeline/serve/outbox.py"
'''


def test_old_layout_code_is_rewritten_once(restructure) -> None:
    """A module merged into the moved ``web.py`` with the flat layout's imports, rewritten twice."""
    path = REPO / "pipeline" / "apps" / "web.py"
    once = restructure.rewrite(OLD_WEB, path)
    assert once == NEW_WEB
    assert restructure.rewrite(once, path) == once


def test_a_new_module_left_in_pipeline_is_rewritten(restructure) -> None:
    """A module another branch added directly in ``pipeline/``: its relative imports follow the moves."""
    path = REPO / "pipeline" / "newmodule.py"
    text = "from .stages import ReleaseStage\nfrom . import agents, services\n"
    once = restructure.rewrite(text, path)
    assert once == ("from .release.stages import ReleaseStage\nfrom .ingestion import agents\n"
                    "from . import services\n")
    assert restructure.rewrite(once, path) == once


def test_paths_joined_in_python_and_test_strings(restructure) -> None:
    text = ('web = (REPO / "pipeline" / "web.py").read_text()\n'
            'monkeypatch.setattr("pipeline.trusted.TrustedStore.publish", f)\n'
            'argv = [sys.executable, "-m", "pipeline.worker"]\n')
    once = restructure.rewrite(text, REPO / "tests" / "unit" / "test_x.py")
    assert once == ('web = (REPO / "pipeline" / "apps" / "web.py").read_text()\n'
                    'monkeypatch.setattr("pipeline.state.trusted.TrustedStore.publish", f)\n'
                    'argv = [sys.executable, "-m", "pipeline.apps.worker"]\n')
    assert restructure.rewrite(once, REPO / "tests" / "unit" / "test_x.py") == once
