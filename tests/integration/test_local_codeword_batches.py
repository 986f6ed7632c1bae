"""Listens as codewords, sealed message by message (a real redis-server; the pipeline's own stages, no Kafka): devices
(the real :class:`models.local.LocalClient`) seal their messages to the analyzer's key, the ESA shuffler mixes them one
by one, the analyzer opens each, folds the histogram into the population's ``b`` (every unit's model), the release
publishes it and the served scores follow it; a message that does not open, or names no codeword, is a dead letter
with the reason, and the rest of the batch counts. The boundary: nothing the analyzer receives names a user."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio

from models.local import LocalClient, MemoryStorage
from models.local.aggregate import clip_context
from models.local.esa import SealedBatch, SealedShuffler, message_content, seal_report
from models.local.items import nearest_code
from models.local.seal import AnalyzerKey, seal
from models.streaming import ReleasedStats
from pipeline.config.keys import PublicKeys
from models.ground.items import ReleasedItems
from pipeline.config.settings import Settings, SettingsError
from pipeline.data.catalog import load_catalog
from pipeline.modes.local.local_http import catalog_codebook
from pipeline.modes.local.ingest import BatchIngestProcessor, local_config
from pipeline.modes.local.release import LocalReleaseStage
from pipeline.release.stages import SolveStage
from pipeline.serve.serving import Recommender

N = 150  # distinct users per batch (the blanket needs n p >~ log(1 / delta) fakes per codeword)
K = 8
WORLD = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": str(N), "PRIVREC_N_ARMS": "40",
         "PRIVREC_ALGORITHM": "linucb", "PRIVREC_EPSILON": "2", "PRIVREC_MODE": "local",
         "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_SHUFFLE_BATCH": str(N), "PRIVREC_USER_CAP": "2",
         "PRIVREC_LOCAL_CODEWORDS": str(K), "PRIVREC_NAMESPACE": "codes", "PRIVREC_NOISE_RIDGE": "0",
         "PRIVREC_MODEL": "flat"}  # the analyzer and release; the hierarchy's serving of them: test_hierarchy_stack.py


def test_sealed_codeword_messages_move_the_released_b_and_the_served_scores(redis_client: redis.Redis,
                                                                           redis_server: Any) -> None:
    settings = Settings.from_mapping({}, environ={**WORLD, "REDIS_URL": redis_server.url})
    catalog = load_catalog(settings)
    cfg = local_config(settings, catalog.d)
    book = catalog_codebook(catalog, K)
    key = AnalyzerKey.generate()
    arms = list(catalog.arm_ids)
    X = np.stack([clip_context(x) for x in catalog.features_of(arms)])
    codes = nearest_code(book, X)
    liked = int(np.bincount(codes, minlength=K).argmax())   # every device listened to an item of this codeword
    listened = arms[int(np.flatnonzero(codes == liked)[0])]
    shuffler = SealedShuffler(cfg)
    batches, sent = [], []
    for u in catalog.users[:N]:
        dev = LocalClient(u, cfg, MemoryStorage(), seed=int(u) + 1, clock=lambda: 0.0, codebook=book)
        rep = dev.report(rec_id=f"r{u}", x=catalog.features_of([listened])[0], reward=1.0)
        assert len(rep.messages) >= 1 and not rep.vector.any()   # m carries nothing: the listen is in the messages
        sent += rep.messages
        env = seal_report(rep, key.public_bytes()).with_shown((arms[0],))
        assert len(env.msgs) == len(rep.messages)                # each message sealed on its own
        batches += shuffler.add_envelope(env, unit=0)
    assert len(batches) == 1
    good = batches[0]
    body = good.to_json()
    for u in catalog.users[:N]:   # the boundary: the analyzer's input names no user and no request
        assert f'"r{u}"' not in body.decode()
    assert b'"user"' not in body and b'"version"' not in body and b'"rec_id"' not in body
    # the same reports again as batch 2, with a message under another key and one naming no codeword among them:
    # those two are dead letters, the rest counts
    other = AnalyzerKey.generate()
    bad = SealedBatch(good.unit, 2, good.items, good.sealed, good.epsilon, good.delta, good.bound,
                      [*good.msgs, seal(other.public_bytes(), message_content(1)),
                       seal(key.public_bytes(), message_content(K + 5))])
    proc = BatchIngestProcessor(redis_client, settings.namespace, catalog, cfg, key, codebook=book)
    done = proc.process(0, [(0, body), (1, bad.to_json())])
    reasons = sorted(d.reason for d in done.dead)
    assert len(reasons) == 2, reasons
    assert "sealed message: c: must be a codeword index" in reasons[0]
    assert "sealed message: sealed: authentication failed" in reasons[1]
    release = LocalReleaseStage(settings, catalog, redis_client)
    assert release.tick(force=True) is not None
    released = ReleasedStats.from_mapping(redis_client.hgetall(PublicKeys(settings.namespace).released))
    b = released.b_tilde.reshape(catalog.n_units, catalog.d)
    blanket = cfg.blanket
    real = np.asarray([m for m in sent if m < K])
    expected = 2 * blanket.estimate(blanket.histogram(real), N) @ book
    np.testing.assert_allclose(b[0], expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(b, np.broadcast_to(b[0], b.shape), rtol=0, atol=0)  # every unit: the population's
    # 2 N listens of one codeword, noise sd 2 sqrt(N p (1 - p)) ~ 9 per codeword: b points at the liked codeword
    assert float(book[liked] @ b[0]) > N * float(book[liked] @ book[liked])
    # served: a user of any unit is scored by the population's ridge solution (lambda I + G)^-1 b (noise ridge 0)
    assert SolveStage(settings, redis_client, release.statement).run() is not None
    rec = Recommender(redis_client, settings.namespace, catalog)
    G = np.asarray(released.gram)[0]
    theta = np.linalg.solve(settings.lambda_ * np.eye(catalog.d) + G, b[0])
    for user in (catalog.users[0], catalog.users[-1]):
        top = rec.recommend(user, candidates=arms, k=5)["items"]
        means = np.array([t["mean"] for t in top])
        np.testing.assert_allclose(means, catalog.features_of([t["item"] for t in top]) @ theta, rtol=1e-6)
        assert abs(means).max() > 1.0  # the served scores moved off the empty model's 0


def test_with_the_catalog_as_codebook_the_messages_are_also_the_served_item_term(redis_client: redis.Redis,
                                                                                redis_server: Any) -> None:
    """``local_item_term``: codeword c is catalog row c, so the analyzer's estimate of the messages' histogram is the
    released item sums (post-processing of the same histogram) and the served score carries the item term."""
    n_items = 40
    world = {**WORLD, "PRIVREC_N_ARMS": str(n_items), "PRIVREC_LOCAL_CODEWORDS": str(n_items),
             "PRIVREC_LOCAL_ITEM_TERM": "1", "PRIVREC_NAMESPACE": "codeitems", "REDIS_URL": redis_server.url}
    settings = Settings.from_mapping({}, environ=world)
    catalog = load_catalog(settings)
    cfg = local_config(settings, catalog.d)
    book = catalog_codebook(catalog, n_items, True)
    np.testing.assert_allclose(book, np.stack([clip_context(x) for x in catalog.feature_matrix]), rtol=0, atol=0)
    with pytest.raises(SettingsError, match="local_codewords"):
        catalog_codebook(catalog, n_items - 1, True)
    key = AnalyzerKey.generate()
    arms = list(catalog.arm_ids)
    liked = 7
    shuffler = SealedShuffler(cfg)
    batches, sent = [], []
    for u in catalog.users[:N]:
        dev = LocalClient(u, cfg, MemoryStorage(), seed=int(u) + 1, clock=lambda: 0.0, codebook=book)
        rep = dev.report(rec_id=f"r{u}", x=catalog.feature_matrix[liked], reward=1.0)
        sent += rep.messages
        batches += shuffler.add_envelope(seal_report(rep, key.public_bytes()).with_shown((arms[0],)), unit=0)
    assert len(batches) == 1
    proc = BatchIngestProcessor(redis_client, settings.namespace, catalog, cfg, key, codebook=book, item_term=True)
    assert not proc.process(0, [(0, batches[0].to_json())]).dead
    release = LocalReleaseStage(settings, catalog, redis_client)
    assert release.tick(force=True) is not None
    raw = redis_client.hgetall(PublicKeys(settings.namespace).released)
    items = ReleasedItems.from_mapping(raw)
    assert items is not None
    blanket = cfg.blanket
    est = blanket.estimate(blanket.histogram(np.asarray([m for m in sent if m < n_items])), N)
    np.testing.assert_allclose(items.sums, est, rtol=0, atol=1e-9)   # the same estimate that made b
    assert items.total == N and items.noise_std == pytest.approx(np.sqrt(blanket.variance(N)), rel=1e-12)
    # N listens of item 7 against noise sd sqrt(N p (1 - p)) ~ 4.3 per item: it stands out
    assert int(np.argmax(items.sums)) == liked and items.sums[liked] > N / 2
    assert SolveStage(settings, redis_client, release.statement).run() is not None
    rec = Recommender(redis_client, settings.namespace, catalog)
    version = int(rec.meta()["version"])
    term = rec.item_term(version)
    assert term is not None
    weight, pop = term
    assert weight == pytest.approx(1.0 / (1.0 + (items.noise_std / 2.0) ** 2), rel=1e-12)  # the global mode's rule
    assert int(np.argmax(pop)) == liked
