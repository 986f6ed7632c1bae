"""``mypy --strict`` on ``models/`` (STYLE.md: no per-package escape list)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("mypy") is None and not (Path(sys.executable).parent / "mypy").exists(),
                    reason="mypy is not installed (it is in the `test` extra)")
def test_models_pass_mypy_strict() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "models"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]
