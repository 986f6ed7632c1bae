"""The ingest loop's Kafka commits against a real broker and redis-server: during a backlog it commits at most every
``KAFKA_COMMIT_SECONDS``, yet never an offset Redis has not stored, and once the backlog is read the group's committed
offsets are exactly those Redis stored (the web's outbox forwarder drops an event once the committed offset passes
it: a committed offset ahead of Redis would lose events, one behind only keeps them longer).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import redis
from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline import services
from pipeline.config.settings import Settings
from pipeline.data.catalog import load_catalog
from pipeline.ingestion.agents import ingest
from pipeline.services import ServiceHandle
from pipeline.state.trusted import TrustedStore
from producers.catalog.generate import write_catalog

pytestmark = pytest.mark.integration

TOPIC = "ingest-commits"


def test_a_backlogs_kafka_commits_never_pass_redis_and_end_equal_to_it(
        tmp_path: Path, broker: ServiceHandle, redis_server: ServiceHandle, redis_client: redis.Redis) -> None:
    from kafka import KafkaProducer  # type: ignore[import-untyped]

    catalog_dir = write_catalog(tmp_path / "shop", n_items=30, n_users=10, d=4, feature_share=1.0, users_file=False,
                                edges=False, events=False)
    settings = Settings.from_mapping({}, environ={
        "PRIVREC_CATALOG": str(catalog_dir), "PRIVREC_D": "4", "PRIVREC_CATALOG_UNITS": "3",
        "PRIVREC_PARTITIONS": "2", "PRIVREC_BATCH_SIZE": "40", "PRIVREC_NAMESPACE": "commits"}).replace(
        kafka=broker.address, redis_url=redis_server.url)
    catalog = load_catalog(settings)
    services.create_topics(broker.address, {TOPIC: settings.partitions})
    arms = list(catalog.arm_ids)
    producer = KafkaProducer(bootstrap_servers=broker.address, linger_ms=5)
    n = 1500
    for i in range(n):
        user = f"c{i % 200}"
        ev = {"event_id": f"e{i}", "user": user, "arm": arms[i % len(arms)], "reward": 1.0, "ts": 1.7e12,
              "rec_id": None}
        producer.send(TOPIC, key=user.encode(), value=json.dumps(ev).encode())
    producer.flush()
    producer.close()
    store = TrustedStore(redis_client, settings.namespace)
    tps = [TopicPartition(TOPIC, p) for p in range(settings.partitions)]

    async def observe() -> tuple[int, list[int | None], list[int | None]]:
        group = AIOKafkaConsumer(bootstrap_servers=broker.address, group_id=f"privrec-{settings.namespace}-ingest",
                                 enable_auto_commit=False)
        await group.start()
        task = asyncio.create_task(ingest(settings, catalog, topic=TOPIC))
        samples = 0
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                committed = [await group.committed(tp) for tp in tps]  # first: Redis's offsets only grow
                stored = store.offsets(settings.partitions)
                for c, s in zip(committed, stored):
                    assert c is None or (s is not None and c <= s), (committed, stored)
                samples += 1
                if sum(s or 0 for s in stored) == n and committed == stored:
                    break
                await asyncio.sleep(0.01)
            return samples, committed, stored
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await group.stop()

    samples, committed, stored = asyncio.run(observe())
    assert sum(s or 0 for s in stored) == n
    assert committed == stored and samples > 5
