"""Popularity: the counter, the item term, its budget split and the offline replay protocol."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.accounting import GDPAccountant, gdp_mu, split_epsilon
from models.ground.items import ReleasedItems, popularity_feature
from models.mechanisms import noise_std
from models.policies import OnlinePopularity, PopularityUCB, make_policy, make_popularity_policy
from privrec.experiments.lastfm import LastFMEvents, replay_offline


def test_online_popularity_counts_positives_globally_or_per_unit_and_breaks_ties_at_random() -> None:
    pop = OnlinePopularity(4, n_units=2, per_unit=True, seed=0)
    pop.observe(0, 3)
    pop.update(1, np.zeros(1), 1.0, 2)
    pop.update(0, np.zeros(1), 0.0, 1)  # a miss adds nothing
    assert pop.select(0, np.zeros((3, 1)), np.array([1, 2, 3])) == 2  # unit 0 has counted item 3
    assert pop.select(1, np.zeros((3, 1)), np.array([1, 2, 3])) == 1  # unit 1 has counted item 2
    glob = OnlinePopularity(4, seed=1)
    picks = {glob.select(0, np.zeros((4, 1)), np.arange(4)) for _ in range(200)}
    assert picks == {0, 1, 2, 3}  # all tied at zero: every one gets picked


def test_popularity_feature_is_in_unit_interval_and_thresholds_the_noise() -> None:
    rng = np.random.default_rng(0)
    sums = rng.normal(0, 5, size=1000) + np.r_[np.full(10, 200.0), np.zeros(990)]
    f = popularity_feature(sums, total=2000, threshold=0.0)
    assert f.min() >= 0 and f.max() <= 1
    g = popularity_feature(sums, total=2000, threshold=4 * 5.0)
    assert np.all(g[:10] > 0.5) and np.count_nonzero(g[10:]) == np.count_nonzero(sums[10:] > 20.0)
    with pytest.raises(ValueError, match="threshold"):
        popularity_feature(sums, total=1, threshold=-1)


def test_released_items_round_trip_under_their_prefix() -> None:
    r = ReleasedItems(np.arange(5.0), total=9, noise_std=1.5)
    m = r.to_mapping()
    assert all(k.startswith("items/") for k in m)
    assert ReleasedItems.from_mapping({k.encode(): v for k, v in m.items()}) == r
    assert ReleasedItems.from_mapping({"meta": b"{}"}) is None


@pytest.mark.parametrize("share", [0.2, 0.5, 0.8])
def test_the_two_releases_compose_exactly_to_the_target(share: float) -> None:
    pol = make_popularity_policy("LinUCB", d=3, W=np.eye(2), n_items=7, epsilon=2.0, share=share, horizon=1000,
                                 tick=10, item_tick=10)
    assert pol.base is not None and pol.base.mechanism is not None and pol.item_mechanism is not None
    acc = GDPAccountant().compose(pol.base.mechanism.event).compose(pol.item_mechanism.event)
    assert acc.mu == pytest.approx(gdp_mu(2.0, 1e-5), rel=1e-9)  # exactly (2, 1e-5)-DP together
    mu_b = math.sqrt(GDPAccountant().compose(pol.base.mechanism.event).mu_squared)
    assert mu_b**2 / acc.mu_squared == pytest.approx(share, rel=1e-9)
    eb, es = split_epsilon(2.0, 1e-5, share)
    assert (eb < es) == (share < 0.5)


def test_a_mechanism_without_exact_accounting_is_refused_and_weight_zero_keeps_the_whole_budget() -> None:
    with pytest.raises(ValueError, match="exact"):
        make_popularity_policy("LinUCB", d=2, W=np.eye(2), n_items=3, epsilon=1.0, mechanism="paper")
    pol = make_popularity_policy("LinUCB", d=2, W=np.eye(2), n_items=3, epsilon=1.0, weight=0.0, horizon=100)
    assert pol.item_mechanism is None and pol.base is not None and pol.base.mechanism is not None
    mu = math.sqrt(GDPAccountant().compose(pol.base.mechanism.event).mu_squared)
    assert mu == pytest.approx(gdp_mu(1.0, 1e-5), rel=1e-9)


def test_noise_off_item_term_uses_the_exact_sums_and_the_listens_weight_the_bandit() -> None:
    F = np.eye(3)
    base = make_policy("LinUCB", d=3, W=np.eye(2), lambda_=1.0, alpha=0.0)
    twin = make_policy("LinUCB", d=3, W=np.eye(2), lambda_=1.0, alpha=0.0)
    pol = PopularityUCB(base, 3, weight=2.0, item_tick=2, listen_weight=0.25, features=F)
    pol.update(0, F[1], 1.0, 1)
    pol.observe(0, 2)
    twin.update(0, F[1], 1.0)
    twin.update(0, F[2], 0.25, gram=False)  # a listen: w r x in b only; its item (the user's choice) not in the Gram
    pol.update(1, F[0], 0.0, 0)  # second interaction: an item release
    twin.update(1, F[0], 0.0)
    np.testing.assert_array_equal(pol.released, [0.0, 1.0, 1.0])
    assert pol.released_total == 2 and pol.item_weight == 2.0
    mean, bonus = twin.scores(0, F)
    expected = mean + bonus + 2.0 * popularity_feature(np.array([0.0, 1.0, 1.0]), total=2)
    np.testing.assert_allclose(pol.scores(0, F, np.arange(3)), expected, atol=1e-12)


def test_private_item_release_is_the_exact_sums_plus_keyed_noise_and_the_weight_shrinks() -> None:
    pol = make_popularity_policy(None, d=2, W=np.eye(1), n_items=5, epsilon=1.0, item_tick=3, horizon=300, seed=4)
    assert pol.base is None and pol.item_mechanism is not None
    for i in range(9):
        pol.update(0, np.zeros(2), float(i % 2), i % 5)
    state = pol.item_state
    assert state is not None
    np.testing.assert_allclose(pol.released - pol.sums, pol.item_mechanism.noise(state), atol=1e-12)
    assert pol.released_std == pytest.approx(noise_std(pol.item_mechanism, state))
    assert pol.item_weight == pytest.approx(1.0 / (1.0 + (pol.released_std / 2.0) ** 2))


def test_replay_offline_protocol_rewards_the_logged_item_and_observes_a_listen_per_event() -> None:
    pools = np.array([[0, 1, 2], [2, 0, 1], [1, 2, 0]])
    ev = LastFMEvents(units=np.zeros(3, dtype=np.int64), pools=pools, correct=np.array([1, 0, 2]),
                      features=np.eye(3), W=np.eye(1), n_units=1)

    class Oracle:
        def __init__(self) -> None:
            self.i = 0
            self.listens = 0

        def select(self, u: int, X: np.ndarray, items: np.ndarray) -> int:
            k = [1, 1, 2][self.i]  # right, wrong, right
            self.i += 1
            return k

        def update(self, u: int, x: np.ndarray, r: float, item: int) -> None:
            pass

        def observe(self, u: int, item: int) -> None:
            self.listens += 1

    o = Oracle()
    curve: list[tuple[int, float]] = []
    assert replay_offline(o, ev, curve=curve, every=1) == 2.0
    # the logged listen of every event, hit or miss (issue 32: arrivals must not encode the rewards)
    assert o.listens == 3 and curve == [(1, 1.0), (2, 1.0), (3, 2.0)]


def _feed(pop: PrivatePopularity, rng: np.random.Generator, users: int = 400, units: int = 8) -> None:
    """A tick's worth of users at a time: each user one positive on a Zipf-ish item, from a unit of their own."""
    for i in range(users * 3):
        user = int(rng.integers(0, users))
        pop.begin_event(user)
        pop.observe(user % units, int(min(rng.zipf(1.5), pop.n_items) - 1))
        pop.update(user % units, np.zeros(1), 0.0, 0)


