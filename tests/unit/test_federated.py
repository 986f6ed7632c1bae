"""Federated mode's math: site graphs, consensus mixing, site releases and their aggregation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.ground.consensus import (
    consensus_steps,
    edges_adjacency,
    graph_constants,
    mixing_matrix,
    parse_edge_list,
    second_eigenvalue_modulus,
    topology_adjacency,
)
from models.ground.graphs import uniform_w
from models.streaming import Releaser, UnitStats
from models.streaming.federated import (
    FederatedUCB,
    assign_sites,
    is_sync_tick,
    mix_views,
    release_payload_bytes,
    sum_releases,
)


def _events(n_units: int, d: int, n: int, seed: int) -> list[tuple[int, np.ndarray, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=d)
        out.append((int(rng.integers(n_units)), x / max(1.0, float(np.linalg.norm(x))), float(rng.integers(0, 2))))
    return out


# ----------------------------------------------------------------------------- graphs and P


@pytest.mark.parametrize("topology,m", [("star", 5), ("ring", 6), ("ring", 7), ("complete", 4)])
def test_mixing_matrix_is_doubly_stochastic_symmetric_and_converges(topology: str, m: int) -> None:
    P = mixing_matrix(topology_adjacency(topology, m), kappa=0.5)
    assert np.allclose(P.sum(axis=0), 1.0) and np.allclose(P.sum(axis=1), 1.0)
    assert np.array_equal(P, P.T) and (P >= 0).all()
    lam = second_eigenvalue_modulus(P)
    assert 0 <= lam < 1
    # P^k -> 11^T / M at rate lam^k (spectral theorem for symmetric P): the bound is exact in the 2-norm
    for k in (1, 5, 20):
        gap = np.linalg.norm(np.linalg.matrix_power(P, k) - np.ones((m, m)) / m, 2)
        assert gap == pytest.approx(lam**k, rel=1e-9, abs=1e-12)


def test_kappa_one_on_an_even_ring_is_refused_but_works_on_a_star() -> None:
    # ERRATA §7: eigenvalue -1 exactly on bipartite *regular* graphs; a star is bipartite but not regular
    with pytest.raises(ValueError, match="would not converge"):
        mixing_matrix(topology_adjacency("ring", 20), kappa=1.0)
    assert second_eigenvalue_modulus(mixing_matrix(topology_adjacency("star", 20), kappa=1.0)) == pytest.approx(
        0.947, abs=1e-3)


def test_errata_graph_constants_and_ring_spectrum() -> None:
    P = mixing_matrix(topology_adjacency("ring", 20), kappa=0.5)
    assert second_eigenvalue_modulus(P) == pytest.approx(0.9755, abs=1e-4)  # ERRATA §7 table
    c0, ci = graph_constants(P)
    assert c0 == pytest.approx(509.8, abs=0.1) and ci[0] == pytest.approx(54.3, abs=0.1)
    assert consensus_steps(P, 1e-3) == math.ceil(math.log(1e-3) / math.log(second_eigenvalue_modulus(P)))


def test_edge_list_files_and_their_errors() -> None:
    A = edges_adjacency(parse_edge_list("0 1\n1 2  # path\n2,3\n"), 4)
    assert A.sum() == 6
    with pytest.raises(ValueError, match="not connected"):
        edges_adjacency([(0, 1), (2, 3)], 4)
    with pytest.raises(ValueError, match="line 2"):
        parse_edge_list("0 1\n0 x\n")
    with pytest.raises(ValueError, match="outside"):
        edges_adjacency([(0, 5)], 3)
    with pytest.raises(ValueError, match="self-loop"):
        edges_adjacency([(1, 1)], 3)


def test_doubling_schedule() -> None:
    assert [t for t in range(1, 40) if is_sync_tick(t, "doubling")] == [1, 2, 4, 8, 16, 32]
    assert all(is_sync_tick(t, "tick") for t in range(1, 10))
    with pytest.raises(ValueError, match="schedule"):
        is_sync_tick(3, "weekly")


# ----------------------------------------------------------------------------- aggregation


@pytest.mark.parametrize("structure", ["linucb", "kron"])
def test_noise_off_star_aggregate_equals_the_global_exact_statistics(structure: str) -> None:
    n, d, m = 8, 3, 3
    V = np.eye(n) if structure == "linucb" else uniform_w(n) * 0.5 + np.eye(n) * 0.5
    site_of = assign_sites(n, m)
    events = _events(n, d, 300, seed=4)
    whole = UnitStats.zeros(n_units=n, d=d)
    per_site = [UnitStats.zeros(n_units=n, d=d) for _ in range(m)]
    for u, x, r in events:
        whole.add(np.array([u]), x[None], np.array([r]))
        per_site[site_of[u]].add(np.array([u]), x[None], np.array([r]))
    rel = Releaser(structure="linucb" if structure == "linucb" else "kron", V=V, d=d, mechanism=None)
    exact = rel.release(whole, None)[0]
    agg = sum_releases([rel.release(s, None)[0] for s in per_site])
    assert np.array_equal(agg.count, exact.count)
    np.testing.assert_allclose(agg.gram, exact.gram, rtol=0, atol=1e-12)
    np.testing.assert_allclose(agg.b_tilde, exact.b_tilde, rtol=0, atol=1e-12)


def test_decentralized_views_converge_to_the_average_at_the_spectral_rate() -> None:
    n, d, m = 6, 2, 5
    sim = FederatedUCB(d=d, V=np.eye(n), site_of=assign_sites(n, m), topology="ring", tick=1)
    for u, x, r in _events(n, d, 40, seed=1):
        sim.update(u, x, r)
    stacked = np.stack([v.b_tilde for v in sim.views])
    total = sum(sim.stats[s].b.reshape(-1) for s in range(m))
    # running consensus keeps the network average equal to the average injected (P doubly stochastic)
    np.testing.assert_allclose(stacked.mean(axis=0), total / m, atol=1e-12)
    lam = second_eigenvalue_modulus(sim.P)  # type: ignore[arg-type]
    dist0 = np.linalg.norm(stacked - stacked.mean(axis=0))
    for tau in range(1, 30):  # syncs with nothing new: y <- P y
        sim.release()
        now = np.stack([v.b_tilde for v in sim.views])
        dist = np.linalg.norm(now - now.mean(axis=0))
        assert dist <= lam**tau * dist0 * (1 + 1e-9) + 1e-12
    assert dist > lam**29 * dist0 * 1e-3  # and the rate is not much faster than the bound (generic start)


def test_site_releases_differ_from_exact_by_exactly_the_sites_own_noise() -> None:
    n, d, m = 6, 3, 2
    sim = FederatedUCB(d=d, V=np.eye(n), site_of=assign_sites(n, m), topology="star", tick=5, epsilon=2.0,
                       horizon=200, seed=11)
    for u, x, r in _events(n, d, 50, seed=2):
        sim.update(u, x, r)
    for s in range(m):
        mech = sim.mechanisms[s]
        assert mech is not None
        own = sim.shared[s]
        noise = own.b_tilde - sim.stats[s].b.reshape(-1)
        np.testing.assert_allclose(noise, mech.noise(sim.states[s]), atol=1e-12)  # type: ignore[arg-type]
        blocks = noise.reshape(n, d)
        others = np.flatnonzero(sim.site_of != s)
        assert np.all(blocks[others] == 0.0)  # user-space noise only on the site's own units
        assert np.any(blocks[sim.site_of == s] != 0.0)
    # the star's aggregate noise on each unit block is its own site's noise: one draw per block, as in global mode
    agg_noise = sim.views[0].b_tilde.reshape(n, d) - sum(sim.stats[s].b for s in range(m))
    for u in range(n):
        s = int(sim.site_of[u])
        np.testing.assert_allclose(agg_noise[u], (sim.shared[s].b_tilde - sim.stats[s].b.reshape(-1)).reshape(n, d)[u],
                                   atol=1e-12)


def test_sites_keep_their_own_noise_keys() -> None:
    sim = FederatedUCB(d=2, V=np.eye(4), site_of=assign_sites(4, 2), topology="star", epsilon=1.0, horizon=10)
    a, b = sim.mechanisms
    assert a is not None and b is not None
    sa, sb = a.init_state(), b.init_state()
    _, sa, _ = a.step(sa, np.zeros(8))
    _, sb, _ = b.step(sb, np.zeros(8))
    # different secret keys: the noises of two sites are not the same draw
    assert not np.allclose(a.noise(sa)[:2], b.noise(sb)[2:4])


def test_doubling_schedule_shares_less_and_bytes_are_counted() -> None:
    n, d = 4, 2
    runs = {}
    for schedule in ("tick", "doubling"):
        sim = FederatedUCB(d=d, V=np.eye(n), site_of=assign_sites(n, 2), topology="ring", tick=1, schedule=schedule)
        for u, x, r in _events(n, d, 20, seed=3):
            sim.update(u, x, r)
        runs[schedule] = sim
    assert runs["tick"].syncs == 20 and runs["doubling"].syncs == 5  # ticks 1, 2, 4, 8, 16
    one = release_payload_bytes(runs["tick"].shared[0], runs["tick"].units[0])
    assert one == 8 * (2 * (d * d + 1) + n * d)
    # a 2-site "ring" is one edge: each site sends one message per sync
    assert runs["tick"].bytes_sent.tolist() == [20 * one, 20 * one]
    assert runs["doubling"].bytes_sent.tolist() == [5 * one, 5 * one]


def test_mix_views_checks_shapes() -> None:
    sim = FederatedUCB(d=2, V=np.eye(3), site_of=assign_sites(3, 3), topology="complete")
    with pytest.raises(ValueError, match="3 x 3"):
        mix_views(np.eye(2), sim.views, [None, None, None])


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="site_of"):
        FederatedUCB(d=2, V=np.eye(3), site_of=np.array([0, 1]))
    with pytest.raises(ValueError, match="schedule"):
        FederatedUCB(d=2, V=np.eye(3), site_of=assign_sites(3, 1), schedule="hourly")
    sim = FederatedUCB(d=2, V=np.eye(3), site_of=assign_sites(3, 1))
    with pytest.raises(ValueError, match="user"):
        sim.update(3, np.zeros(2), 1.0)


@pytest.mark.parametrize("colin", [False, True])
def test_star_noise_level_equals_the_global_modes_with_user_space_noise(colin: bool) -> None:
    from models.ground.graphs import sensitivities
    from models.mechanisms import make_mechanism, noise_std

    n, d, m = 6, 2, 3
    V = (uniform_w(n) + np.eye(n)) / 2 if colin else np.eye(n)
    sim = FederatedUCB(d=d, V=V, site_of=assign_sites(n, m), topology="star", tick=1, epsilon=2.0, horizon=64)
    glob = make_mechanism("user-blt-exact", dim=n * d, sensitivity=float(sensitivities(V).max()), epsilon=2.0,
                          delta=1e-5, horizon=64, seed=0, mixing=V, block_dim=d)
    state = glob.init_state()
    for u, x, r in _events(n, d, 7, seed=5):
        sim.update(u, x, r)
        _, state, _ = glob.step(state, np.zeros(n * d))
    assert sim.views[0].noise_std == pytest.approx(noise_std(glob, state), rel=1e-12)
    assert sim.views[0].noise_std > 0


def test_sensitivity_scale_scales_every_sites_noise_and_a_listen_stays_out_of_the_gram() -> None:
    """``sensitivity_scale`` (the sites' replace-one and user-level calibration) multiplies the noise std exactly; an
    organic listen (``gram=False``) adds to ``b`` and the count, never to the public Gram matrix."""
    n, d = 4, 2
    kw = dict(d=d, V=np.eye(n), site_of=assign_sites(n, 2), tick=1, epsilon=2.0, horizon=16, seed=3)
    one, two = FederatedUCB(**kw), FederatedUCB(**kw, sensitivity_scale=2.0)  # type: ignore[arg-type]
    for sim in (one, two):
        sim.update(1, np.array([0.6, 0.0]), 1.0, gram=False)
    assert two.views[0].noise_std == pytest.approx(2 * one.views[0].noise_std, rel=1e-12) and one.views[0].noise_std > 0
    plain = FederatedUCB(d=d, V=np.eye(n), site_of=assign_sites(n, 2), tick=1)
    plain.update(1, np.array([0.6, 0.0]), 1.0, gram=False)
    assert np.all(plain.views[0].gram == 0) and plain.views[0].b_tilde.reshape(n, d)[1].tolist() == [0.6, 0.0]
    assert plain.views[0].count.tolist() == [0, 1, 0, 0]
    with pytest.raises(ValueError, match="sensitivity_scale"):
        FederatedUCB(d=d, V=np.eye(n), site_of=assign_sites(n, 2), sensitivity_scale=0.0)
