"""The modes experiment's local rows: real devices, the server's sums, the JSON the issue asks for."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.ground.environment import SyntheticEnvironment
from models.local import LocalConfig, LocalReport, LocalUCB
from models.local.aggregate import clip_context
from models.local.analyzer import Batches, Reports
from models.streaming import UnitStats
from privrec.experiments import modes
from privrec.experiments.modes import ROWS, ModesConfig, _policy, run_modes
from privrec.experiments.runner import derive_seed, simulate

LOCAL_ROWS = ("local-tree", "local-round")


@pytest.mark.parametrize("name", LOCAL_ROWS)
def test_a_local_row_learns_below_random_play_at_epsilon_10(name: str) -> None:
    """Epsilon = inf is not a local configuration (a device without noise would send its exact b_u), so the
    check is the row at epsilon = 10 on a tiny world: finite regret, below uniform random play's."""
    # event level: at user level a device stops after its cap (8 reports in a run of one epoch, out of 600 here);
    # tests/component/test_local_userlevel.py checks that
    cfg = ModesConfig(d=10, n_users=5, horizon=3_000, tick=200, runs=1, local_unit="event")
    env = SyntheticEnvironment(d=cfg.d, n_users=cfg.n_users, horizon=cfg.horizon, seed=cfg.seed)
    row = next(r for r in ROWS if r.name == name)
    policy = _policy(row, 10.0, derive_seed("modes-noise", "synthetic", 0, name, 10.0), cfg, "synthetic",
                     env.n_users, env.d)
    assert isinstance(policy, LocalUCB) and policy.config.algorithm == name.split("-")[1]
    regret, _ = simulate(env, policy, checkpoints=1)  # type: ignore[arg-type]  # any select/update policy
    random_regret, _ = simulate(env, None, checkpoints=1)
    assert math.isfinite(regret)
    assert regret < 0.8 * random_regret
    assert policy.solves == cfg.horizon // cfg.tick  # the server refreshed every tick, like the global row
    assert len(policy._clients) == cfg.n_users       # one device per user (a user is a unit here)


def _spy(policy: LocalUCB) -> list[tuple[LocalReport, int, np.ndarray]]:
    """Every report the twin's server folds, with its unit and its shown context (as the analyzer sees them)."""
    seen: list[tuple[LocalReport, int, np.ndarray]] = []
    fold = policy.fold

    def recording(batch: Reports | Batches) -> None:
        if isinstance(batch, Reports):
            seen.extend((rep, unit, policy.analyzer.contexts(list(rep.shown))[0]) for _, rep, unit in batch.entries)
        fold(batch)

    policy.fold = recording  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("algorithm", ["tree", "round"])
def test_the_simulation_sums_minus_the_devices_noise_are_the_exact_statistics(algorithm: str) -> None:
    """The simulated server (the worker's Analyzer fed by real LocalClients inside LocalUCB) holds the exact per-unit
    statistics plus the devices' noise, nothing else: removing each device's noise (tree: its latest report
    minus its exact b_u; round: each report minus r x) leaves UnitStats.add of the same interactions."""
    d, n_units = 4, 3
    pol = LocalUCB(d=d, n_units=n_units, config=LocalConfig(algorithm=algorithm, d=d, epsilon=1.0, capacity=63),
                   tick=7, seed=5, lambda_=1.0, noise_ridge=2.0)
    seen = _spy(pol)
    rng = np.random.default_rng(0)
    exact = UnitStats.zeros(n_units=n_units, d=d)
    unit_of = {f"u{i}": i % n_units for i in range(8)}
    rewards = []
    for _ in range(120):
        user = f"u{rng.integers(8)}"
        X = rng.normal(size=(5, d)) * rng.uniform(0.3, 1.4)
        k = pol.select(unit_of[user], X)
        r = float(rng.random())
        pol.update(unit_of[user], X[k], r, user=user)
        exact.add(np.array([unit_of[user]]), clip_context(X[k])[None, :], np.array([r]))
        rewards.append(r)
    noise = np.zeros((n_units, d))
    if algorithm == "tree":
        for user, dev in pol._clients.items():
            latest = pol.state.latest[user][1]
            assert latest is not None
            noise[unit_of[user]] += latest - dev.exact_b
    else:
        for (rep, unit, x), r in zip(seen, rewards):
            noise[unit] += rep.vector - r * clip_context(x)
    np.testing.assert_array_equal(pol.state.count, exact.count)
    np.testing.assert_allclose(pol.state.gram, exact.gram, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pol.state.b - noise, exact.b, rtol=0, atol=1e-9)
    assert np.abs(pol.state.b - exact.b).max() > 0.1  # the reports were noisy
    assert len(seen) == 120 and pol.solves == 120 // 7