def test_federated_private_popularity_sums_each_sites_own_release() -> None:
    """``sites = 4``: the exact sums are the one-server sums (a user's unit decides their site), each site's release
    is its own mechanism's step on its own users' sums, and the released score is their sum: with zero exact sums
    the noise has the per-site std times 2 (chi-square bounds over 5,000 items, 6 sigma)."""
    from models.policies import PrivatePopularity

    one, four = (PrivatePopularity(50, epsilon=2.0, tick=100, seed=3, sites=s) for s in (1, 4))
    open1, open4 = (PrivatePopularity(50, epsilon=math.inf, tick=100, seed=3, sites=s) for s in (1, 4))
    for pop in (one, four, open1, open4):
        _feed(pop, np.random.default_rng(7))
    assert np.array_equal(four.exact, one.exact) and np.array_equal(open4.released, open1.released)
    assert np.allclose(four.site_exact.sum(axis=0), four.exact)
    replay = [m.init_state() for m in four.mechanisms]
    expected = np.zeros(50)
    for site, mech in enumerate(four.mechanisms):  # one more tick of each site's own mechanism on its sums
        for _ in range(four.ticks):
            y, replay[site], _ = mech.step_to(replay[site], four.site_exact[site])
        expected += y
    assert np.allclose(four.released, expected)  # (the site sums were constant since their last tick)
    assert four.released_std == pytest.approx(2.0 * one.released_std)
    big1, big4 = (PrivatePopularity(5_000, epsilon=2.0, tick=1, seed=5, sites=s) for s in (1, 4))
    for pop in (big1, big4):
        pop.update(0, np.zeros(1), 0.0, 0)  # one tick, nobody's positives: the release is the noise alone
    n = 5_000
    for pop, sites in ((big1, 1), (big4, 4)):
        std = noise_std(pop.mechanism, pop.states[0]) * math.sqrt(sites)
        ratio = float(np.mean(pop.released**2)) / std**2  # chi-square(n) / n: mean 1, sd sqrt(2 / n)
        assert abs(ratio - 1.0) < 6 * math.sqrt(2.0 / n)
