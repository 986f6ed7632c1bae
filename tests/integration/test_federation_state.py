"""The federated protocol's state against a real redis-server: the coordinator's dedup and sum, consensus rounds."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from models.ground.consensus import mixing_matrix, topology_adjacency
from models.streaming import Releaser, UnitStats
from models.streaming.federated import assign_sites, mix_views
from pipeline.modes.federated.federation import ConsensusSite, Coordinator, decode_message, encode_message, site_namespace

N, D, M = 6, 2, 4


def _site_releases(seed: int, rounds: int) -> list[list]:
    """Per round, each site's cumulative noise-off release of random events."""
    rng = np.random.default_rng(seed)
    site_of = assign_sites(N, M)
    stats = [UnitStats.zeros(n_units=N, d=D) for _ in range(M)]
    rel = Releaser(structure="linucb", V=np.eye(N), d=D, mechanism=None)
    out = []
    for r in range(rounds):
        for _ in range(10):
            u = int(rng.integers(N))
            x = rng.normal(size=D)
            stats[site_of[u]].add(np.array([u]), (x / np.linalg.norm(x))[None], np.array([float(rng.integers(2))]))
        out.append([rel.release(s, None, version=r + 1)[0] for s in stats])
    return out


def test_coordinator_counts_a_resent_release_once_and_sums_the_latest(redis_client: redis.Redis) -> None:
    coord = Coordinator(redis_client, "fedtest", V=np.eye(N), structure="linucb", sites=M)
    rounds = _site_releases(seed=0, rounds=2)
    zeros = np.zeros(N)
    for site, rel in enumerate(rounds[0]):
        raw = encode_message("release", site=site, version=1, release=rel, block_std=zeros)
        assert coord.offer(decode_message(raw, n_units=N, d=D, sites=M), raw)
        assert not coord.offer(decode_message(raw, n_units=N, d=D, sites=M), raw)  # a re-send counts once
    v1 = coord.aggregate(n_units=N, d=D)
    assert v1 == M and coord.aggregate(n_units=N, d=D) is None  # unchanged: nothing new to publish
    raw = encode_message("release", site=2, version=2, release=rounds[1][2], block_std=zeros)
    assert coord.offer(decode_message(raw, n_units=N, d=D, sites=M), raw)
    old = encode_message("release", site=2, version=1, release=rounds[0][2], block_std=zeros)
    assert not coord.offer(decode_message(old, n_units=N, d=D, sites=M), old)  # an older version is ignored
    assert coord.aggregate(n_units=N, d=D) == M + 1
    from models.streaming import ReleasedStats
    from pipeline.config.keys import PublicKeys

    published = ReleasedStats.from_mapping(redis_client.hgetall(PublicKeys("fedtest").released))
    expected = [rounds[0][s] if s != 2 else rounds[1][2] for s in range(M)]
    np.testing.assert_allclose(published.b_tilde, sum(e.b_tilde for e in expected), atol=1e-12)
    np.testing.assert_allclose(published.gram, sum(e.gram for e in expected), atol=1e-12)
    assert published.count.tolist() == sum(e.count for e in expected).tolist()


def test_consensus_rounds_follow_y_next_equals_P_s_exactly(redis_client: redis.Redis) -> None:
    P = mixing_matrix(topology_adjacency("ring", M), kappa=0.5)
    sites = [ConsensusSite(redis_client, site_namespace("fedtest", i), site=i, P=P, n_units=N, d=D,
                           structure="linucb") for i in range(M)]
    rounds = _site_releases(seed=1, rounds=5)
    # the offline twin: mix_views on the same increments
    from models.streaming.federated import FederatedUCB  # noqa: F401  (same math as FederatedUCB.release)
    views = [sites[0].view()] * M
    shared = [None] * M
    for releases in rounds:
        msgs = [s.start_round(rel, np.zeros(N)) for s, rel in zip(sites, releases)]
        assert [s.start_round(rel, np.zeros(N)) for s, rel in zip(sites, releases)] == msgs  # fixed per round
        assert not sites[0].finish_round()  # neighbours' states not filed yet
        for s in sites:
            for raw in msgs:
                msg = decode_message(raw, n_units=N, d=D, sites=M)
                s.receive(msg, raw)
        assert all(s.finish_round() for s in sites)
        deltas = []
        for i, rel in enumerate(releases):
            prev = shared[i]
            deltas.append(rel if prev is None else type(rel)(rel.structure, rel.V, rel.gram - prev.gram,
                                                            rel.b_tilde - prev.b_tilde, rel.count - prev.count))
            shared[i] = rel
        views = mix_views(P, views, deltas)
        for i, s in enumerate(sites):
            np.testing.assert_allclose(s.view().b_tilde, views[i].b_tilde, atol=1e-12)
            np.testing.assert_allclose(s.view().gram, views[i].gram, atol=1e-12)
    assert sites[0].round == len(rounds)
    # the network average of the views is the average of what the sites released
    avg = np.mean([s.view().b_tilde for s in sites], axis=0)
    np.testing.assert_allclose(avg, sum(r.b_tilde for r in rounds[-1]) / M, atol=1e-12)


def test_a_site_ignores_messages_from_non_neighbours(redis_client: redis.Redis) -> None:
    P = mixing_matrix(topology_adjacency("ring", M), kappa=0.5)
    site0 = ConsensusSite(redis_client, site_namespace("fedtest", 0), site=0, P=P, n_units=N, d=D, structure="linucb")
    rel = _site_releases(seed=2, rounds=1)[0][2]
    other = ConsensusSite(redis_client, site_namespace("fedtest", 2), site=2, P=P, n_units=N, d=D, structure="linucb")
    raw = other.start_round(rel, np.zeros(N))
    assert site0.neighbours == [1, 3]
    assert not site0.receive(decode_message(raw, n_units=N, d=D, sites=M), raw)


@pytest.mark.parametrize("raw,reason", [
    (b"{", "not JSON"),
    (b"[1, 2]", "not a federated update"),
    (b'{"meta": "!!"}', "undecodable"),
])
def test_malformed_messages_say_why(raw: bytes, reason: str) -> None:
    from pipeline.modes.federated.federation import MalformedMessage

    with pytest.raises(MalformedMessage, match=reason):
        decode_message(raw, n_units=N, d=D, sites=M)


def test_messages_with_wrong_shapes_or_sites_are_refused() -> None:
    from pipeline.modes.federated.federation import MalformedMessage

    rel = _site_releases(seed=3, rounds=1)[0][0]
    raw = encode_message("release", site=7, version=1, release=rel, block_std=np.zeros(N))
    with pytest.raises(MalformedMessage, match="unknown site 7"):
        decode_message(raw, n_units=N, d=D, sites=M)
    raw = encode_message("release", site=1, version=1, release=rel, block_std=np.zeros(N))
    with pytest.raises(MalformedMessage, match="shape"):
        decode_message(raw, n_units=N + 1, d=D, sites=M)
    bad = rel.__class__(rel.structure, rel.V, rel.gram, rel.b_tilde * np.nan, rel.count)
    raw = encode_message("release", site=1, version=1, release=bad, block_std=np.zeros(N))
    with pytest.raises(MalformedMessage, match="NaN"):
        decode_message(raw, n_units=N, d=D, sites=M)
