"""Local mode's pure part: the device, the report record, the server's sums, the shuffler."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from models.accounting.conversions import gdp_epsilon
from models.local import (FileStorage, LocalClient, LocalConfig, LocalReport, MemoryStorage,
                          ReportError, parse_report)
from models.local.aggregate import clip_context
from models.local.analyzer import Analyzer, Reports
from models.mechanisms import noise_std
from models.streaming import UnitStats

D = 5


def _events(n: int, users: int, seed: int = 0) -> list[tuple[str, np.ndarray, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=D)
        x *= rng.uniform(0.2, 1.5) / np.linalg.norm(x)  # some longer than 1: the device clips them
        out.append((str(rng.integers(users)), x, float(rng.integers(2)) if rng.random() < 0.5 else rng.random()))
    return out


@pytest.mark.parametrize("algorithm", ["tree", "round"])
def test_aggregate_minus_the_devices_noise_is_the_global_modes_exact_statistics(algorithm: str) -> None:
    """Noise off, the local aggregate equals the global mode's exact statistics: here, the sums of the reports
    minus each device's own noise (which only the device knows) equal UnitStats.add of the same events."""
    cfg = LocalConfig(algorithm=algorithm, d=D, epsilon=1.0, capacity=31)
    users = {u: LocalClient(u, cfg, seed=100 + int(u)) for u in map(str, range(6))}
    unit_of = {u: int(u) % 3 for u in users}
    shown: dict[str, np.ndarray] = {}
    an = Analyzer(cfg, 3, lambda items: np.stack([clip_context(shown[i]) for i in items]))
    agg = an.init_state()
    exact = UnitStats.zeros(n_units=3, d=D)
    noise = np.zeros((3, D))
    last_noise: dict[str, np.ndarray] = {}
    for i, (u, x, r) in enumerate(_events(200, 6)):
        rep = users[u].report(rec_id=f"r{i}", x=x, reward=r)
        shown[f"r{i}"] = x
        agg, dead = an.step(agg, Reports([(i, dataclasses.replace(rep, shown=(f"r{i}",)), unit_of[u])]))
        assert dead == []
        exact.add(np.array([unit_of[u]]), clip_context(x)[None, :], np.array([r]))
        if algorithm == "tree":
            last_noise[u] = rep.vector - users[u].exact_b
        else:
            noise[unit_of[u]] += rep.vector - r * clip_context(x)
    for u, z in last_noise.items():
        noise[unit_of[u]] += z
    np.testing.assert_array_equal(agg.count, exact.count)
    np.testing.assert_allclose(agg.gram, exact.gram, rtol=0, atol=1e-12)
    np.testing.assert_allclose(agg.b - noise, exact.b, rtol=0, atol=1e-9)
    assert np.abs(agg.b - exact.b).max() > 0.1  # and the reports did carry noise


def test_a_restarted_device_resends_the_same_report_and_continues_its_versions(tmp_path) -> None:
    cfg = LocalConfig(algorithm="tree", d=D, epsilon=2.0, capacity=15)
    store = FileStorage(tmp_path / "dev.json")
    dev = LocalClient("u1", cfg, store)
    x = np.full(D, 0.3)
    first = dev.report(rec_id="r1", x=x, reward=1.0)
    dev.acknowledge(first.version)
    second = dev.report(rec_id="r2", x=x, reward=0.0)  # "sent", then the device crashed
    again = LocalClient("u1", cfg, FileStorage(tmp_path / "dev.json"))
    assert again.pending() == [second]
    assert again.pending()[0].to_json() == second.to_json()  # the same bytes: no noise redrawn
    third = again.report(rec_id="r3", x=x, reward=1.0)
    assert third.version == 3
    # the continuation is the one the uninterrupted device would have released (keyed noise, same state)
    twin = LocalClient("u1", cfg, MemoryStorage(), seed=again.seed)
    for rid, r in (("r1", 1.0), ("r2", 0.0), ("r3", 1.0)):
        rep = twin.report(rec_id=rid, x=x, reward=r)
    assert rep == third
    with pytest.raises(ValueError, match="calibration"):
        LocalClient("u1", LocalConfig(algorithm="tree", d=D, epsilon=4.0, capacity=15), FileStorage(tmp_path / "dev.json"))
    with pytest.raises(ValueError, match="belongs to user"):
        LocalClient("u2", cfg, FileStorage(tmp_path / "dev.json"))


def test_device_refuses_bad_rewards_and_contexts() -> None:
    dev = LocalClient("u", LocalConfig(algorithm="round", d=D, epsilon=1.0))
    for bad in (-0.1, 1.5, math.nan, math.inf):
        with pytest.raises(ValueError, match="reward"):
            dev.report(rec_id="r", x=np.zeros(D), reward=bad)
    with pytest.raises(ValueError, match="finite"):
        dev.report(rec_id="r", x=np.full(D, np.nan), reward=1.0)
    with pytest.raises(ValueError, match="shape"):
        dev.report(rec_id="r", x=np.zeros(D + 1), reward=1.0)
    assert dev.version == 0 and dev.pending() == []


