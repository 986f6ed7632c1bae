"""User-level ingest against a real redis-server: what the pending contributions hold does not depend on how the
events were batched, nor on batches prepared and never committed, nor on commits that lost a compare.

The worker keeps each partition's pending contributions in memory between batches and writes only the batch's users;
these tests compare the bytes it leaves in Redis with those of one batch per partition, so a cache that drifts from
Redis (a prepare that wrote into the committed state, a commit that kept another batch's users) shows as a
difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from pipeline.config.keys import partition_of
from pipeline.config.settings import Settings
from pipeline.data.catalog import load_catalog
from pipeline.ingestion.agents import make_processor
from pipeline.state.userlevel import UserLevelKeys
from producers.catalog.generate import write_catalog

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_catalog(tmp_path_factory.mktemp("pending") / "shop", n_items=60, n_users=10, d=6,
                         feature_share=1.0, users_file=False, edges=False, events=False)


def _settings(catalog: Path, namespace: str) -> Settings:
    return Settings.from_mapping({}, environ={"PRIVREC_CATALOG": str(catalog), "PRIVREC_D": "6",
                                              "PRIVREC_CATALOG_UNITS": "5", "PRIVREC_PARTITIONS": "2",
                                              "PRIVREC_NAMESPACE": namespace})


def _events(arms: list[str], partitions: int) -> dict[int, list[bytes]]:
    """Each partition's events: 40 users of 1 to 4 events (listens and feedback, repeated items)."""
    per: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for u in range(40):
        user = f"u{u:03d}"
        for j in range(1 + u % 4):
            ev: dict[str, Any] = {"event_id": f"{user}-{j}", "user": user, "arm": arms[(u * 3 + j % 2) % len(arms)],
                                  "reward": [0.0, 0.25, 1.0][(u + j) % 3], "ts": 1.7e12, "rec_id": None}
            if (u + j) % 5 == 0:
                ev["kind"] = "listen"
            per[partition_of(user, partitions)].append(json.dumps(ev).encode())
    return per


def _written(client: redis.Redis, processor: Any, namespace: str, partitions: int) -> dict[str, Any]:
    store = processor.store
    return {"pending": [client.hgetall(UserLevelKeys(namespace, p).pending) for p in range(partitions)],
            "offsets": store.offsets(partitions),
            "user_counts": [client.hgetall(store.keys.user_counts(p)) for p in range(partitions)],
            "dead": [client.hgetall(store.keys.deadletters(p)) for p in range(partitions)]}


def test_small_batches_a_batch_prepared_twice_and_a_lost_compare_write_the_bytes_of_one_batch(
        catalog_dir: Path, redis_client: redis.Redis) -> None:
    """Batches of 3 events, each prepared once without a commit and then again, and every third commit refused once
    (the fold generation moved, as a fold's take moves it) and redone: the pending hashes, offsets, per-user counts
    and dead-letter counts are the bytes that one batch per partition writes (the hierarchy's contributions hold
    counts and item rewards, summed in event order either way)."""
    one = _settings(catalog_dir, "one")
    catalog = load_catalog(one)
    per = _events(list(catalog.arm_ids), one.partitions)
    reference = make_processor(redis_client, one, catalog)
    assert reference.unit_stats is False  # the default model: the hierarchy
    for p, raws in per.items():
        assert not reference.process(p, list(enumerate(raws))).dead
    expected = _written(redis_client, reference, "one", one.partitions)
    assert all(expected["pending"]) and sum(expected["offsets"]) == sum(map(len, per.values()))

    small = _settings(catalog_dir, "small")
    processor = make_processor(redis_client, small, catalog)
    refused = 0
    for p, raws in per.items():
        msgs = list(enumerate(raws))
        for k, start in enumerate(range(0, len(msgs), 3)):
            batch = msgs[start:start + 3]
            processor.prepare(p, batch)  # never committed: must leave the partition's state as it was
            prepared = processor.prepare(p, batch)
            if k % 3 == 2:
                redis_client.incr(UserLevelKeys("small", p).foldgen)
                assert processor.commit(prepared) is False
                refused += 1
                prepared = processor.prepare(p, batch)
            assert processor.commit(prepared)
    assert refused >= 4
    assert _written(redis_client, processor, "small", small.partitions) == expected