def test_with_shuffling_only_completed_batches_reach_the_sums() -> None:
    """Staleness is part of the shuffled mode's cost: a unit's reports wait until n distinct users filled its
    batch; the sums hold exactly the completed batches (and a user's second report waits for the next one)."""
    d, n = 3, 4
    cfg = LocalConfig(algorithm="round", d=d, epsilon=2.0, shuffle_batch=n)
    pol = LocalUCB(d=d, n_units=2, config=cfg, tick=1, seed=1)
    x = np.array([0.6, 0.0, 0.8])
    for user in ("a", "b", "c", "a"):       # unit 0: three distinct users, "a" waits for the next batch
        pol.update(0, x, 1.0, user=user)
    assert pol.state.count.tolist() == [0, 0] and pol.reports == 4
    assert modes._local_stats(pol) == {"applied_fraction": 0.0, "batches": 0.0, "noise_std": 0.0, "devices": 3.0,
                                       "refused_fraction": 0.0}
    pol.update(0, x, 1.0, user="d")         # the fourth distinct user closes unit 0's first batch
    assert pol.state.count.tolist() == [n, 0]
    np.testing.assert_allclose(pol.state.gram[0], n * np.outer(x, x))
    assert pol.state.var[0] == pytest.approx(n * 2 * cfg.laplace_scale ** 2)  # Laplace variance 2 s^2
    for user in ("e", "f", "g"):            # another unit's users never fill unit 0's batch
        pol.update(1, x, 0.0, user=user)
    stats = modes._local_stats(pol)
    assert stats is not None and stats["applied_fraction"] == pytest.approx(4 / 8) and stats["batches"] == 1.0