@pytest.mark.parametrize("body, parameter", [
    (b"not json", "body"),
    (b"[1, 2]", "body"),
    ({"reward": 1}, "reward"),
    ({"extra": 1}, "extra"),
    ({"schema": "other"}, "schema"),
    ({"version": 0}, "version"),
    ({"version": True}, "version"),
    ({"version": 1.5}, "version"),
    ({"user": ""}, "user"),
    ({"algorithm": "x"}, "algorithm"),
    ({"b": [1.0] * (D - 1)}, "b"),
    ({"b": [1.0] * (D - 1) + ["1"]}, "b"),
    ({"b": [1.0] * (D - 1) + [1e300 * 10]}, "b"),
    ({"b": [1.0] * (D - 1) + [2e6]}, "b"),
    ({"m": [1.0] * D}, "m"),
    ({"item": "a"}, "item"),               # the user's choice never leaves the device
    ({"shown": "a"}, "shown"),
    ({"shown": [""]}, "shown"),
])
def test_parse_report_names_the_bad_field(body: object, parameter: str) -> None:
    good = LocalReport("u", 1, "tree", "r", np.zeros(D)).to_dict()
    raw = body if isinstance(body, bytes) else json.dumps({**good, **body}).encode()  # type: ignore[dict-item]
    with pytest.raises(ReportError) as e:
        parse_report(raw, d=D)
    assert e.value.parameter == parameter


def test_parse_report_refuses_the_other_algorithm() -> None:
    rep = LocalReport("u", 1, "round", "r", np.zeros(D))
    assert parse_report(rep.to_json(), d=D) == rep
    with pytest.raises(ReportError, match="runs local algorithm 'tree'"):
        parse_report(rep.to_json(), d=D, algorithm="tree")


def test_stale_and_repeated_versions_are_refused_and_change_nothing() -> None:
    cfg = LocalConfig(algorithm="round", d=D, epsilon=1.0)
    an = Analyzer(cfg, 1, lambda items: np.eye(D)[:1])
    agg, dead = an.step(an.init_state(), Reports([(0, LocalReport("u", 2, "round", "r", np.ones(D), ("a",)), 0)]))
    assert dead == []
    for v in (1, 2):
        after, dead = an.step(agg, Reports([(v, LocalReport("u", v, "round", "r", np.ones(D), ("a",)), 0)]))
        assert [d.key for d in dead] == [v] and "stale or repeated" in dead[0].reason
        assert after.to_mapping() == agg.to_mapping()  # nothing changed, byte for byte


def test_round_reports_carry_the_calibrated_gaussian_noise() -> None:
    """sigma = 2/mu for (epsilon, delta) at L2 sensitivity 2 (one interaction replaced: another reward and another
    item of the list, ||r x - r' x'|| <= 2); the sample variance within 5 standard errors."""
    cfg = LocalConfig(algorithm="round", d=D, epsilon=2.0, delta=1e-5)
    assert gdp_epsilon(2.0 / cfg.sigma, 1e-5) == pytest.approx(2.0, rel=1e-6)
    dev = LocalClient("u", cfg, seed=7)
    n = 4000
    reps = []
    for i in range(n):
        reps.append(dev.report(rec_id=str(i), x=np.zeros(D), reward=0.0))
        dev.acknowledge(reps[-1].version)
    z = np.stack([r.vector for r in reps]).ravel()
    se = cfg.sigma**2 * math.sqrt(2.0 / z.size)  # standard error of a Gaussian sample variance
    assert abs(z.var() - cfg.sigma**2) < 5 * se
    assert abs(z.mean()) < 5 * cfg.sigma / math.sqrt(z.size)


def test_tree_report_variance_is_the_devices_mechanism_noise() -> None:
    cfg = LocalConfig(algorithm="tree", d=D, epsilon=2.0, capacity=7)
    dev = LocalClient("u", cfg, seed=3)
    for v in range(1, 20):  # across epochs (capacity 7)
        dev.report(rec_id=str(v), x=np.zeros(D), reward=0.0)
        assert dev.state is not None and dev.mechanism is not None
        assert cfg.report_variance(v) == pytest.approx(noise_std(dev.mechanism, dev.state) ** 2, rel=1e-12)


def test_the_laplace_scale_covers_the_whole_domain_in_l1() -> None:
    """2 sqrt(d) bounds ||r x - r' x'||_1 for ||x||, ||x'|| <= 1 and r, r' in [0, 1] (tight for x = -x')."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(2000):
        x, y = (v / max(1.0, float(np.linalg.norm(v))) for v in rng.normal(size=(2, D)))
        worst = max(worst, float(np.abs(rng.random() * x - rng.random() * y).sum()))
    u = np.full(D, 1 / math.sqrt(D))
    assert worst <= 2 * math.sqrt(D) and np.abs(u - (-u)).sum() == pytest.approx(2 * math.sqrt(D))


def test_config_refuses_what_it_cannot_calibrate() -> None:
    with pytest.raises(ValueError, match="finite"):
        LocalConfig(algorithm="tree", d=D, epsilon=math.inf)
    with pytest.raises(ValueError, match="per-round"):
        LocalConfig(algorithm="tree", d=D, epsilon=1.0, shuffle_batch=10)
    with pytest.raises(ValueError, match="mechanism"):
        LocalConfig(algorithm="tree", d=D, epsilon=1.0, mechanism="user-blt-exact")
    with pytest.raises(ValueError, match="algorithm"):
        LocalConfig(algorithm="global", d=D, epsilon=1.0)
