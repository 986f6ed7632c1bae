"""Amplification by shuffling (FMT21): against the authors' reference code, brute force and exact shuffles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from models.accounting.shuffling import (
    ShuffleGuarantee,
    amplification_condition,
    fmt_closed_form,
    fmt_numerical,
    fmt_numerical_delta,
    local_epsilon_for_central,
    shuffled_epsilon,
)
from models.accounting.shuffling import _divergence_given_clones  # the per-clone-count formula itself

DELTA = 1e-6

# Outputs of apple/ml-shuffling-amplification, computeamplification.py at commit
# 993d285a546114bf8c70c33d053dca322a755707 (run unmodified, numpy 2.4.6 / scipy 1.17.1):
#   closedformanalysis(n, eps0, 1e-6)
CLOSED_FORM_REFERENCE = {  # (eps0, n): epsilon
    (1.0, 1_000): 0.6495375524107758,
    (1.0, 10_000): 0.2332655961237434,
    (2.0, 10_000): 0.5235509772345485,
    (3.0, 10_000): 0.8400272619177827,
    (4.0, 100_000): 0.5378040242374512,  # also the value printed in the repository's README
}
#   numericalanalysis(n, eps0, 1e-6, 50, 100, True)   (num_iterations=50, step=100, upper bound)
# Only n > step: for n <= step the reference's loop visits no block and returns ~1e-15 (not a bound).
NUMERICAL_REFERENCE_STEP100 = {  # (eps0, n): epsilon
    (1.0, 1_000): 0.206432318847401,
    (2.0, 1_000): 1.0978035116004765,
    (3.0, 1_000): 2.999997879037,
    (4.0, 1_000): 3.999998093699201,
    (2.0, 5_000): 0.23728179093466023,
    (1.0, 10_000): 0.05340492251492743,
    (2.0, 10_000): 0.15854966803922013,
    (3.0, 10_000): 0.347707929832336,
    (4.0, 10_000): 0.8888638120074397,
}
#   numericalanalysis(n, eps0, 1e-6, 50, 1, True) and (..., 1, False)   (step=1: upper, lower bound)
# The reference's upper bound stops early once the unvisited mass is below the delta so far and adds
# that mass (up to doubling delta); its lower bound drops it. The exact divergence lies between.
NUMERICAL_REFERENCE_STEP1 = {  # (eps0, n): (upper, lower)
    (1.0, 100): (0.6618560012490908, 0.6434597040927095),
    (2.0, 100): (1.9993182026277747, 1.9988266899991913),
    (1.0, 1_000): (0.1902451298074508, 0.18240762046972694),
    (3.0, 1_000): (1.3212046526942336, 1.2642406518623277),
    (2.0, 10_000): (0.1618372574262743, 0.15504425598042132),
}
#   numericalanalysis(n, eps0, 1e-6, 50, 10, True) and (..., 10, False)   (step=10)
NUMERICAL_REFERENCE_STEP10 = {  # (eps0, n): (upper, lower)
    (1.0, 100): (0.7274322318430606, 0.6063258472846211),
    (2.0, 1_000): (0.5587688540657041, 0.5359531531227777),
}


# ------------------------------------------------------------------------------------ against the reference

@pytest.mark.parametrize(("eps0", "n"), sorted(CLOSED_FORM_REFERENCE))
def test_closed_form_matches_reference(eps0: float, n: int) -> None:
    assert fmt_closed_form(eps0, n, DELTA) == pytest.approx(CLOSED_FORM_REFERENCE[eps0, n], rel=1e-9)


@pytest.mark.parametrize(("eps0", "n"), sorted(NUMERICAL_REFERENCE_STEP100))
def test_numerical_matches_reference_step100(eps0: float, n: int) -> None:
    assert fmt_numerical(eps0, n, DELTA, iterations=50, step=100) == pytest.approx(
        NUMERICAL_REFERENCE_STEP100[eps0, n], rel=1e-3)


@pytest.mark.parametrize(("eps0", "n", "step"), [(e, n, 1) for e, n in sorted(NUMERICAL_REFERENCE_STEP1)]
                         + [(e, n, 10) for e, n in sorted(NUMERICAL_REFERENCE_STEP10)])
def test_numerical_lies_between_reference_bounds(eps0: float, n: int, step: int) -> None:
    upper, lower = (NUMERICAL_REFERENCE_STEP1 if step == 1 else NUMERICAL_REFERENCE_STEP10)[eps0, n]
    got = fmt_numerical(eps0, n, DELTA, step=step)
    assert got is not None
    assert lower * (1 - 1e-9) <= got <= upper * (1 + 1e-9)
    if step == 1:  # one clone count per block: the reference's lower bound only drops a tail of mass
        assert got == pytest.approx(lower, rel=1e-3)


def test_reference_bug_small_batch_is_not_reproduced() -> None:
    # the reference returns ~1e-15 for n <= step; ours covers every clone count and stays honest
    got = fmt_numerical(1.0, 100, DELTA, step=100)
    assert got is not None and got > 0.99  # one block [0, 99] bounded by c = 0: nearly no amplification
    exact = fmt_numerical(1.0, 100, DELTA, step=1)
    assert exact is not None and 0.6 < exact < 0.7


# ------------------------------------------------------------------------------------ brute force

def _clone_pair(c: int, eps0: float) -> tuple[np.ndarray, np.ndarray]:
    """p_c, q_c on {0, .., c+1} by explicit convolution."""
    alpha = math.exp(eps0) / (1 + math.exp(eps0))
    b = stats.binom.pmf(np.arange(c + 1), c, 0.5)
    b0, b1 = np.append(b, 0.0), np.append(0.0, b)  # Bin(c, 1/2) and Bin(c, 1/2) + 1
    return alpha * b0 + (1 - alpha) * b1, (1 - alpha) * b0 + alpha * b1


def _hockey(p: np.ndarray, q: np.ndarray, eps: float) -> float:
    return float(np.maximum(p - math.exp(eps) * q, 0.0).sum())


def test_divergence_formula_both_directions_by_brute_force() -> None:
    eps0 = 1.3
    for eps in (0.0, 0.2, 0.7, 1.29):
        got = _divergence_given_clones(eps, eps0, np.arange(40.0))
        prev = math.inf
        for c in range(0, 40):
            p, q = _clone_pair(c, eps0)
            fwd, bwd = _hockey(p, q, eps), _hockey(q, p, eps)
            assert got[c] == pytest.approx(fwd, rel=1e-9, abs=1e-15)
            assert fwd == pytest.approx(bwd, abs=1e-14)  # symmetric: one direction suffices
            assert fwd <= prev + 1e-15  # non-increasing in c: a block is bounded by its smallest c
            prev = fwd
    # n = 1: C = 0, the pair is randomized response
    for eps in (0.0, 0.5, 1.0):
        p, q = _clone_pair(0, eps0)
        assert fmt_numerical_delta(eps, eps0, 1) == pytest.approx(_hockey(p, q, eps), rel=1e-12)


@pytest.mark.parametrize("eps0", [0.5, 2.0])
def test_exact_delta_is_the_clone_mixture_divergence(eps0: float) -> None:
    n = 30
    pc = stats.binom.pmf(np.arange(n), n - 1, math.exp(-eps0))
    for eps in (0.05, 0.3, eps0 / 2):
        brute = sum(pc[c] * _hockey(*_clone_pair(c, eps0), eps) for c in range(n))
        assert fmt_numerical_delta(eps, eps0, n, step=1) == pytest.approx(brute, rel=1e-10)
        assert fmt_numerical_delta(eps, eps0, n, step=7) >= brute * (1 - 1e-12)  # blocks only loosen


def _rr_shuffle_delta(eps0: float, n: int, eps: float) -> float:
    """Exact delta of shuffled binary randomized response, worst case over the other users' inputs."""
    a = math.exp(eps0) / (1 + math.exp(eps0))  # report = input w.p. a
    worst = 0.0
    for k in range(n):  # k of the other n-1 users hold 1
        rest = np.convolve(stats.binom.pmf(np.arange(n - k), n - 1 - k, 1 - a), stats.binom.pmf(np.arange(k + 1), k, a))
        p0 = np.convolve(rest, [a, 1 - a])  # first user holds 0: count of 1-reports
        p1 = np.convolve(rest, [1 - a, a])
        worst = max(worst, _hockey(p0, p1, eps), _hockey(p1, p0, eps))
    return worst


