"""The item randomizer of local mode (models.local.items): its noise matches its calibration, and the
central guarantee of a batch is recomputed independently (brute force over the outcomes; dp-accounting)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from models.local.items import ItemBlanket, blanket_delta, blanket_epsilon, calibrate_blanket, pair_losses
from models.local.policy import LocalItemUCB


def _brute_delta(eps: float, n: int, p: float) -> float:
    """``max`` over both directions of ``sum (P - e^eps Q)_+`` over every outcome ``(u, v)`` of the two items."""
    f = stats.binom.pmf(np.arange(n + 2), n, p)            # f[n + 1] = 0
    shifted = np.concatenate([[0.0], f[:-1]])               # pmf of X + 1
    P = np.outer(shifted, f)                                # (X + 1, Y)
    Q = np.outer(f, shifted)                                # (X, Y + 1)
    return max(float(np.clip(P - math.exp(eps) * Q, 0, None).sum()),
               float(np.clip(Q - math.exp(eps) * P, 0, None).sum()))


def _brute_delta_one_item(eps: float, n: int, p: float) -> float:
    """The other neighbour: one report with item ``a`` against one with no item (one count moves)."""
    f = stats.binom.pmf(np.arange(n + 2), n, p)
    shifted = np.concatenate([[0.0], f[:-1]])
    return max(float(np.clip(shifted - math.exp(eps) * f, 0, None).sum()),
               float(np.clip(f - math.exp(eps) * shifted, 0, None).sum()))


@pytest.mark.parametrize("n,p,eps", [(40, 0.3, 0.5), (40, 0.3, 1.5), (200, 0.05, 1.0), (500, 0.03, 2.0)],
                         ids=["n40_p0.3_e0.5", "n40_p0.3_e1.5", "n200_p0.05_e1", "n500_p0.03_e2"])
def test_batch_delta_matches_brute_force(n: int, p: float, eps: float) -> None:
    """One batch: the module's delta (grid rounded up) is an upper bound within 0.3 % + 1e-12 of the exact sum
    over every outcome, in both directions; the one-item neighbour is never worse."""
    exact = _brute_delta(eps, n, p)
    ours = blanket_delta(eps, n, p)
    assert ours >= exact - 1e-12
    assert ours <= exact * 1.003 + 1e-12
    assert _brute_delta_one_item(eps, n, p) <= exact + 1e-12


def test_composition_matches_dp_accounting() -> None:
    """A user's cap batches: the convolution here agrees with dp-accounting's privacy loss distribution of the
    same pair of distributions composed cap times (an independent implementation)."""
    pld_mod = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    n, p, cap = 300, 0.1, 4
    f = stats.binom.pmf(np.arange(n + 2), n, p)
    shifted = np.concatenate([[0.0], f[:-1]])
    P, Q = np.outer(shifted, f).ravel(), np.outer(f, shifted).ravel()
    keep = (P > 1e-300) | (Q > 1e-300)
    log_p = {i: math.log(v) for i, v in enumerate(P[keep]) if v > 0}
    log_q = {i: math.log(v) for i, v in enumerate(Q[keep]) if v > 0}
    pld = pld_mod.from_two_probability_mass_functions(log_p, log_q, value_discretization_interval=1e-4)
    theirs = pld.self_compose(cap)
    for eps in (1.0, 2.0, 3.0):
        ours = blanket_delta(eps, n, p, compositions=cap)
        ref = theirs.get_delta_for_epsilon(eps)
        assert ours >= 0.97 * ref, (eps, ours, ref)
        assert ours <= 1.03 * ref + 1e-12, (eps, ours, ref)


def test_calibration_reaches_target_and_is_tight() -> None:
    """The calibrated p gives at most the target epsilon; 1 % fewer fakes would not (the bisection's tolerance)."""
    eps, delta, n, cap = 2.0, 1e-5, 1000, 8
    p = calibrate_blanket(eps, delta, n, compositions=cap)
    assert blanket_delta(eps, n, p, compositions=cap) <= delta
    assert blanket_delta(eps, n, p / 1.01, compositions=cap) > delta
    assert blanket_epsilon(n, p, delta, compositions=cap) <= eps


def test_too_small_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="make the batch larger"):
        calibrate_blanket(2.0, 1e-5, 2)


def test_infinite_loss_mass_is_in_delta() -> None:
    """With few fakes an item with no message at all betrays the swap: delta at least P(Y = 0) = (1 - p)^n."""
    n, p = 50, 0.02
    assert blanket_delta(20.0, n, p) >= (1 - p) ** n
    assert pair_losses(n, p)[4] >= (1 - p) ** n


