"""The house's layers (``[tool.importlinter]`` in ``pyproject.toml``), checked by ``lint-imports``.

Every contract must be kept: the CLI above the pipeline above the producers above ``models``;
inside ``models`` policies and stages above mechanisms above accounting above the shared ground;
inside ``pipeline`` the processes above the modes above the flow above the trusted store and the
data above the config, the two modes apart, no web framework below ``serve``; no import cycles
between sibling modules; serving never importing the trusted store. A second test
adds a wrong-way import to a copy of the tree and checks that the linter catches it, so the
contracts cannot silently stop checking anything.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).parent / "lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT, "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


def test_every_layer_contract_is_kept() -> None:
    out = _lint(REPO)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_a_wrong_way_import_breaks_a_contract(tmp_path: Path) -> None:
    for pkg in ("models", "pipeline", "producers", "privrec"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    base = tmp_path / "models" / "mechanisms" / "base.py"
    base.write_text(base.read_text() + "\nfrom models.policies import kronecker  # wrong way: mechanisms -> policies\n")
    serving = tmp_path / "pipeline" / "serve" / "serving.py"
    serving.write_text(serving.read_text() + "\nfrom pipeline.state import trusted  # serving -> trusted store\n")
    wrong_way = {  # pipeline's contracts: the layers, the modes apart, no web framework below serve
        ("config", "keys.py"): "from pipeline.data import records  # config -> data: upward",
        ("modes", "local", "localmode.py"): "from pipeline.modes.federated import federation  # local -> federated",
        ("release", "stages.py"): "import aiohttp  # release -> the web framework",
    }
    for parts, line in wrong_way.items():
        module = tmp_path.joinpath("pipeline", *parts)
        module.write_text(module.read_text() + f"\n{line}\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    assert "models.mechanisms is not allowed to import models.policies" in out.stdout
    assert "pipeline.serve is not allowed to import pipeline.state" in out.stdout
    assert "pipeline.serve.serving -> pipeline.state.trusted" in out.stdout
    assert "pipeline.config is not allowed to import pipeline.data" in out.stdout
    assert "pipeline.modes.local is not allowed to import pipeline.modes.federated" in out.stdout
    assert "pipeline.release is not allowed to import aiohttp" in out.stdout
