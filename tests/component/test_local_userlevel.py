"""User level on the device (local mode): the cap per epoch, the calibration to it, the ledger, the budget.

* The device never exceeds its cap in an epoch nor its lifetime budget, across restarts (its state persists in
  a file), for every local algorithm.
* The noise a report carries matches the user-level calibration (fixed seeds; tolerances from the sampling
  distribution of a variance).
* The DP claim is recomputed independently: Google's ``dp-accounting`` (PLD) for the composed Gaussian
  reports; for the per-user tree, the exact multi-participation sensitivity (every pattern enumerated over the
  device's strategy matrix) and a Gaussian mechanism in ``dp-accounting``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
from dp_accounting.pld import PLDAccountant

from models.accounting.conversions import gdp_mu
from models.local import FileStorage, LocalClient, LocalConfig, MemoryStorage, ReportRefused, parse_report
from models.local.config import REPORT_SENSITIVITY
from models.mechanisms.factorization import blt_strategy_coefficients
from models.mechanisms.participation import toeplitz_matrix
from pipeline.config.settings import Settings

D = 5
CONFIGS = {"tree": dict(algorithm="tree"), "round": dict(algorithm="round"),
           "shuffle": dict(algorithm="round", shuffle_batch=50)}


def _config(kind: str, **kw: object) -> LocalConfig:
    base = dict(d=D, epsilon=2.0, delta=1e-5, unit="user", cap=3, epoch_seconds=100.0, user_budget=5.0)
    return LocalConfig(**{**base, **CONFIGS[kind], **kw})  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pld_epsilon(noise_multiplier: float, count: int, delta: float) -> float:
    acc = PLDAccountant()
    acc.compose(SelfComposedDpEvent(GaussianDpEvent(noise_multiplier), count))
    return float(acc.get_epsilon(delta))


# ---------------------------------------------------------------------------------------------- cap and budget

@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_device_never_exceeds_its_cap_or_its_budget_across_restarts(kind: str, tmp_path: Path) -> None:
    cfg = _config(kind)
    limit = cfg.report_limit()
    assert limit is not None and limit > cfg.cap  # several epochs before the budget is spent
    path = tmp_path / "device.json"
    clock = Clock()
    x = np.full(D, 0.3)
    made: list[tuple[int, int]] = []  # (epoch, version) of every report made
    refusals = {"cap": 0, "budget": 0}
    for step in range(4 * limit):
        dev = LocalClient("u", cfg, FileStorage(path), seed=7, clock=clock)  # a restart before every attempt
        try:
            rep = dev.report(rec_id=f"r{step}", x=x, reward=1.0)
        except ReportRefused as e:
            refusals[e.reason] += 1
            if e.reason == "cap":
                clock.now += cfg.epoch_seconds  # the next epoch
            continue
        assert rep.epoch == cfg.epoch_at(clock.now)
        made.append((rep.epoch, rep.version))
        dev.acknowledge(rep.version)
    per_epoch = [sum(1 for e, _ in made if e == epoch) for epoch in {e for e, _ in made}]
    assert max(per_epoch) == cfg.cap  # the cap, and never more
    assert len(made) == limit and [v for _, v in made] == list(range(1, limit + 1))
    assert refusals["cap"] >= 1 and refusals["budget"] >= 1
    final = LocalClient("u", cfg, FileStorage(path), clock=clock)
    assert final.version == limit and final.spent()[0] <= cfg.user_budget * (1 + 1e-9)
    assert cfg.spent(limit + 1)[0] > cfg.user_budget  # one more would have gone past it
    with pytest.raises(ReportRefused, match="budget"):
        final.report(rec_id="last", x=x, reward=1.0)
    # the state on disk holds the ledger
    state = json.loads(path.read_bytes())
    assert state["ledger"]["k"] <= cfg.cap and state["version"] == limit


def test_a_refused_report_changes_nothing_and_a_clock_that_goes_back_does_not_reopen_an_epoch() -> None:
    cfg = _config("round")
    clock = Clock()
    store = MemoryStorage()
    dev = LocalClient("u", cfg, store, seed=1, clock=clock)
    for i in range(cfg.cap):
        dev.report(rec_id=f"r{i}", x=np.zeros(D), reward=0.0)
    before = store.data
    clock.now -= 10 * cfg.epoch_seconds  # the device's clock set back
    with pytest.raises(ReportRefused, match="cap"):
        dev.report(rec_id="again", x=np.zeros(D), reward=0.0)
    assert store.data == before and dev.version == cfg.cap


def test_reports_carry_their_epoch_and_parse_without_one_at_event_level() -> None:
    cfg = _config("round")
    rep = LocalClient("u", cfg, seed=1, clock=lambda: 250.0).report(rec_id="r", x=np.zeros(D), reward=1.0)
    assert rep.epoch == 2 and parse_report(rep.to_json(), d=D) == rep
    ev = LocalClient("u", LocalConfig(algorithm="round", d=D, epsilon=2.0), seed=1).report(
        rec_id="r", x=np.zeros(D), reward=1.0)
    assert ev.epoch is None and "epoch" not in ev.to_dict() and parse_report(ev.to_json(), d=D) == ev


def test_local_mode_defaults_to_user_level_and_event_level_stays_a_setting() -> None:
    cfg = Settings(mode="local").local_config(25)
    assert cfg.unit == "user" and cfg.cap == 8 and cfg.user_budget == 10.0
    assert cfg.epoch_seconds == Settings().tree_ticks * Settings().tick_seconds  # the global mode's epoch
    event = Settings(mode="local", privacy_unit="event").local_config(25)
    assert event.unit == "event" and math.isinf(event.user_budget)
    old = LocalConfig.from_dict({k: v for k, v in event.to_dict().items()
                                 if k not in ("unit", "cap", "epoch_seconds", "user_budget")})
    assert old == event  # a device state written before user level reads as event level


# ---------------------------------------------------------------------------------------------- calibration

def _first_noise(cfg: LocalConfig, devices: int) -> np.ndarray:
    """The first report of ``devices`` devices on reward 0: pure noise (``r x = 0``)."""
    return np.concatenate([LocalClient(str(i), cfg, seed=1000 + i, clock=lambda: 0.0).report(
        rec_id="r", x=np.zeros(D), reward=0.0).vector for i in range(devices)])


def _assert_variance(samples: np.ndarray, variance: float) -> None:
    """Sample variance within 5 standard errors (sd of the sample variance of n normals: var sqrt(2 / (n - 1)));
    Laplace: kurtosis 6, sd var sqrt((k - 1 + 2/(n-1)) / n) ~ var sqrt(5 / n) — the larger is used."""
    n = samples.size
    se = variance * math.sqrt(5.0 / n)
    assert abs(float(np.mean(samples**2)) - variance) <= 5 * se, (float(np.mean(samples**2)), variance)


def test_round_reports_carry_the_noise_of_cap_composed_gaussians_and_dp_accounting_agrees() -> None:
    cfg = _config("round", cap=4)
    mu = gdp_mu(cfg.epsilon, cfg.delta)
    assert cfg.sigma == pytest.approx(REPORT_SENSITIVITY * math.sqrt(cfg.cap) / mu)
    _assert_variance(_first_noise(cfg, 800), cfg.sigma**2)
    # independently: cap Gaussian reports of L2 sensitivity 2 composed (PLD) are (epsilon, delta)-DP, tightly
    eps = _pld_epsilon(cfg.sigma / REPORT_SENSITIVITY, cfg.cap, cfg.delta)
    assert cfg.epsilon * 0.98 <= eps <= cfg.epsilon * 1.01
    # and the whole budget: report_limit reports stay within it, one more does not
    limit = cfg.report_limit()
    assert limit is not None
    assert _pld_epsilon(cfg.sigma / REPORT_SENSITIVITY, limit, cfg.delta) <= cfg.user_budget * 1.01
    assert _pld_epsilon(cfg.sigma / REPORT_SENSITIVITY, limit + 1, cfg.delta) > cfg.user_budget * 0.99


def _exact_block_bound(cfg: LocalConfig) -> float:
    """``max over patterns S of the block's cap reports of ||C 1_S||^2`` by enumeration, C from the device's BLT
    strategy (its first column ``c``: lower-triangular Toeplitz)."""
    mech = cfg.device_mechanism(0)
    C = toeplitz_matrix(blt_strategy_coefficients(mech.theta, mech.w, cfg.cap))  # type: ignore[attr-defined]
    n = C.shape[1]
    return max(float(np.sum(C[:, list(S)].sum(axis=1) ** 2))
               for k in range(1, n + 1) for S in itertools.combinations(range(n), k))


def test_tree_reports_carry_the_noise_of_the_multi_participation_calibration_and_dp_accounting_agrees() -> None:
    cfg = _config("tree", cap=6)
    mech = cfg.device_mechanism(0)
    scale = float(mech.scale)  # type: ignore[attr-defined]
    # the first release of the device's BLT is z ~ N(0, scale^2) per coordinate
    _assert_variance(_first_noise(cfg, 600), scale**2)
    assert cfg.report_variance(1) == pytest.approx(scale**2)
    # independently: a whole block (every pattern of the cap reports, each of L2 sensitivity 2) moves C X by at most
    # 2 sqrt(B_exact); the Gaussian mechanism with that sensitivity at this scale is (epsilon, delta)-DP
    sens = REPORT_SENSITIVITY * math.sqrt(_exact_block_bound(cfg))
    eps = _pld_epsilon(scale / sens, 1, cfg.delta)
    assert eps <= cfg.epsilon * 1.01
    assert eps >= cfg.epsilon * 0.5  # and not wildly more noise than the claim needs (the bound's slack)
    # event level calibrates one report only: user level adds the multi-participation factor (at most cap)
    event = dataclasses.replace(cfg, unit="event", capacity=cfg.cap)
    ratio = scale / float(event.device_mechanism(0).scale)  # type: ignore[attr-defined]
    assert ratio == pytest.approx(cfg.participation_factor) and 1.0 < ratio <= cfg.cap


def test_tree_ledger_counts_blocks_and_the_budget_matches_composition_of_blocks() -> None:
    cfg = _config("tree", cap=4, user_budget=6.0)
    mu = gdp_mu(cfg.epsilon, cfg.delta)
    mech = cfg.device_mechanism(0)
    C = toeplitz_matrix(blt_strategy_coefficients(mech.theta, mech.w, cfg.cap))  # type: ignore[attr-defined]
    exact = [max(float(np.sum(C[:, list(S)].sum(axis=1) ** 2)) for S in itertools.combinations(range(cfg.cap), k))
             for k in range(1, cfg.cap + 1)]
    for k in range(1, cfg.cap + 1):  # the ledger's B(k)/B(cap) bounds the exact share of a block's loss
        assert cfg.participation_ratio(k) * cfg.participation_factor**2 >= exact[k - 1] / exact[0] * (1 - 1e-9)
    limit = cfg.report_limit()
    assert limit is not None
    # blocks are independent Gaussian mechanisms: n reports = floor(n/cap) full blocks + one partial, in GDP
    spent = mu * math.sqrt(cfg.spent_fraction(limit))
    assert spent <= gdp_mu(cfg.user_budget, cfg.delta) * (1 + 1e-9)
    assert mu * math.sqrt(cfg.spent_fraction(limit + 1)) > gdp_mu(cfg.user_budget, cfg.delta)


def test_shuffled_reports_split_the_central_guarantee_over_the_cap_batches() -> None:
    cfg = _config("shuffle", cap=4)
    eps_b, delta_b = cfg.batch_guarantee
    assert eps_b * cfg.cap == pytest.approx(cfg.epsilon) and delta_b * cfg.cap == pytest.approx(cfg.delta)
    event = dataclasses.replace(cfg, unit="event", epsilon=eps_b, delta=delta_b)
    assert cfg.epsilon0 == pytest.approx(event.epsilon0) and cfg.laplace_scale == pytest.approx(event.laplace_scale)
    _assert_variance(_first_noise(cfg, 800), 2 * cfg.laplace_scale**2)
    assert cfg.spent(cfg.cap) == pytest.approx((cfg.epsilon, cfg.delta))


def test_the_simulations_devices_stop_at_their_cap_and_count_what_they_refused() -> None:
    """``privrec experiment modes`` at user level: each device reports its first ``cap`` interactions of the run
    (one epoch) and refuses the rest; the server's sums hold exactly the reports made."""
    from models.local import LocalUCB

    cfg = _config("round", cap=3)
    pol = LocalUCB(d=D, n_units=2, config=cfg, tick=4, seed=0)
    x = np.full(D, 0.2)
    users = [f"u{i % 4}" for i in range(20)]  # 4 users, 5 interactions each
    for i, user in enumerate(users):
        pol.update(i % 2, x, 1.0, user=user)
    assert pol.reports == 4 * cfg.cap and pol.refused == 20 - 4 * cfg.cap
    assert int(pol.state.count.sum()) == pol.reports
    assert pol.solves == 20 // 4  # the server refreshes on the interactions' clock, reported or not
