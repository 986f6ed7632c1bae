"""The analyzer is one fold: the offline twin and the live worker release bit-identical sums of the same sealed batches.

Devices (the real :class:`models.local.LocalClient`) seal their reports to the analyzer's key and the ESA shuffler
(:class:`models.local.esa.SealedShuffler`) batches them. The same sealed bytes go (a) to a live worker — a real
broker, the session's redis-server, ``python -m pipeline.apps.worker`` with the analyzer's key — which opens,
folds, commits and releases them, and (b) to the offline twin (:class:`models.local.LocalUCB`, what ``privrec
experiment modes`` runs), whose server side opens them with the same key and folds them. The released ``b`` (and
Gram and counts) must be equal bit for bit: the devices' seeds are the only noise, and both sides run
:class:`models.local.analyzer.Analyzer` and :func:`models.local.analyzer.merge`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from models.local import LocalClient, LocalUCB, MemoryStorage
from models.local.esa import SealedBatch, SealedShuffler, open_batch, seal_report
from models.local.seal import AnalyzerKey
from models.local.shuffle import POPULATION
from models.streaming import ReleasedStats
from pipeline import services
from pipeline.config.settings import Settings
from pipeline.data.catalog import load_catalog
from pipeline.modes.local.esa import KEY_ENV
from pipeline.modes.local.ingest import local_config
from pipeline.modes.local.local_http import catalog_codebook

from pipeline_support import open_stack, wait_for

N = 150  # distinct users per batch (the codewords' blanket needs n p >~ log(1 / delta) fakes per codeword)
BASE = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": str(N), "PRIVREC_N_ARMS": "40",
        "PRIVREC_ALGORITHM": "linucb", "PRIVREC_EPSILON": "2", "PRIVREC_MODE": "local", "PRIVREC_MODEL": "flat",
        "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_SHUFFLE_BATCH": str(N), "PRIVREC_USER_CAP": "2",
        "PRIVREC_PARTITIONS": "2", "PRIVREC_TICK_SECONDS": "0.3", "PRIVREC_LOGLEVEL": "WARNING",
        "PRIVREC_NOISE_RIDGE": "0"}
#: Codewords (the variant that learns): population-wide batches. (Sealed Laplace reports are batched per model unit,
#: and a synthetic user is a unit of their own: no such batch fills here; LastFM's clusters fill them.)
WORLD = {**BASE, "PRIVREC_LOCAL_CODEWORDS": "8"}


def _sealed_batches(settings: Settings, key: AnalyzerKey) -> list[tuple[int, bytes]]:
    """Two reports of every user (the cap), sealed and batched by the ESA shuffler: ``(unit label, bytes)``."""
    catalog = load_catalog(settings)
    cfg = local_config(settings, catalog.d)
    book = catalog_codebook(catalog, cfg.codewords) if cfg.codewords else None
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


def test_the_twin_and_the_live_worker_release_bit_identical_b(tmp_path: Path, redis_server: Any) -> None:
    key = AnalyzerKey.generate()
    pem = tmp_path / "analyzer-key.pem"
    pem.write_bytes(key.to_pem())
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
        services.create_topics(st.broker.address, {"ldp-reports": 2, "ldp-shuffled": 2})
        st.start_worker()
        producer = st.producer()
        for unit, raw in batches:
            producer.send("ldp-shuffled", key=str(unit).encode(), value=raw)
        producer.flush()
        wait_for(lambda: st.released_count() == expected, 60, f"a release of all {expected} reports")
        live = ReleasedStats.from_mapping(st.released())

    assert int(offline.count.sum()) == expected
    assert np.array_equal(live.b_tilde, offline.b_tilde), np.abs(live.b_tilde - offline.b_tilde).max()
    assert np.array_equal(np.asarray(live.gram), np.asarray(offline.gram))
    assert np.array_equal(live.count, offline.count) and live.noise_std == offline.noise_std
    assert np.abs(offline.b_tilde).max() > 1.0  # the batches moved b (not a comparison of two empty releases)

