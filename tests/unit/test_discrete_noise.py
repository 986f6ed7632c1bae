"""The hardened noise option: exact discrete Gaussian sampling on integers, and the tree that uses it."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from models.accounting import DiscreteGaussianTreeEvent, describe, group_guarantee
from models.ground.discrete import discrete_gaussian, discrete_gaussian_pmf, randbelow
from models.mechanisms import TreeState, make_mechanism
from models.mechanisms.discrete import DiscreteTreeMechanism


def test_samples_follow_the_discrete_gaussian_pmf() -> None:
    """Chi-square goodness of fit over 20,000 draws at sigma^2 = 4; the threshold is the chi-square quantile
    at p = 1e-4 (a correct sampler fails this once in 10,000 seeds; this seed is fixed)."""
    g = np.random.Generator(np.random.Philox(key=11))
    n = 20_000
    xs = np.array([discrete_gaussian(Fraction(4), g) for _ in range(n)])
    edges = list(range(-7, 8))  # bins: <= -7, -6..6, >= 7
    counts = [np.sum(xs <= -7)] + [np.sum(xs == k) for k in edges[1:-1]] + [np.sum(xs >= 7)]
    pmf = discrete_gaussian_pmf(np.arange(-200, 201), 4.0)
    support = np.arange(-200, 201)
    expected = [pmf[support <= -7].sum()] + [pmf[support == k].sum() for k in edges[1:-1]] + [pmf[support >= 7].sum()]
    expected = np.array(expected) * n
    chi2 = float(((np.array(counts) - expected) ** 2 / expected).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-4, df=len(counts) - 1), chi2
    assert all(isinstance(int(x), int) for x in xs[:10])
    # the discrete Gaussian's variance is below sigma^2 (CKS Prop. 16) and close to it for sigma^2 = 4
    assert 3.5 < xs.var() < 4.0 + 5 * 4.0 * math.sqrt(2 / n)


def test_randbelow_is_uniform_and_exact_beyond_64_bits() -> None:
    g = np.random.Generator(np.random.Philox(key=3))
    big = (1 << 100) + 7
    assert all(0 <= randbelow(big, g) < big for _ in range(200))
    counts = np.bincount([randbelow(6, g) for _ in range(12_000)], minlength=6)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_the_tree_releases_on_the_grid_restores_exactly_and_tracks_the_prefix() -> None:
    m = make_mechanism("discrete-zcdp", dim=4, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=15, seed=5)
    assert isinstance(m, DiscreteTreeMechanism)
    rng = np.random.default_rng(0)
    s = m.init_state()
    prefix = np.zeros(4)
    out = []
    for t in range(40):  # across epochs (15 ticks each)
        prefix = prefix + rng.uniform(-1, 1, 4) / 3
        r, s, _ = m.step_to(s, prefix)
        out.append(r)
        assert np.all(r / m.grid == np.round(r / m.grid))  # a multiple of the grid, exactly
        assert np.abs(s.nodes[-1] - prefix).max() <= (t + 1) * m.grid  # rounded sum tracks the exact prefix
    restored = TreeState.from_mapping(s.to_mapping())
    nxt = prefix + 0.25
    assert np.array_equal(m.step_to(s, nxt)[0], m.step_to(m.state_from_mapping(restored.to_mapping()), nxt)[0])
    twin = make_mechanism("discrete-zcdp", dim=4, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=15, seed=5)
    s2, prefix = twin.init_state(), np.zeros(4)
    rng = np.random.default_rng(0)
    for t in range(40):
        prefix = prefix + rng.uniform(-1, 1, 4) / 3
        r2, s2, _ = twin.step_to(s2, prefix)
        assert np.array_equal(r2, out[t])  # keyed: the same seed gives the same noise


def test_the_calibration_gives_the_target_guarantee_in_zcdp() -> None:
    m = DiscreteTreeMechanism.calibrate(dim=25, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=16383, seed=1)
    ev = m.event
    assert isinstance(ev, DiscreteGaussianTreeEvent) and ev.max_nodes_per_leaf == 14
    g = describe(ev, 1e-5)
    assert g.valid and g.epsilon == pytest.approx(2.0, rel=1e-6) and "discrete Gaussian" in g.note
    # the noise covers the rounding: sigma / (Delta + grid sqrt(d)) is the event's multiplier
    assert m.scale / (1.0 + m.grid * 5) == pytest.approx(ev.noise_multiplier, rel=1e-12)
    assert group_guarantee(ev, 2, 1e-5).epsilon > g.epsilon


# --------------------------------------------------------------------------- issue 12: the integer-word sampler,
# KeyedNoise.discrete_gaussian and make_mechanism(..., sampler="discrete")

from models.accounting import rho_from_epsilon  # noqa: E402
from models.ground.discrete import RandomWords, discrete_gaussian_variance  # noqa: E402
from models.ground.noise import KeyedNoise, default_grid, grid_units  # noqa: E402
from models.mechanisms import BinaryTreeMechanism, DiscreteBLTMechanism  # noqa: E402
from models.mechanisms.factorization import blt_coefficients, toeplitz_lower  # noqa: E402

N_DRAWS = 200_000


def _chi2_against_pmf(xs: np.ndarray, sigma2: float, cut: int) -> tuple[float, float]:
    """Chi-square of the counts on -cut..cut (tails pooled) against N_Z(0, sigma2); and the p = 1e-4 threshold."""
    support = np.arange(-int(30 * math.sqrt(sigma2)) - 30, int(30 * math.sqrt(sigma2)) + 31)
    pmf = discrete_gaussian_pmf(support, sigma2)
    ks = np.arange(-cut + 1, cut)
    observed = np.array([np.sum(xs <= -cut)] + [np.sum(xs == k) for k in ks] + [np.sum(xs >= cut)], dtype=float)
    expected = np.array([pmf[support <= -cut].sum()] + [pmf[support == k].sum() for k in ks]
                        + [pmf[support >= cut].sum()]) * xs.size
    assert expected.min() > 5  # the chi-square approximation's usual condition
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    return chi2, float(stats.chi2.ppf(1 - 1e-4, df=observed.size - 1))


@pytest.mark.parametrize(("sigma2", "cut"), [(9, 10), (Fraction(5, 2), 5), (Fraction(1, 4), 2)])
def test_the_word_sampler_matches_the_discrete_gaussian_pmf(sigma2: int | Fraction, cut: int) -> None:
    """200,000 draws; chi-square below its p = 1e-4 quantile (a correct sampler fails once in 10,000 seeds)."""
    words = RandomWords(np.random.Generator(np.random.Philox(key=2020)))
    xs = np.array([words.discrete_gaussian(sigma2) for _ in range(N_DRAWS)])
    chi2, threshold = _chi2_against_pmf(xs, float(sigma2), cut)
    assert chi2 < threshold, (chi2, threshold)
    # variance: the discrete Gaussian's is at most sigma^2 (CKS Prop. 16); the sample's E[X^2] is within 5 standard
    # errors sqrt(Var(X^2) / n) of it, Var(X^2) = E[X^4] - E[X^2]^2 from the pmf
    s2 = float(sigma2)
    var = discrete_gaussian_variance(s2)
    assert var <= s2 * (1 + 1e-12)
    support = np.arange(-200, 201).astype(float)
    pmf = discrete_gaussian_pmf(support, s2)
    var_x2 = float((support**4 * pmf).sum()) - var**2
    assert abs(float(np.mean(xs.astype(float) ** 2)) - var) < 5 * math.sqrt(var_x2 / N_DRAWS)
    assert abs(xs.mean()) < 5 * math.sqrt(var / N_DRAWS)


def test_the_variance_is_below_sigma2_and_converges_to_it() -> None:
    """CKS Prop. 16: Var N_Z(0, s^2) < s^2, and the gap vanishes like exp(-2 pi^2 s^2)."""
    assert discrete_gaussian_variance(0.25) < 0.25 - 0.01  # visibly below at sigma = 1/2
    assert 0.25 - discrete_gaussian_variance(0.25) > 100 * (1.0 - discrete_gaussian_variance(1.0)) > 0
    assert abs(4.0 - discrete_gaussian_variance(4.0)) < 1e-12  # exp(-2 pi^2 4) ~ 1e-34: equal in doubles


def test_bernoulli_and_below_are_exact_on_integers() -> None:
    words = RandomWords(np.random.Generator(np.random.Philox(key=5)))
    n = 60_000
    hits = sum(words.bernoulli(1, 3) for _ in range(n))  # 1/3 has an infinite binary expansion
    assert abs(hits / n - 1 / 3) < 5 * math.sqrt(2 / 9 / n)
    big = (1 << 130) + 3  # three words
    assert all(0 <= words.below(big) < big for _ in range(100))
    counts = np.bincount([words.below(7) for _ in range(14_000)], minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-4
    hits = sum(words.bernoulli_exp(3, 2) for _ in range(n))  # exp(-1.5)
    assert abs(hits / n - math.exp(-1.5)) < 5 * math.sqrt(math.exp(-1.5) * (1 - math.exp(-1.5)) / n)


class _WordsOnly:
    """A bit generator that only offers raw 64-bit words: the sampler must need nothing else (no floats)."""

    def __init__(self) -> None:
        self.inner = np.random.Philox(key=9)
        self.calls = 0

    def random_raw(self, size: int) -> np.ndarray:
        self.calls += 1
        out: np.ndarray = self.inner.random_raw(size)
        return out


class _GeneratorStub:
    def __init__(self) -> None:
        self.bit_generator = _WordsOnly()


def test_the_sampling_path_reads_raw_integer_words_only() -> None:
    stub = _GeneratorStub()
    words = RandomWords(stub)  # type: ignore[arg-type]
    xs = [words.discrete_gaussian(Fraction(7, 3)) for _ in range(500)]
    assert stub.bit_generator.calls > 0 and all(type(x) is int for x in xs)
    # and KeyedNoise's integers are those words for the address's generator, nothing else consumed
    src = KeyedNoise(seed=123, stream=4)
    z = src.discrete_gaussian_integers(3.0, (50,), epoch=2, level=1, index=9, gamma=1.0)
    again = RandomWords(src.generator(epoch=2, level=1, index=9))
    assert z.dtype == np.int64 and z.tolist() == [again.discrete_gaussian(9) for _ in range(50)]


def test_keyed_discrete_gaussian_is_on_the_grid_deterministic_and_address_separated() -> None:
    src = KeyedNoise(seed=(1 << 63) - 25, stream=3)
    gamma = 2.0**-30
    kw = {"epoch": 1, "level": 4, "index": 77, "gamma": gamma}
    x = src.discrete_gaussian(2.5, (2000,), **kw)
    k = x / gamma
    assert np.array_equal(k, np.round(k))  # exact multiples of gamma
    assert np.array_equal(x, KeyedNoise(seed=(1 << 63) - 25, stream=3).discrete_gaussian(2.5, (2000,), **kw))
    units = grid_units(2.5, gamma)
    assert units == math.ceil(2.5 * 2**30)
    # scale: the sample std of 2,000 draws is within 5 standard errors (sigma / sqrt(2 n)) of gamma * units
    assert abs(float(x.std()) - gamma * units) < 5 * gamma * units / math.sqrt(2 * 2000)
    others = [src.discrete_gaussian(2.5, (2000,), **{**kw, key: kw[key] + 1}) for key in ("epoch", "level", "index")]
    others.append(KeyedNoise(seed=(1 << 63) - 25, stream=4).discrete_gaussian(2.5, (2000,), **kw))
    for y in others:  # independent: the correlation of 2,000 pairs is within 5 / sqrt(n) of 0
        assert abs(float(np.corrcoef(x, y)[0, 1])) < 5 / math.sqrt(2000)
    assert np.array_equal(src.discrete_gaussian(0.0, (3,), **kw), np.zeros(3))


def test_default_grid_is_relative_to_the_sensitivity() -> None:
    assert default_grid(1.0) == 2.0**-30 and default_grid(2.0) == 2.0**-29 and default_grid(1.5) == 2.0**-30
    assert default_grid(0.0) == 2.0**-30
    with pytest.raises(ValueError, match="power of two"):
        KeyedNoise(1).discrete_gaussian(1.0, (2,), epoch=0, level=0, index=0, gamma=0.3)


KW = {"sensitivity": 1.0, "epsilon": 2.0, "delta": 1e-5, "seed": 17}


def _run(m, increments: np.ndarray, state=None):  # type: ignore[no-untyped-def]
    s = m.init_state() if state is None else state
    out, states = [], []
    for x in increments:
        r, s, _ = m.step(s, x)
        out.append(r)
        states.append(s)
    return np.array(out), states


@pytest.mark.parametrize("name", ["gaussian-exact", "gaussian-zcdp", "blt-exact", "blt-zcdp"])
def test_the_discrete_sampler_restores_bit_identically_and_is_calibrated_in_zcdp(name: str) -> None:
    dim, horizon = 6, 40
    m = make_mechanism(name, dim=dim, horizon=horizon, sampler="discrete", **KW)
    incs = np.random.default_rng(1).uniform(-1, 1, (100, dim)) / math.sqrt(dim)  # ||x|| <= 1; 2.5 epochs
    ref, states = _run(m, incs)
    for cut in (17, 40, 63):  # mid-epoch, at the epoch boundary, in the third epoch
        twin = make_mechanism(name, dim=dim, horizon=horizon, sampler="discrete", **KW)
        restored = twin.state_from_mapping(states[cut - 1].to_mapping())
        rest, _ = _run(twin, incs[cut:], restored)
        assert np.array_equal(rest, ref[cut:])  # bit-identical continuation
    ev = m.event
    assert isinstance(ev, DiscreteGaussianTreeEvent)
    g = describe(ev, 1e-5)
    assert g.valid and g.epsilon == pytest.approx(2.0, rel=1e-9)
    # the proof: rho = (inflated sensitivity)^2 / (2 sigma^2) with sigma the noise parameter actually used
    grid = m.grid  # type: ignore[attr-defined]
    assert grid == 2.0**-30
    if name.startswith("gaussian"):
        assert isinstance(m, DiscreteTreeMechanism)
        inflated, h = 1.0 + grid * math.sqrt(dim), m.levels
    else:
        assert isinstance(m, DiscreteBLTMechanism)
        inflated, h = m.column_norm + grid * math.sqrt(dim * horizon), 1
    assert h * inflated**2 / (2 * m.scale**2) <= rho_from_epsilon(2.0, 1e-5) * (1 + 1e-12)
    assert m.scale - grid < h**0.5 * inflated / math.sqrt(2 * rho_from_epsilon(2.0, 1e-5)) <= m.scale


def test_discrete_tree_releases_are_multiples_of_the_grid() -> None:
    m = make_mechanism("gaussian-exact", dim=5, horizon=15, sampler="discrete", **KW)
    incs = np.random.default_rng(2).uniform(-1, 1, (40, 5)) / 3
    out, states = _run(m, incs)
    k = out / m.grid  # type: ignore[attr-defined]
    assert np.array_equal(k, np.round(k)) and np.abs(k).max() < 2.0**53
    # the released statistic is the sum of rounded increments: within t gamma / 2 of the exact prefix
    exact = np.cumsum(incs, axis=0)
    assert np.abs(states[-1].nodes[-1] - exact[-1]).max() <= 40 * m.grid / 2  # type: ignore[attr-defined]


def test_discrete_blt_noise_is_b_times_the_keyed_grid_integers() -> None:
    """release - prefix = gamma (B Z)_t + (B e)_t with |e| <= gamma / 2 the rounding of C x (first epoch)."""
    dim, n = 4, 60
    m = make_mechanism("blt-exact", dim=dim, horizon=n, sampler="discrete", **KW)
    assert isinstance(m, DiscreteBLTMechanism)
    incs = np.random.default_rng(3).uniform(-1, 1, (n, dim)) / 2
    out, _ = _run(m, incs)
    src = KeyedNoise(KW["seed"], 0)
    Z = np.array([src.discrete_gaussian_integers(m.scale, (dim,), epoch=0, level=0, index=t, gamma=m.grid)
                  for t in range(1, n + 1)], dtype=np.float64)
    b = blt_coefficients(m.theta, m.w, n)
    expected = m.grid * (toeplitz_lower(b) @ Z)
    bound = m.grid / 2 * np.cumsum(np.abs(b)) + 1e-12 * m.scale * np.cumsum(np.abs(b))
    assert np.all(np.abs(out - np.cumsum(incs, axis=0) - expected) <= bound[:, None])


def test_noise_off_and_the_default_sampler_are_unchanged() -> None:
    for name in ("gaussian-exact", "blt-exact"):
        off = make_mechanism(name, dim=3, horizon=7, sampler="discrete", **{**KW, "epsilon": math.inf})
        incs = np.random.default_rng(4).uniform(-1, 1, (10, 3))
        out, _ = _run(off, incs)
        assert np.array_equal(out[-1], np.cumsum(incs, axis=0)[-1]) or np.allclose(out, np.cumsum(incs, axis=0))
        a = make_mechanism(name, dim=3, horizon=7, **KW)
        b = make_mechanism(name, dim=3, horizon=7, sampler="float", **KW)
        assert type(a) is type(b) and not isinstance(a, (DiscreteTreeMechanism, DiscreteBLTMechanism))
        assert np.array_equal(_run(a, incs)[0], _run(b, incs)[0])
    tree = make_mechanism("gaussian-exact", dim=3, horizon=7, **KW)
    assert isinstance(tree, BinaryTreeMechanism)
    r, _, _ = tree.step(tree.init_state(), np.zeros(3))
    assert np.array_equal(r, KeyedNoise(KW["seed"], 0).normal(tree.scale, (3,), epoch=0, level=0, index=1))


@pytest.mark.parametrize("name", ["honaker-exact", "smooth-exact", "paper", "user-blt-exact", "user-gaussian-exact"])
def test_unsupported_names_refuse_the_discrete_sampler(name: str) -> None:
    with pytest.raises(ValueError, match="sampler='discrete' is supported for"):
        make_mechanism(name, dim=2, horizon=7, sampler="discrete", sensitivity_l1=1.0, **KW)


def test_bad_sampler_or_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="`sampler`"):
        make_mechanism("gaussian-exact", dim=2, horizon=7, sampler="exact", **KW)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power of two"):
        make_mechanism("gaussian-exact", dim=2, horizon=7, sampler="discrete", grid=1e-6, **KW)
    with pytest.raises(ValueError, match="`grid` applies"):
        make_mechanism("gaussian-exact", dim=2, horizon=7, grid=2.0**-20, **KW)
    m = make_mechanism("blt-exact", dim=2, horizon=7, sampler="discrete", grid=2.0**-20, **KW)
    assert m.grid == 2.0**-20  # type: ignore[attr-defined]
