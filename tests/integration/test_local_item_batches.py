"""Item reports in the analyzer (a real redis-server; the pipeline's own stages, no Kafka): a shuffled batch's item
messages become released item sums and the served item term, counted once; a batch with bad messages is a dead letter."""

from __future__ import annotations

from typing import Any

import numpy as np
import redis

from models.ground.items import ReleasedItems
from models.local.items import ItemBlanket
from models.local.shuffle import ShuffledBatch
from pipeline.data.catalog import load_catalog
from pipeline.config.keys import PublicKeys
from pipeline.modes.local.ingest import BatchIngestProcessor, local_config
from pipeline.modes.local.release import LocalReleaseStage
from pipeline.config.settings import Settings
from pipeline.release.stages import SolveStage

WORLD = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "40",
         "PRIVREC_ALGORITHM": "linucb", "PRIVREC_EPSILON": "2", "PRIVREC_MODE": "local",
         "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_SHUFFLE_BATCH": "300", "PRIVREC_NAMESPACE": "items",
         "PRIVREC_ITEM_WEIGHT": "1"}


def _batch(seq: int, n: int, messages: list[int], d: int, arm: str) -> bytes:
    return ShuffledBatch(0, seq, [arm] * n, [[0.0] * d] * n, 2.0, 1e-5, "test", messages).to_json()


def test_item_messages_become_the_served_item_term(redis_client: redis.Redis, redis_server: Any) -> None:
    settings = Settings.from_mapping({}, environ={**WORLD, "REDIS_URL": redis_server.url})
    catalog = load_catalog(settings)
    cfg = local_config(settings, catalog.d)
    blanket = ItemBlanket(n_items=40, batch=300, epsilon=2.0, delta=1e-5, cap=1)
    rng = np.random.default_rng(3)
    # 300 devices: 120 listened to item 7, the others to nothing; each sends its messages (real + blanket)
    msgs = [int(m) for u in range(300) for m in blanket.randomize(7 if u < 120 else None, reward=1.0, rng=rng)]
    rng.shuffle(msgs)
    arm = catalog.arm_ids[0] if hasattr(catalog, "arm_ids") else "0"
    proc = BatchIngestProcessor(redis_client, settings.namespace, catalog, cfg, items=blanket)
    raw = [_batch(1, 300, msgs, catalog.d, arm), _batch(1, 300, msgs, catalog.d, arm),   # the same batch twice
           _batch(2, 300, [40], catalog.d, arm)]                                          # a row beyond the catalog
    done = proc.process(0, list(enumerate(raw)))
    reasons = [d.reason for d in done.dead]
    assert len(reasons) == 2 and "repeated batch 1" in reasons[0] and "catalog rows below 40" in reasons[1]
    release = LocalReleaseStage(settings, catalog, redis_client)
    assert release.tick(force=True) is not None
    raw_rel = redis_client.hgetall(PublicKeys(settings.namespace).released)
    items = ReleasedItems.from_mapping(raw_rel)
    assert items is not None and items.total == 300  # the repeated batch counted once, the bad one not at all
    expected = blanket.estimate(blanket.histogram(np.asarray(msgs)), 300)
    np.testing.assert_allclose(items.sums, expected, rtol=0, atol=1e-9)
    assert items.noise_std == np.sqrt(blanket.variance(300))
    # 120 listens stand 120 / sd ~ 30 noise stds out: item 7 is the most popular released item
    assert int(np.argmax(items.sums)) == 7
    assert SolveStage(settings, redis_client, release.statement).run() is not None
    served = redis_client.hgetall(PublicKeys(settings.namespace).model_items)
    pop = np.frombuffer(served[b"pop"], dtype="<f8")
    assert int(np.argmax(pop)) == 7 and pop[7] > 0
    assert float(served[b"weight"]) > 0  # served: the score adds weight * pop, as in the global mode
