"""The analyzer is one fold: the offline twins and the live worker release bit-identical sums of the same sealed batches.

Devices (the real :class:`models.local.LocalClient`) seal their reports to the analyzer's key and the ESA shuffler
(:class:`models.local.esa.SealedShuffler`) batches them. The same sealed bytes go (a) to a live worker — a real
broker, the session's redis-server, ``python -m pipeline.apps.worker`` with the analyzer's key — which opens,
folds, commits and releases them, and (b) to the offline twin (:class:`models.local.LocalUCB`, what ``privrec
experiment modes`` runs), whose server side opens them with the same key and folds them. The released ``b`` (and
Gram and counts) must be equal bit for bit: the devices' seeds are the only noise, and both sides run
:class:`models.local.analyzer.Analyzer` and :func:`models.local.analyzer.merge`. The same holds for the default
variant (``shuffled-items``: the catalog as the codebook, the item term) and its population-wide twin
(:class:`models.local.policy.LocalItemUCB`, what ``privrec experiment frontier`` runs): the pool and item blocks the
hierarchy is solved from are equal bit for bit.

Against a real redis-server, the worker's analyzer (:class:`pipeline.modes.local.ingest.BatchIngestProcessor`, a real
analyzer key) given a sealed batch with one tampered content commits nothing of that batch: no vector, and none of
its shown items in the partition's Gram; every content is a dead letter naming why; the next whole batch counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import redis

from models.ground.items import ReleasedItems
from models.local import LocalClient, LocalConfig, LocalReport, LocalUCB, MemoryStorage
from models.local.policy import LocalItemUCB
from models.local.esa import SealedBatch, SealedShuffler, open_batch, seal_report
from models.local.seal import AnalyzerKey
from models.local.shuffle import POPULATION
from models.streaming import ReleasedStats
from pipeline import services
from pipeline.config.settings import Settings
from pipeline.data.catalog import SyntheticCatalog, load_catalog
from pipeline.modes.local.esa import KEY_ENV
from pipeline.modes.local.ingest import BatchIngestProcessor, local_config
from pipeline.modes.local.local_http import catalog_codebook
from pipeline.release.stages import local_as_hierarchy

from stacks import open_stack, wait_for

N = 150  # distinct users per batch (the codewords' blanket needs n p >~ log(1 / delta) fakes per codeword)
BASE = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": str(N), "PRIVREC_N_ARMS": "40",
        "PRIVREC_ALGORITHM": "linucb", "PRIVREC_EPSILON": "2", "PRIVREC_MODE": "local", "PRIVREC_MODEL": "flat",
        "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_SHUFFLE_BATCH": str(N), "PRIVREC_USER_CAP": "2",
        "PRIVREC_PARTITIONS": "2", "PRIVREC_TICK_SECONDS": "0.3", "PRIVREC_LOGLEVEL": "WARNING",
        "PRIVREC_NOISE_RIDGE": "0"}
#: Codewords (the variant that learns): population-wide batches. (Sealed Laplace reports are batched per model unit,
#: and a synthetic user is a unit of their own: no such batch fills here; LastFM's clusters fill them.)
WORLD = {**BASE, "PRIVREC_LOCAL_CODEWORDS": "8"}
#: The default variant, shuffled-items: the catalog (40 items) as the codebook, the messages also the item term.
ITEMS_WORLD = {**BASE, "PRIVREC_LOCAL_CODEWORDS": "40", "PRIVREC_LOCAL_ITEM_TERM": "1"}


def _sealed_batches(settings: Settings, key: AnalyzerKey) -> list[tuple[int, bytes]]:
    """Two reports of every user (the cap), sealed and batched by the ESA shuffler: ``(unit label, bytes)``."""
    catalog = load_catalog(settings)
    cfg = local_config(settings, catalog.d)
    book = catalog_codebook(catalog, cfg.codewords, settings.local_item_term) if cfg.codewords else None
    arms = list(catalog.arm_ids)
    shuffler = SealedShuffler(cfg)
    out = []
    devices = {u: LocalClient(u, cfg, MemoryStorage(), seed=int(u) + 11, clock=lambda: 0.0, codebook=book)
               for u in catalog.users[:N]}
    for round_ in range(2):
        for i, (u, dev) in enumerate(devices.items()):
            listened = arms[(i * 7 + round_) % len(arms)]
            rep = dev.report(rec_id=f"r{u}-{round_}", x=catalog.features_of([listened])[0], reward=1.0)
            dev.acknowledge(rep.version)
            env = seal_report(rep, key.public_bytes()).with_shown((arms[i % len(arms)], arms[(i + 3) % len(arms)]))
            unit = POPULATION if cfg.codewords else catalog.unit_of(u)
            out += [(b.unit, b.to_json()) for b in shuffler.add_envelope(env, unit=unit)]
    return out


def _analyzer_key(tmp_path: Path) -> tuple[AnalyzerKey, Path]:
    """A fresh analyzer key and the PEM file the worker reads it from (``KEY_ENV``)."""
    key = AnalyzerKey.generate()
    pem = tmp_path / "analyzer-key.pem"
    pem.write_bytes(key.to_pem())
    return key, pem


def _release_live(st: Any, batches: list[tuple[int, bytes]], expected: int) -> dict[bytes, bytes]:
    """Send the sealed batches to a live worker of ``st`` on ``ldp-shuffled`` (keyed by their unit, as the shuffler
    service sends them); the released hash once it counts all ``expected`` reports."""
    services.create_topics(st.broker.address, {"ldp-reports": 2, "ldp-shuffled": 2})
    st.start_worker()
    producer = st.producer()
    for unit, raw in batches:
        producer.send("ldp-shuffled", key=str(unit).encode(), value=raw)
    producer.flush()
    wait_for(lambda: st.released_count() == expected, 60, f"a release of all {expected} reports")
    released: dict[bytes, bytes] = st.released()
    return released


def test_the_twin_and_the_live_worker_release_bit_identical_b(tmp_path: Path, redis_server: Any) -> None:
    key, pem = _analyzer_key(tmp_path)
    with open_stack(tmp_path, redis_server.url, "bitwise", partitions=2, world={**WORLD, KEY_ENV: str(pem)}) as st:
        settings = st.settings()
        catalog = load_catalog(settings)
        cfg = local_config(settings, catalog.d)
        batches = _sealed_batches(settings, key)
        assert len(batches) >= 2
        expected = sum(SealedBatch.parse(raw).n for _, raw in batches)

        # (b) the offline twin: its server opens each sealed batch with the key and folds it
        book = catalog_codebook(catalog, cfg.codewords) if cfg.codewords else None
        twin = LocalUCB(d=catalog.d, n_units=catalog.n_units, config=cfg, tick=1 << 30, seed=0, codebook=book)
        for _, raw in batches:
            opened = open_batch(raw, key, cfg)
            assert opened.batch is not None and opened.failed == []
            twin.fold_batch(opened.batch, catalog.features_of(list(opened.batch.items)))
        assert twin.dead_letters == []
        offline = twin.released()

        # (a) the live worker: the same bytes on ldp-shuffled, keyed by their unit as the shuffler service sends them
        live = ReleasedStats.from_mapping(_release_live(st, batches, expected))

    assert int(offline.count.sum()) == expected
    assert np.array_equal(live.b_tilde, offline.b_tilde), np.abs(live.b_tilde - offline.b_tilde).max()
    assert np.array_equal(np.asarray(live.gram), np.asarray(offline.gram))
    assert np.array_equal(live.count, offline.count) and live.noise_std == offline.noise_std
    assert np.abs(offline.b_tilde).max() > 1.0  # the batches moved b (not a comparison of two empty releases)


def test_the_default_variants_twin_and_the_live_worker_release_bit_identical_blocks(tmp_path: Path,
                                                                                    redis_server: Any) -> None:
    key, pem = _analyzer_key(tmp_path)
    world = {**ITEMS_WORLD, KEY_ENV: str(pem)}
    with open_stack(tmp_path, redis_server.url, "bitwise-items", partitions=2, world=world) as st:
        settings = st.settings()
        catalog = load_catalog(settings)
        cfg = local_config(settings, catalog.d)
        batches = _sealed_batches(settings, key)
        assert len(batches) >= 2
        expected = sum(SealedBatch.parse(raw).n for _, raw in batches)

        # (b) the population-wide twin of the default, with the live worker's calibration and codebook
        book = catalog_codebook(catalog, cfg.codewords, True)
        twin = LocalItemUCB(d=catalog.d, n_items=len(book), epsilon=cfg.epsilon, delta=cfg.delta, batch=N,
                            cap=cfg.cap, seed=0, share=0.0, codewords=book, codes_are_items=True, hierarchy=True,
                            features=catalog.feature_matrix)
        assert twin.config is not None and twin.config.blanket == cfg.blanket
        for _, raw in batches:
            opened = open_batch(raw, key, cfg)
            assert opened.batch is not None and opened.failed == []
            twin.fold_batch(opened.batch)

        # (a) the live worker, the same bytes
        raw_released = _release_live(st, batches, expected)
        items = ReleasedItems.from_mapping(raw_released)
        live = local_as_hierarchy(ReleasedStats.from_mapping(raw_released), items)

    offline = twin.released_hierarchy()
    assert twin.item_reports == expected and items is not None and items.total == expected
    assert np.array_equal(live.pool, offline.pool), np.abs(live.pool - offline.pool).max()
    assert live.items is not None and offline.items is not None
    assert np.array_equal(live.items, offline.items), np.abs(live.items - offline.items).max()
    assert (live.std_pool, live.std_items) == (offline.std_pool, offline.std_items)
    assert np.abs(offline.items).max() > 10.0  # the messages moved the item sums (not two empty releases)


def test_a_batch_with_a_tampered_content_adds_nothing_to_the_committed_sums(redis_client: redis.Redis) -> None:
    catalog = SyntheticCatalog(n_users=1, d=4, n_arms=12)
    cfg = LocalConfig(algorithm="round", d=4, epsilon=2.0, shuffle_batch=3)
    key = AnalyzerKey.generate()
    proc = BatchIngestProcessor(redis_client, "fix", catalog, cfg, key)
    arms = [str(a) for a in range(12)]  # the synthetic catalog's arm ids
    rng = np.random.default_rng(5)

    def batch(seq: int, tamper: bool) -> tuple[bytes, list[tuple[str, ...]], list[np.ndarray]]:
        sh = SealedShuffler(cfg)
        sh.seq = {0: seq - 1}
        lists = [tuple(arms[3 * i + j] for j in range(3)) for i in range(3)]
        vecs = [rng.normal(size=4) for _ in range(3)]
        envs = [seal_report(LocalReport(str(i), seq, "round", f"r{seq}-{i}", v), key.public_bytes()).with_shown(s)
                for i, (s, v) in enumerate(zip(lists, vecs))]
        (b,) = [out for e in envs for out in sh.add_envelope(e, unit=0)]
        blobs = list(b.sealed)
        if tamper:  # one content's GCM tag changed in transit
            i = blobs.index(envs[1].sealed)
            blobs[i] = blobs[i][:-1] + bytes([blobs[i][-1] ^ 1])
        return SealedBatch(0, seq, b.items, blobs, b.epsilon, b.delta).to_json(), lists, vecs

    bad, _, _ = batch(1, tamper=True)
    done = proc.process(0, [(0, bad)])
    assert len(done.dead) == 3
    reasons = sorted(d.reason for d in done.dead)
    assert sum("authentication failed" in r for r in reasons) == 1
    assert sum("not counted: 1 of the 3 contents" in r for r in reasons) == 2
    shard, _ = proc.shard(0)
    assert int(shard.count[0]) == 0
    np.testing.assert_array_equal(shard.gram[0], np.zeros((4, 4)))  # no list of the batch, failed or not
    np.testing.assert_array_equal(shard.b[0], np.zeros(4))

    good, lists, vecs = batch(2, tamper=False)
    done = proc.process(0, [(1, good)])
    assert done.dead == []
    proc.forget(0)  # read back what was committed
    shard, _ = proc.shard(0)
    X = proc.analyzer.contexts([a for s in lists for a in s])
    np.testing.assert_allclose(shard.gram[0], X.T @ X, rtol=0, atol=1e-12)
    np.testing.assert_allclose(shard.b[0], np.sum(vecs, axis=0), rtol=0, atol=1e-12)
    assert int(shard.count[0]) == 3