def test_randomizer_noise_matches_calibration() -> None:
    """Fixed seed, 4,000 reports over K = 500 items: the fakes per report are Bin(K, p) (mean and variance within
    5 standard errors), each item is a fake with probability p (chi-square over items, 99.9 % quantile), and the
    real item is sent with probability reward (binomial test, 5 standard errors)."""
    K, trials = 500, 4_000
    blanket = ItemBlanket(n_items=K, batch=300, epsilon=2.0, delta=1e-5, cap=2)
    p = blanket.p
    rng = np.random.default_rng(12345)
    counts = np.zeros(K)
    sizes = np.empty(trials)
    real = 0
    for t in range(trials):
        msgs = blanket.randomize(7, reward=0.5, rng=rng)
        has = int(np.count_nonzero(msgs == 7))
        assert has <= 2 and len(np.unique(msgs[msgs != 7])) == len(msgs[msgs != 7])
        fakes = msgs[msgs != 7]
        sizes[t] = len(msgs)
        counts += np.bincount(fakes, minlength=K)
        real += has
    # fakes per report (all items but 7): Bin(K - 1, p) plus the fake/real of item 7
    mean, var = K * p, K * p * (1 - p)
    expected_total = mean + 0.5 * (1 - p)  # the real message adds when item 7 was not a fake already
    assert abs(sizes.mean() - expected_total) < 5 * math.sqrt(var / trials) + 0.01
    assert abs(sizes.var() / var - 1) < 5 * math.sqrt(2 / trials) + 0.05
    others = np.delete(counts, 7)
    chi2 = float((((others - trials * p) ** 2) / (trials * p * (1 - p))).sum())
    assert chi2 < stats.chi2.ppf(0.999, K - 1)
    # item 7: a message when fake (p) or real (1/2): P = 1 - (1 - p)(1 - 1/2) (counting one per report)
    q = 1 - (1 - p) * 0.5
    assert abs(real / trials - q) < 5 * math.sqrt(q * (1 - q) / trials) + p  # a fake and the real may both be 7


def test_estimator_is_unbiased_with_the_stated_variance() -> None:
    """A batch's estimate h - n p of each item's positives: mean error and variance match n p (1 - p)."""
    K, n = 200, 300
    blanket = ItemBlanket(n_items=K, batch=n, epsilon=2.0, delta=1e-5, cap=1)
    rng = np.random.default_rng(7)
    truth = np.zeros(K)
    items = rng.integers(0, 20, size=n)
    np.add.at(truth, items, 1.0)
    errs = []
    for _ in range(40):
        msgs = np.concatenate([blanket.randomize(int(a), reward=1.0, rng=rng) for a in items])
        errs.append(blanket.estimate(blanket.histogram(msgs), n) - truth)
    e = np.asarray(errs).ravel()
    sd = math.sqrt(blanket.variance(n))
    assert abs(e.mean()) < 5 * sd / math.sqrt(len(e))
    assert abs(e.var() / sd**2 - 1) < 5 * math.sqrt(2 / len(e))


def test_population_batches_fill() -> None:
    """Batches of distinct users from every unit: all capped reports of a stream of 2,000 users (one report each)
    reach the statistics in 2,000 / 500 batches, whatever the units."""
    pol = LocalItemUCB(d=2, n_items=10, epsilon=2.0, batch=500, cap=1, seed=0, share=0.5)
    X = np.eye(2)[[0, 1] * 5]
    for u in range(2_000):
        pol.update(u % 100, X[0], 0.0, user=str(u), item=u % 10, x_item=X[0])
    assert pol.batches == 4 and pol.item_reports == 2_000


def test_shuffler_carries_every_message_once_and_keeps_the_open_ones() -> None:
    """A batch's msgs are the multiset of its reports' messages (no report of another batch); an open report's
    messages are in the state the shuffler persists, under its user and version; ShuffledBatch round-trips them."""
    from models.local import LocalConfig, LocalReport
    from models.local.shuffle import POPULATION, ShuffledBatch, Shuffler

    sh = Shuffler(LocalConfig(algorithm="round", d=1, epsilon=2.0, shuffle_batch=2))
    rep = lambda user, v: LocalReport(user, v, "round", f"r{user}{v}", [0.0], ("i1",))  # noqa: E731
    assert sh.add(rep("a", 1), unit=POPULATION, messages=[3, 9]) == []
    assert sh.add(rep("a", 2), unit=POPULATION, messages=[4]) == []  # waits: "a" is in the open batch
    (batch,) = sh.add(rep("b", 1), unit=POPULATION, messages=[9, 11])
    assert sorted(batch.messages) == [3, 9, 9, 11]
    assert sh.state()["messages"] == {POPULATION: {"a\n2": [4]}}
    again = ShuffledBatch.parse(batch.to_json(), d=1)
    assert sorted(again.messages) == [3, 9, 9, 11]
    with pytest.raises(ValueError, match="msgs must be a list of catalog rows"):
        ShuffledBatch.parse(batch.to_json().replace(b'"msgs":[', b'"msgs":[-1,'), d=1)
