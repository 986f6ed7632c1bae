"""CoLin over every LastFM user in the running system: ``--graph users`` through broker, worker, Redis and HTTP.

One live stack (``graph = users``, CoLin, epsilon = 2): the LastFM replay drives it, then the test checks that
each of the 1,892 users is a model unit of their own, that the release is sparse (no ``N x N`` matrix in Redis),
that the served models are exactly the matrix-free solve of the published release (post-processing of public
values only), and that a user without interactions is served the public prior width.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import scipy.sparse as sp

from models.streaming import ReleasedStats
from models.streaming.solve import solve_sparse
from pipeline import services
from pipeline.data.catalog import load_catalog
from pipeline.config.keys import PublicKeys
from pipeline.config.settings import Settings
from privrec.cli import main
from producers.lastfm.raw import resolve_data_dir

from stacks import REPO, http, wait_for

pytestmark = pytest.mark.integration

NS = "fg"
ENV = {"PRIVREC_NAMESPACE": NS, "PRIVREC_CATALOG": "lastfm", "PRIVREC_GRAPH": "users", "PRIVREC_ALGORITHM": "colin",
       "PRIVREC_EPSILON": "2", "PRIVREC_TICK_SECONDS": "0.5", "PRIVREC_LOGLEVEL": "WARNING"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: services.ServiceHandle) -> Iterator[dict[str, Any]]:
    try:
        resolve_data_dir(None)
    except Exception:
        pytest.skip("the HetRec LastFM data directory is not available (set PRIVREC_DATA_DIR)")
    tmp = tmp_path_factory.mktemp("fullgraph")
    broker = services.start_broker(tmp)
    services.create_topics(broker.address, {"interactions": 4, "dead-letters": 1, "recommendations": 1})
    env = {**os.environ, **ENV, "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": redis_server.url,
           "PRIVREC_STATE_DIR": str(tmp), "PYTHONPATH": str(REPO)}
    client = redis.Redis.from_url(redis_server.url)
    started = []
    try:
        started.append(services.start_process(
            "worker-0", [sys.executable, "-m", "pipeline.apps.worker"], tmp, env=env, timeout=120,
            ready=lambda: bool(client.hgetall(f"{NS}:ops:{{{NS}:ops}}:workers"))))
        port = services.free_port()
        web = services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], tmp,
                                     env=env, address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}")
        started.append(web)
        out = tmp / "replay"
        assert main(["replay", "lastfm", "--events", "600", "--rate", "400", "--out", str(out), "--http", web.url,
                     "--no-progress"]) == 0
        yield {"url": web.url, "client": client, "replay": json.loads((out / "replay.json").read_text()),
               "settings": Settings.from_mapping({}, environ={**ENV, "REDIS_URL": redis_server.url})}
    finally:
        for h in reversed(started):
            services.stop(h, grace_seconds=5)
        services.stop(broker)


def _settled(st: dict[str, Any]) -> tuple[ReleasedStats, dict[str, bytes]]:
    """The last release once it covers the replay and is the served version."""
    client = st["client"]
    rel_key, meta_key = f"{NS}:released:{{{NS}:rel}}:stats", f"{NS}:model:{{{NS}:model}}:meta"

    def done() -> bool:
        raw = client.hgetall(rel_key)
        return bool(raw) and int(raw[b"count"]) >= 600 and client.hget(meta_key, "version") == raw[b"version"]

    wait_for(done, 60, "the replay's events in a served release")
    while True:  # a release published between two reads: take the next settled pair
        raw = client.hgetall(rel_key)
        if client.hget(meta_key, "version") == raw[b"version"] and client.hget(rel_key, "version") == raw[b"version"]:
            return ReleasedStats.from_mapping(raw), raw
        wait_for(done, 60, "a served release")


def test_every_user_is_a_unit_and_the_release_stays_sparse(stack: dict[str, Any]) -> None:
    released, raw = _settled(stack)
    n = 1892
    assert released.structure == "sparse-kron" and sp.issparse(released.V) and released.V.shape == (n, n)
    assert released.V.nnz < 0.01 * n * n  # the friend graph, not a dense relation
    assert sum(len(v) for v in raw.values()) < n * n * 8  # a dense V alone would be 28.6 MB
    client = stack["client"]
    m = {k.decode(): v.decode() for k, v in client.hgetall(f"{NS}:model:{{{NS}:model}}:meta").items()}
    assert m["n_units"] == str(n) and m["algorithm"] == "colin" and "conjugate gradients" in m["solver"]
    assert int(m["width_users"]) == int((released.count > 0).sum()) > 50
    privacy = json.loads(m["privacy"])
    assert privacy["private"] is True and privacy["epsilon"] == pytest.approx(2.0, rel=1e-6)
    assert stack["replay"]["events"] == 600 and stack["replay"]["model"]["algorithm"] == "colin"


def test_served_models_are_the_matrix_free_solve_of_the_published_release(stack: dict[str, Any]) -> None:
    s: Settings = stack["settings"]
    cat = load_catalog(s)
    client = stack["client"]
    for _ in range(20):  # the tick keeps publishing: read the served models of one release, all of the same version
        released, _ = _settled(stack)
        active = np.flatnonzero(released.count > 0)
        picked = [int(active[i]) for i in (0, len(active) // 2, len(active) - 1)]
        served = [client.hgetall(PublicKeys(NS).model_unit(u)) for u in picked]
        if all(int(raw[b"version"]) == released.version for raw in served):
            break
    else:
        pytest.fail("no release whose served models all carry its version in 20 attempts")
    ours = solve_sparse(released, lambda_=s.lambda_, noise_ridge=s.noise_ridge, users=active, tol=1e-10)
    scale = float(np.abs(ours.theta).max())
    for u, raw in zip(picked, served):
        i = int(np.searchsorted(active, u))  # ours.M has the active users' rows only
        theta = np.frombuffer(raw[b"theta"], dtype="<f8")
        M = np.frombuffer(raw[b"M"], dtype="<f8").reshape(cat.d, cat.d)
        # the worker solves warm-started to a relative residual of 1e-8; here from zero to 1e-10
        np.testing.assert_allclose(theta, ours.theta[u], atol=1e-5 * scale)
        np.testing.assert_allclose(M, ours.M[i], rtol=1e-12, atol=1e-15)
    # users of one LastFM cluster have models of their own
    users = list(cat.users)
    by_cluster: dict[int, list[int]] = {}
    for u in active:
        by_cluster.setdefault(cat.lastfm.cluster_of(users[int(u)]), []).append(int(u))
    a, b = next(v for v in by_cluster.values() if len(v) >= 2)[:2]
    assert not np.allclose(ours.theta[a], ours.theta[b])


def test_a_user_without_interactions_is_served_with_the_prior_width(stack: dict[str, Any]) -> None:
    released, _ = _settled(stack)
    cat = load_catalog(stack["settings"])
    users = list(cat.users)
    idle = next(u for u in range(len(users)) if released.count[u] == 0)
    assert not stack["client"].hexists(PublicKeys(NS).model_unit(idle), "M")
    rec = http("GET", f"{stack['url']}/recommend?user={users[idle]}&k=3").expect(200)
    assert rec["unit"] == idle and len(rec["items"]) == 3
    busy = int(np.flatnonzero(released.count > 0)[0])
    other = http("GET", f"{stack['url']}/recommend?user={users[busy]}&k=3").expect(200)
    assert other["unit"] == busy and other["unit"] != rec["unit"]


def test_goblin_over_every_user_releases_the_laplacian_and_serves_its_solve(redis_server: services.ServiceHandle) -> None:
    """GOB.Lin with ``graph = users``: the release and solve stages on a real redis-server (no broker needed)."""
    try:
        resolve_data_dir(None)
    except Exception:
        pytest.skip("the HetRec LastFM data directory is not available (set PRIVREC_DATA_DIR)")
    from models.streaming import UnitStats
    from pipeline.release.stages import ReleaseStage, SolveStage
    from pipeline.state.trusted import TrustedStore

    # without noise, so that an idle user's model can only come from the graph (the CoLin stack runs at eps = 2)
    s = Settings.from_mapping({"catalog": "lastfm", "graph": "users", "algorithm": "goblin", "epsilon": "inf",
                               "namespace": "fggob", "privacy_unit": "event", "redis_url": redis_server.url},
                              environ={})
    cat = load_catalog(s)
    client = redis.Redis.from_url(redis_server.url)
    release = ReleaseStage(s, cat, client)
    rng = np.random.default_rng(5)
    units = rng.integers(0, cat.n_units, 400)
    X = rng.normal(size=(400, cat.d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    stats = UnitStats.zeros(n_units=cat.n_units, d=cat.d)
    stats.add(units, X, rng.integers(0, 2, 400).astype(float))
    assert TrustedStore(client, s.namespace).commit_partition(0, stats, units, None, 400, {})
    assert release.tick() == 1
    solve = SolveStage(s, client, release.statement)
    assert solve.run() == 1
    released = ReleasedStats.from_mapping(client.hgetall(PublicKeys(s.namespace).released))
    assert released.structure == "laplacian" and released.Q is not None
    deg = np.asarray(released.Q.diagonal()) - 1  # I + L: the diagonal is 1 + each user's number of friends
    assert deg.min() >= 0 and deg.max() > 10 and (released.V != sp.identity(cat.n_units)).nnz == 0
    ours = solve_sparse(released, lambda_=s.lambda_, noise_ridge=s.noise_ridge, tol=1e-10,
                        users=np.flatnonzero(released.count > 0))
    u = int(units[0])
    served = np.frombuffer(client.hget(PublicKeys(s.namespace).model_unit(u), "theta"), dtype="<f8")
    np.testing.assert_allclose(served, ours.theta[u], atol=1e-5 * float(np.abs(ours.theta).max()))
    # a user without interactions of their own learns from a friend who has some (the Laplacian couples them)
    Q = sp.csr_matrix(released.Q)
    pair = next((int(v), int(w)) for v in np.flatnonzero(released.count > 0)
                for w in Q.indices[Q.indptr[v]:Q.indptr[v + 1]] if w != v and released.count[w] == 0)
    assert np.abs(ours.theta[pair[1]]).max() > 0
