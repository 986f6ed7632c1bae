"""``privrec experiment modes`` with a cell that cannot be calibrated: reported as such, never a crash.

``local-shuffled-items`` shuffles batches of 150 distinct users, 2 per user and epoch: at ε = 0.5 and 1 no blanket of
fake messages reaches (ε, 1e-5) over 2 batches (793 and 225 users would), so those cells are uncalibrated — the
``--quick`` grid used to end there ("no blanket reaches (1, 1e-05) with n = 150 users ...", exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privrec.cli import main
from privrec.experiments import modes
from privrec.experiments.modes import ROWS, ModesConfig, Row, run_modes


def _lastfm_stand_in(n: int, data_dir: str | None) -> dict[str, Any]:
    """A small stand-in for the LastFM arrays (the real files need not be here): 300 events of 200 users in two
    units, 60 items, pools of 5, a planted taste."""
    rng = np.random.default_rng(7)
    n = min(n, 300)
    features = rng.normal(size=(60, 6))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    taste = features[:4].mean(axis=0)
    users = np.array([f"u{i}" for i in rng.integers(0, 200, size=n)])
    units = np.array([int(u[1:]) % 2 for u in users], dtype=np.int64)
    pools = np.stack([rng.choice(60, size=5, replace=False) for _ in range(n)])
    correct = np.array([int(np.argmax(features[p] @ taste)) for p in pools], dtype=np.int64)
    return {"units": units, "users": users, "pools": pools, "features": features, "correct": correct,
            "n_units": 2, "d": 6, "events": n, "pool_size": 5}


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"modes.json holds {name}: JSON has no NaN")
    return json.loads(text, parse_constant=refuse)


def test_modes_cli_reports_an_uncalibrated_cell_and_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(modes, "_lastfm_arrays", _lastfm_stand_in)
    out = tmp_path / "modes"
    rc = main(["experiment", "modes", "--out", str(out), "--rows", "local-shuffled-items", "--runs", "1",
               "--lastfm-events", "300", "--lastfm-runs", "1", "--scaling-users", "", "--population", "",
               "--jobs", "1", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    doc = _strict_json((out / "modes.json").read_text())
    m = doc["modes"]["local-shuffled-items"]
    assert doc["epsilons"] == [0.5, 1.0, 2.0, 5.0, 10.0]
    why = m["lastfm_uncalibrated"]
    assert why[0].startswith("no blanket reaches (0.5, 1e-05) with n = 150 users per batch and 2 batch(es)")
    assert why[1].startswith("no blanket reaches (1, 1e-05) with n = 150 users per batch and 2 batch(es)")
    assert "793 users" in why[0] and "225 users" in why[1]  # the smallest batch that would do (share 0: the whole delta)
    assert why[2:] == [None, None, None]
    # nothing measured in an uncalibrated cell: no value, never a zero; the calibrated cells ran
    assert m["lastfm_ratio"][:2] == [None, None] and m["lastfm_ratio_sd"][:2] == [None, None]
    assert all(isinstance(r, float) and r > 0 for r in m["lastfm_ratio"][2:])
    assert m["lastfm_applied_fraction"][:2] == [None, None] and m["lastfm_applied_fraction"][2] > 0
    assert m["uncalibrated"] == [None] * 5  # the synthetic world has no cell of this row at all
    assert doc["local_pop_target"]["uncalibrated"] is None  # epsilon = 2 is calibrated
    md = (out / "modes.md").read_text()
    ratios = md.split("## LastFM")[1]
    row = next(line for line in ratios.splitlines() if line.startswith("| local-shuffled-items |"))
    cells = [c.strip() for c in row.split("|")[3:8]]  # after the mode and its non-private twin
    assert cells[:2] == ["n/c", "n/c"] and all(c not in ("n/c", "—", "0.00") for c in cells[2:])
    assert "- local-shuffled-items, LastFM, ε = 0.5, 1: " not in md  # two reasons, one line each
    assert "- local-shuffled-items, LastFM, ε = 0.5: no blanket reaches (0.5, 1e-05)" in md
    assert "- local-shuffled-items, LastFM, ε = 1: no blanket reaches (1, 1e-05)" in md
    assert (out / "modes.png").stat().st_size > 0


def test_a_value_error_that_is_not_the_calibrations_still_ends_the_run(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a blanket that cannot be calibrated makes a cell uncalibrated: a broken row is still an error."""
    class Broken:
        def select(self, unit: int, X: np.ndarray) -> int:
            raise ValueError("a bug, not a calibration")

    monkeypatch.setattr(modes, "ROWS", [*ROWS, Row("broken", "raises", lambda *a, **kw: Broken())])
    cfg = ModesConfig(epsilons=(2.0,), runs=1, horizon=50, tick=10, d=4, n_users=2, lastfm=False, scaling_users=(),
                      rows=("broken",))
    with pytest.raises(ValueError, match="a bug, not a calibration"):
        run_modes(cfg, tmp_path, jobs=1, progress=False)


def test_modes_quick_runs_every_cell_of_its_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``privrec experiment modes --quick``'s whole grid — every row, every epsilon, the synthetic world, LastFM (a
    stand-in here), the scaling and population axes — at the smallest sizes that exercise each: every cell ends in a
    value or a reason why it was not calibrated, never a crash (the grid's n/c cells once ended the run)."""
    def numeric_users(n: int, data_dir: str | None) -> dict[str, Any]:  # LastFM's user ids are numbers
        arrays = _lastfm_stand_in(n, data_dir)
        return {**arrays, "users": np.array([u[1:] for u in arrays["users"]])}

    monkeypatch.setattr(modes, "_lastfm_arrays", numeric_users)
    out = tmp_path / "modes"
    rc = main(["experiment", "modes", "--quick", "--out", str(out), "--runs", "1", "--horizon", "200", "--tick",
               "100", "--lastfm-events", "300", "--scaling-users", "3", "--population", "400", "--jobs", "1",
               "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    doc = _strict_json((out / "modes.json").read_text())
    assert set(doc["modes"]) == {r.name for r in ROWS}
    for name, m in doc["modes"].items():
        for value, why in zip(m["lastfm_ratio"], m.get("lastfm_uncalibrated") or [None] * 5, strict=True):
            assert (value is None) != (why is None), f"{name}: LastFM cell with neither a value nor a reason"
        if name not in modes.NEEDS_POOLED_UNITS:
            assert all(isinstance(r, float) for r in m["regret"]), name
    assert doc["scaling"]["n_users"] == [3] and doc["population"]["n_users"] == [400]