def _fake_lastfm(n_events: int = 600, d: int = 6, pool: int = 5, seed: int = 3) -> dict[str, Any]:
    """A small stand-in for the LastFM arrays: two units (one crowded, one with a few users), a planted taste."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(40, d))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    taste = features[:4].mean(axis=0)
    users = np.array([f"u{i}" for i in rng.integers(0, 30, size=n_events)])
    units = np.array([0 if int(u[1:]) < 25 else 1 for u in users], dtype=np.int64)
    pools = np.stack([rng.choice(40, size=pool, replace=False) for _ in range(n_events)])
    correct = np.array([int(np.argmax(features[p] @ taste)) for p in pools], dtype=np.int64)
    return {"units": units, "users": users, "pools": pools, "features": features, "correct": correct,
            "n_units": 2, "d": d, "events": n_events, "pool_size": pool}


def test_the_json_has_the_issues_shape_with_local_rows_and_scaling(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modes, "_lastfm_arrays", lambda n, data_dir: _fake_lastfm())
    eps = (2.0, 10.0)
    cfg = ModesConfig(epsilons=eps, runs=1, horizon=300, tick=100, d=6, n_users=4, lastfm_events=600,
                      lastfm_runs=1, lastfm_tick=50, shuffle_batch=5, scaling_users=(3, 6),
                      rows=("global", "local-tree", "local-round", "local-shuffled-vectors"), local_unit="event")
    doc = run_modes(cfg, tmp_path, jobs=1, progress=False)
    assert json.loads((tmp_path / "modes.json").read_text()) == json.loads(json.dumps(doc))
    assert doc["epsilons"] == [2.0, 10.0]
    assert set(doc["modes"]) == {"global", "local-tree", "local-round", "local-shuffled-vectors"}
    for name, m in doc["modes"].items():
        assert len(m["regret"]) == len(m["lastfm_ratio"]) == 2
        assert all(isinstance(v, float) and v >= 0 for v in m["lastfm_ratio"])
        if name == "local-shuffled-vectors":  # every synthetic user is their own unit: no batch of distinct users forms
            assert m["regret"] == [None, None]
        else:
            assert all(isinstance(v, float) and math.isfinite(v) for v in m["regret"])
        if name.startswith("local"):
            assert len(m["lastfm_applied_fraction"]) == len(m["lastfm_batches"]) == 2
    assert doc["modes"]["local-tree"]["lastfm_applied_fraction"] == [1.0, 1.0]
    shuffle = doc["modes"]["local-shuffled-vectors"]
    assert all(0.0 < f < 1.0 for f in shuffle["lastfm_applied_fraction"])  # open batches wait: staleness
    assert all(b >= 1 for b in shuffle["lastfm_batches"])
    sc = doc["scaling"]
    assert sc["n_users"] == [3, 6]
    for key in ("global_added", "local_added", "ratio", "nonprivate_regret", "global_regret", "local_regret"):
        assert len(sc[key]) == 2
    assert sc["local_added"][0] == pytest.approx(sc["local_regret"][0] - sc["nonprivate_regret"][0])
    lt = doc["local_target"]
    assert lt["papers_global"] == 0.79 and isinstance(lt["met"], bool) and lt["shuffle_batch"] == 5
    assert lt["untrained_ratio"] == doc["lastfm_untrained_ratio"] > 0
    md = (tmp_path / "modes.md").read_text()
    assert "local-shuffled-vectors" in md and "never refreshes" in md and "N = 6" in md
    assert (tmp_path / "modes.png").stat().st_size > 0


def test_population_axis_in_modes_json(tmp_path: Path) -> None:
    """The population axis (a small population: the 100,000-user run is an experiment, not a test): modes.json
    holds per size the gain kept, (reward - random) / (non-private - random) recomputed here from its parts."""
    cfg = ModesConfig(epsilons=(2.0,), runs=1, horizon=200, tick=100, d=4, n_users=2, lastfm=False, scaling_users=(),
                      rows=("global",), population_sizes=(600,), population_items=100)
    doc = run_modes(cfg, tmp_path, jobs=1, progress=False)
    pop = json.loads((tmp_path / "modes.json").read_text())["population"]
    assert pop["n_users"] == [600] and pop["epsilon"] == 2.0 and len(pop["gain"]) == 1
    (row,) = pop["runs"]
    assert row["events"] == 1_800 and row["random"] == pytest.approx(1_800 / 25)
    assert row["nonprivate"] > row["random"]  # the non-private twin learns the synthetic world
    assert pop["gain"][0] == pytest.approx((row["local_shuffle"] - row["random"]) / (row["nonprivate"] - row["random"]))
    assert 0.0 < row["reached"] <= row["reported"] <= 1.0
    assert "Population axis" in (tmp_path / "modes.md").read_text() and doc["population"]["target"]["met"] is None


def test_population_row_reaches_the_model_and_states_its_target(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """local-shuffled-items on a stand-in for LastFM with 400 users: population-wide batches of distinct users fill
    (every capped report but the last open batch's reaches the model), and modes.json states the 2.0x target."""
    lf = _fake_lastfm(n_events=1_200)
    rng = np.random.default_rng(4)
    lf["users"] = np.array([f"u{i}" for i in rng.integers(0, 400, size=1_200)])
    lf["units"] = np.array([0 if int(u[1:]) < 300 else 1 for u in lf["users"]], dtype=np.int64)
    monkeypatch.setattr(modes, "_lastfm_arrays", lambda n, data_dir: lf)
    cfg = ModesConfig(epsilons=(2.0,), runs=1, horizon=200, tick=100, d=6, n_users=2, lastfm_events=1_200,
                      lastfm_runs=1, lastfm_tick=50, scaling_users=(), rows=("local-shuffled-items",),
                      population_batch=150, population_cap=2, population_codewords=8)
    doc = run_modes(cfg, tmp_path, jobs=1, progress=False)
    m = doc["modes"]["local-shuffled-items"]
    assert m["regret"] == [None]  # no synthetic row: the synthetic world has no item ids
    reported = sum(min(2, c) for c in np.unique(lf["users"], return_counts=True)[1])
    applied = m["lastfm_applied_fraction"][0] * 1_200
    assert reported - 150 < applied <= reported and applied % 150 == 0  # whole batches; the last one waits
    lp = doc["local_pop_target"]
    assert lp["batch"] == 150 and lp["cap"] == 2 and isinstance(lp["met"], bool)
    assert lp["nonprivate"] > 1.0  # the non-private twin learns the planted taste
    assert "population-wide shuffling" in (tmp_path / "modes.md").read_text()