@pytest.mark.parametrize(("eps0", "n", "delta"), [(1.0, 60, 1e-3), (2.0, 200, 1e-4), (0.5, 20, 1e-2)])
def test_bound_holds_for_exactly_shuffled_randomized_response(eps0: float, n: int, delta: float) -> None:
    eps = fmt_numerical(eps0, n, delta, step=1)
    assert eps is not None and eps < eps0
    assert _rr_shuffle_delta(eps0, n, eps) <= delta
    # and the amplification is real for RR: at eps0 / 2 its shuffled delta is far above 0 but below local RR's
    assert 0 < _rr_shuffle_delta(eps0, n, eps0 / 2) < fmt_numerical_delta(eps0 / 2, eps0, 1)


def test_closed_form_is_never_below_the_simplified_theorem() -> None:
    for eps0 in (0.1, 0.5, 1.0, 2.0):
        for n in (10_000, 100_000):
            got = fmt_closed_form(eps0, n, DELTA)
            assert got is not None
            a = 8 * math.sqrt(math.exp(eps0) * math.log(4 / DELTA) / n)
            c = 8 * math.exp(eps0) / n
            simplified = math.log1p(math.tanh(eps0 / 2) * (a + c))  # (e^eps0 - 1)/(e^eps0 + 1) = tanh(eps0/2)
            # the reference's factor (1 - e^-eps0) / (1 + e^-eps0 / (1 + a + c)) is >= tanh(eps0/2), < 2 tanh(eps0/2)
            assert simplified <= got < math.log1p(2 * math.tanh(eps0 / 2) * (a + c))


# ------------------------------------------------------------------------------------ properties

