"""The baselines' streaming API (``release_from_stats``): twins of the offline path, public-count advancing, restore."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.policies.peruser import PerUserLinUCB, ServingModels
from models.policies.baselines import BASELINES, make_baseline
from models.streaming import ReleasedStats, UnitStats, solve

N, D = 3, 4


def _events(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` interactions: units, contexts of norm <= 1 (some exactly 0), rewards in [0, 1]."""
    rng = np.random.default_rng(seed)
    units = rng.integers(0, N, n)
    X = rng.uniform(-1, 1, (n, D))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None] * 1.000001
    X[::17] = 0.0
    r = rng.random(n)
    r[::5] = rng.integers(0, 2, len(r[::5]))
    return units, X, r


def _make(name: str, epsilon: float, **kw: object) -> PerUserLinUCB:
    kw.setdefault("user_horizon", 15)
    return make_baseline(name, d=D, n_users=N, lambda_=1.0, epsilon=epsilon, delta=1e-5, seed=11,
                         **kw)  # type: ignore[arg-type]


def _offline_models(pol: PerUserLinUCB) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    models = [pol.serving_model(u) for u in range(N)]
    return (np.array([m[0] for m in models]), np.array([m[1] for m in models]), np.array([m[2] for m in models]))


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_noise_off_stream_is_linucb_and_the_offline_twin(name: str) -> None:
    """Same math, different float order: Sherman–Morrison per event offline, one inverse per release here."""
    units, X, r = _events(600, seed=1)
    offline = _make(name, math.inf, tick=len(units))  # one release, after the last event
    for u, x, y in zip(units, X, r):
        offline.update(int(u), x, float(y))
    stats = UnitStats.zeros(n_units=N, d=D)
    stats.add(units, X, r)
    rel = _make(name, math.inf).release_from_stats(stats.gram, stats.b, stats.count)
    assert rel.advanced.tolist() == [0, 1, 2] and rel.count.tolist() == stats.count.tolist()
    theta, C, width = _offline_models(offline)
    # lambda = 1, ||x|| <= 1, ~200 events per unit: cond(lambda I + G) <= 201, so the two computations of
    # (lambda I + G)^{-1} b agree to ~cond * n * 1e-16 ~ 1e-11 relative
    np.testing.assert_allclose(rel.theta, theta, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rel.conf, C, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rel.width, width, rtol=1e-9)
    # and exactly the pipeline's non-private LinUCB serving model (models.streaming.solve)
    lin_theta, lin_M = solve(ReleasedStats("linucb", np.eye(N), stats.gram, stats.b.reshape(-1), stats.count),
                             lambda_=1.0)
    np.testing.assert_allclose(rel.theta, lin_theta, rtol=1e-12, atol=1e-15)
    assert rel.conf.tobytes() == lin_M.tobytes()


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_noise_on_stream_matches_the_offline_path_at_the_same_ticks(name: str) -> None:
    """Released at the same ticks, the same units advance, the same keyed noise is drawn: only float order differs."""
    tick = 7
    units, X, r = _events(140, seed=2)
    offline = _make(name, 1.0, tick=tick, user_horizon=7)
    stream = _make(name, 1.0, user_horizon=7)
    stats = UnitStats.zeros(n_units=N, d=D)
    for start in range(0, len(units), tick):
        sl = slice(start, start + tick)
        for u, x, y in zip(units[sl], X[sl], r[sl]):
            offline.update(int(u), x, float(y))
        stats.add(units[sl], X[sl], r[sl])
        rel = stream.release_from_stats(stats.gram, stats.b, stats.count)
        theta, C, width = _offline_models(offline)
        np.testing.assert_allclose(rel.theta, theta, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(rel.conf, C, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(rel.width, width, rtol=1e-9)
    assert [s.step for s in stream.states] == [s.step for s in offline.states]
    assert [s.epoch for s in stream.states] == [s.epoch for s in offline.states]
    assert min(s.epoch for s in stream.states) >= 1  # ~18 releases per unit > 15: every tree rolled over


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_the_public_count_decides_which_units_advance(name: str) -> None:
    pol = _make(name, 1.0)
    units, X, r = _events(30, seed=3)
    stats = UnitStats.zeros(n_units=N, d=D)
    stats.add(units, X, r)
    first = pol.release_from_stats(stats.gram, stats.b, stats.count)
    steps = [s.step for s in pol.states]
    # unit 0: new values, same count -> nothing moves (a value never decides)
    gram, b = stats.gram.copy(), stats.b.copy()
    gram[0] += np.eye(D)
    b[0] += 1.0
    # unit 1: one more interaction with context 0 (statistics unchanged) -> its tree advances anyway
    counts = stats.count.copy()
    counts[1] += 1
    second = pol.release_from_stats(gram, b, counts)
    assert second.advanced.tolist() == [1]
    assert [s.step for s in pol.states] == [steps[0], steps[1] + 1, steps[2]]
    for u in (0, 2):
        assert second.theta[u].tobytes() == first.theta[u].tobytes()
        assert second.conf[u].tobytes() == first.conf[u].tobytes()
        assert second.width[u] == first.width[u]
    if name.startswith("SS-"):  # fresh node noise on unit 1's released Gram
        assert second.conf[1].tobytes() != first.conf[1].tobytes()


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_stream_state_round_trips_and_partial_writes_add_up(name: str) -> None:
    units, X, r = _events(200, seed=4)
    a, stored = _make(name, 2.0), {}
    stored.update(a.stream_state())  # what a fresh namespace holds after its first write
    stats = UnitStats.zeros(n_units=N, d=D)
    for start in range(0, 100, 9):
        stats.add(units[start:start + 9], X[start:start + 9], r[start:start + 9])
        rel = a.release_from_stats(stats.gram, stats.b, stats.count)
        stored.update(a.stream_state(rel.advanced))  # the pipeline writes only the units that moved
    assert stored == a.stream_state()
    b = _make(name, 2.0)
    b.load_stream_state({k.encode(): v for k, v in stored.items()})  # as redis-py returns a hash
    assert b.stream_state() == stored
    assert b.serving_models().to_mapping() == a.serving_models().to_mapping()
    for start in range(100, 200, 13):
        stats.add(units[start:start + 13], X[start:start + 13], r[start:start + 13])
        ra = a.release_from_stats(stats.gram, stats.b, stats.count)
        rb = b.release_from_stats(stats.gram, stats.b, stats.count)
        assert ra.to_mapping() == rb.to_mapping()
    assert ServingModels.from_mapping(ra.to_mapping()).to_mapping() == ra.to_mapping()


def test_user_horizon_sizes_each_units_tree() -> None:
    assert _make("SS-LinUCB-Gaussian", 1.0).mechanisms[0].levels == 5  # 1 + ceil(log2 15), the paper's m
    assert _make("SS-LinUCB-Gaussian-tight", 1.0).mechanisms[0].levels == 4  # bitlength(15)
    assert _make("SS-LinUCB-Wishart", 1.0).mechanisms[0].levels == 5
    assert _make("DGS-LinUCB-Laplace", 1.0).mechanisms[0].levels == 5  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="`user_horizon` must be a positive"):
        _make("DGS-LinUCB-Gaussian", 1.0, **{"user_horizon": 0})


def test_bad_stream_inputs_name_the_parameter() -> None:
    pol = _make("SS-LinUCB-Gaussian-tight", 1.0)
    G, b = np.zeros((N, D, D)), np.zeros((N, D))
    with pytest.raises(ValueError, match=r"`gram` must have shape \(3, 4, 4\)"):
        pol.release_from_stats(G[:2], b, np.zeros(N, dtype=np.int64))
    with pytest.raises(ValueError, match=r"`b` must have shape \(3, 4\)"):
        pol.release_from_stats(G, b[:, :2], np.zeros(N, dtype=np.int64))
    with pytest.raises(ValueError, match="`counts` must be an integer array"):
        pol.release_from_stats(G, b, np.zeros(N))
    pol.release_from_stats(G, b, np.array([2, 0, 1]))
    with pytest.raises(ValueError, match="`counts` must never decrease: unit 0 had 2"):
        pol.release_from_stats(G, b, np.array([1, 0, 1]))


# --------------------------------------------------------------------------- pipeline settings and statements


def test_settings_select_the_baselines_and_record_their_own_mechanism() -> None:
    import argparse

    from pipeline.config.settings import ALGORITHMS, BASELINE_ALGORITHMS, Settings, add_arguments

    assert set(BASELINE_ALGORITHMS.values()) == set(BASELINES) and set(BASELINE_ALGORITHMS) <= set(ALGORITHMS)
    s = Settings.from_mapping({"algorithm": "ss-wishart", "mechanism": "paper"}, environ={})
    assert s.baseline == "SS-LinUCB-Wishart" and s.model_config()["mechanism"] == "SS-LinUCB-Wishart"
    assert Settings.from_mapping({"mechanism": "paper"}, environ={}).model_config()["mechanism"] == "paper"
    assert Settings.from_mapping({}, environ={}).baseline is None
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split()).replace("- ", "-")  # undo argparse's wrapping at hyphens
    for name in BASELINE_ALGORITHMS:
        assert name in text


