"""The synthetic population of ``privrec experiment modes``: the listens' draw without the events x items array, and
a population size whose blanket cannot be calibrated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from privrec.experiments.population import PopulationConfig, SyntheticPopulation, inverse_cdf, population_gain


@dataclass
class _Dense:
    """The population as ``SyntheticPopulation.__post_init__`` drew it before the per-unit draw (the listens from
    ``cdf[units]``, an events x items array: 24 GB at a million users). Kept here only, as the reference."""

    users: np.ndarray
    units: np.ndarray
    listened: np.ndarray
    pools: np.ndarray
    correct: np.ndarray


def _dense(n_users: int, n_units: int = 100, n_items: int = 1_000, d: int = 25, events_per_user: int = 3,
           pool: int = 25, beta: float = 3.0, zipf: float = 1.0, seed: int = 0) -> _Dense:
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(n_items, d))
    features = F / np.linalg.norm(F, axis=1, keepdims=True)
    w_units = 1.0 / np.arange(1, n_units + 1)
    unit_of_user = rng.choice(n_units, size=n_users, p=w_units / w_units.sum())
    tastes = rng.normal(size=(n_units, d))
    tastes /= np.linalg.norm(tastes, axis=1, keepdims=True)
    log_pop = -zipf * np.log(np.arange(1, n_items + 1))
    rng.shuffle(log_pop)
    logits = beta * tastes @ features.T + log_pop
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    users = np.repeat(np.arange(n_users), events_per_user)
    rng.shuffle(users)
    units = unit_of_user[users]
    cdf = np.cumsum(probs, axis=1)
    u = rng.random(len(users))
    listened = np.minimum((cdf[units] < u[:, None]).sum(axis=1), n_items - 1)
    others = rng.integers(0, n_items - 1, size=(len(users), pool - 1))
    others[others >= listened[:, None]] += 1
    correct = rng.integers(0, pool, size=len(users))
    pools = np.empty((len(users), pool), dtype=np.int64)
    rows = np.arange(len(users))
    mask = np.ones((len(users), pool), dtype=bool)
    mask[rows, correct] = False
    pools[mask] = others.ravel()
    pools[rows, correct] = listened
    return _Dense(users, units, listened, pools, correct)


@pytest.mark.parametrize(
    "kw",
    [
        {"n_users": 50, "n_units": 5, "n_items": 40, "events_per_user": 2, "seed": 0},  # the module's doctest
        {"n_users": 600, "n_items": 100, "seed": 0},  # the modes test's population axis
        {"n_users": 2_000, "seed": 3},  # the defaults: 100 units, 1,000 items, 3 events per user
        {"n_users": 1_000, "n_units": 7, "n_items": 300, "beta": 300.0, "seed": 5},  # most items' probability is 0:
        # flat stretches of the cdf, where a tie between u and an entry decides the item
    ],
    ids=["doctest", "modes-test", "defaults-2k", "flat-cdf"],
)
def test_the_draw_is_bit_identical_to_the_dense_formula(kw: dict[str, float]) -> None:
    new, old = SyntheticPopulation(**kw), _dense(**kw)  # type: ignore[arg-type]
    for name in ("users", "units", "listened", "pools", "correct"):
        a, b = getattr(new, name), getattr(old, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b), name
    assert (new.pools[np.arange(new.n), new.correct] == new.listened).all()


def test_inverse_cdf_counts_the_entries_below_u_and_clamps_to_the_last_item() -> None:
    cdf = np.array([[0.2, 0.2, 0.6, 0.9999], [0.0, 0.0, 1.0, 1.0]])
    rows = np.array([0, 0, 0, 0, 1, 1, 1])
    u = np.array([0.2, 0.20000001, 0.99995, 0.1, 0.0, 0.5, 0.999])
    got = inverse_cdf(cdf, rows, u)
    assert got.tolist() == [0, 2, 3, 0, 0, 2, 2]  # 0.99995 is past the row's rounded total: the last item
    assert np.array_equal(got, np.minimum((cdf[rows] < u[:, None]).sum(axis=1), 3))
    assert inverse_cdf(cdf, rows[:0], u[:0]).shape == (0,)
    with pytest.raises(ValueError, match="`rows` must index the 2 rows"):
        inverse_cdf(cdf, np.array([0, 2]), np.array([0.1, 0.2]))


def test_a_size_whose_blanket_cannot_be_calibrated_is_reported_not_raised() -> None:
    """At epsilon = 1 the item reports get (0.5, 5e-6) over 2 batches: 400 users per batch are too few (867 are
    needed), so the private run cannot start; the non-private twin and random play are still measured."""
    cfg = PopulationConfig(epsilon=1.0, n_items=60, n_units=5, min_batch=400)
    row = population_gain(300, cfg)
    assert row["uncalibrated"].startswith("no blanket reaches (0.5, 5e-06) with n = 400 users per batch and 2 ")
    assert "867 users" in row["uncalibrated"]
    assert row["local_shuffle"] is None and row["gain"] is None and row["reached"] is None
    assert row["events"] == 900 and row["nonprivate"] > row["random"] == pytest.approx(900 / 25)
    ok = population_gain(300, PopulationConfig(epsilon=4.0, n_items=60, n_units=5, min_batch=400))
    assert ok["uncalibrated"] is None and isinstance(ok["gain"], float)