def test_monotone_in_n_and_eps0() -> None:
    ns = [200, 1_000, 5_000, 20_000]
    for eps0 in (0.5, 1.0, 2.0, 4.0):
        eps = [shuffled_epsilon(eps0, n, DELTA).epsilon for n in ns]
        assert all(x > y for x, y in zip(eps, eps[1:])), (eps0, eps)
    for n in (500, 10_000):
        eps = [shuffled_epsilon(e, n, DELTA).epsilon for e in (0.25, 0.5, 1.0, 2.0, 3.0, 4.0)]
        assert all(x < y for x, y in zip(eps, eps[1:])), (n, eps)
    closed = [fmt_closed_form(1.0, n, DELTA) for n in (2_000, 5_000, 20_000)]
    assert all(x is not None for x in closed) and closed[0] > closed[1] > closed[2]  # type: ignore[operator]


def test_never_above_eps0_and_numerical_beats_closed_form() -> None:
    for eps0 in (0.05, 0.5, 1.0, 3.0, 6.0):
        for n in (2, 10, 100, 1_000, 10_000):
            g = shuffled_epsilon(eps0, n, DELTA)
            assert g.epsilon <= eps0 and g.n == n and g.eps0 == eps0
            closed = fmt_closed_form(eps0, n, DELTA)
            if closed is not None:
                assert g.epsilon <= closed
                assert fmt_numerical(eps0, n, DELTA, step=1) <= closed  # type: ignore[operator]


def test_condition_boundary() -> None:
    n = 10_000
    edge = math.log(n / (16 * math.log(4 / DELTA)))  # ~3.5
    assert amplification_condition(edge * (1 - 1e-9), n, DELTA)
    assert not amplification_condition(edge * (1 + 1e-9), n, DELTA)
    assert fmt_closed_form(edge * (1 - 1e-9), n, DELTA) is not None
    assert fmt_closed_form(edge * (1 + 1e-9), n, DELTA) is None
    # beyond the closed form's regime the numerical analysis still holds and is used
    g = shuffled_epsilon(edge + 0.5, n, DELTA)
    assert g.amplified and g.bound == "fmt-numerical" and g.epsilon < edge + 0.5
    assert "fails" in g.note
    # n so small the closed form never applies at this delta (16 log(4/delta) ~ 243 > n)
    assert all(fmt_closed_form(e, 200, DELTA) is None for e in (0.01, 1.0, 5.0))


def test_no_amplification_is_the_local_guarantee() -> None:
    g = shuffled_epsilon(1.0, 1, DELTA)
    assert g == ShuffleGuarantee(epsilon=1.0, delta=0.0, eps0=1.0, n=1, bound="none", amplified=False, note=g.note)
    assert "no one to hide among" in g.note and "condition eps0 <= log(n / (16 log(4/delta))) fails" in g.note
    assert fmt_numerical(1.0, 1, DELTA) is None
    h = shuffled_epsilon(800.0, 10_000, DELTA)  # no clones at all
    assert not h.amplified and h.epsilon == 800.0 and h.delta == 0.0
    with pytest.raises(AttributeError):  # frozen
        g.epsilon = 0.5  # type: ignore[misc]


def test_local_epsilon_for_central_round_trips() -> None:
    for target, n in ((0.5, 1_000), (1.0, 10_000), (0.2, 300)):
        e0 = local_epsilon_for_central(target, n, DELTA)
        assert e0 > target
        assert shuffled_epsilon(e0, n, DELTA).epsilon <= target
        assert shuffled_epsilon(e0 + 2e-6, n, DELTA).epsilon > target  # the largest, to 1e-6
    assert local_epsilon_for_central(0.7, 1, DELTA) == 0.7  # no amplification: the target itself


# ------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("func", [fmt_closed_form, fmt_numerical, shuffled_epsilon, amplification_condition])
def test_input_validation(func) -> None:  # type: ignore[no-untyped-def]
    for bad in (0.0, -1.0, math.inf, math.nan, "x"):
        with pytest.raises(ValueError, match="eps0"):
            func(bad, 100, DELTA)
    for bad_n in (0, -5, 10.0, 2.5, True, "100"):
        with pytest.raises(ValueError, match="`n`"):
            func(1.0, bad_n, DELTA)
    for bad_d in (0.0, 1.0, -1e-6, 2.0, math.nan):
        with pytest.raises(ValueError, match="delta"):
            func(1.0, 100, bad_d)
    assert func(1.0, np.int64(5000), DELTA) is not None  # numpy integers are integers


def test_other_parameters_validated() -> None:
    with pytest.raises(ValueError, match="target_eps"):
        local_epsilon_for_central(0.0, 100, DELTA)
    with pytest.raises(ValueError, match="step"):
        fmt_numerical(1.0, 100, DELTA, step=0)
    with pytest.raises(ValueError, match="iterations"):
        fmt_numerical(1.0, 100, DELTA, iterations=0)
    with pytest.raises(ValueError, match="`eps`"):
        fmt_numerical_delta(-0.1, 1.0, 100)