@pytest.mark.parametrize("algorithm", ["ss-gaussian", "ss-gaussian-tight", "ss-wishart", "dgs-laplace",
                                       "dgs-gaussian"])
def test_privacy_statement_of_each_baseline(algorithm: str) -> None:
    from pipeline.data.catalog import SyntheticCatalog
    from pipeline.release.baseline_release import build_baseline
    from pipeline.config.settings import Settings
    from pipeline.release.statements import privacy_statement

    cat = SyntheticCatalog(n_users=3, d=4, n_arms=20, seed=0)
    s = Settings.from_mapping({"algorithm": algorithm, "epsilon": "2", "tree_levels": "6"}, environ={})
    pol = build_baseline(s, cat, seed=1)
    st = privacy_statement(s, None, pol)
    assert st["private"] and st["mechanism"] == s.baseline and "not used" in st["mechanism_setting"]
    assert st["trees"]["unit_releases_per_epoch"] >= 2**6 - 1  # each unit's tree covers 63 of its releases
    if algorithm.startswith("ss-"):
        assert st["valid"] and "joint DP" in st["notion"] and "context" in st["protects"]
        if algorithm == "ss-gaussian":  # the paper's sigma is conservative: the real epsilon is smaller
            assert st["epsilon"] < 2.0 / 3 and "conservative" in st["note"]
        else:
            assert st["epsilon"] == pytest.approx(2.0, rel=1e-6)
    else:
        assert not st["valid"] and "NOT a valid DP guarantee" in st["note"] and "B.5-1" in st["note"]
        assert st["sensitivity"]["lambda_0"] is not None and st["sensitivity"]["initial"] == 1.0  # L R / lambda
    off = privacy_statement(s.replace(epsilon=math.inf), None, build_baseline(s.replace(epsilon=math.inf), cat, 1))
    assert not off["private"] and "without noise" in off["guarantee"]
