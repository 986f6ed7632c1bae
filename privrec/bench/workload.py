"""The ingest benchmark's workload: synthetic ``interactions`` events and raw Kafka produce/consume rates.

Examples
--------
>>> ev = synthetic_values(3, n_users=10, d=25, seed=0)
>>> len(ev), ev[0][0], 250 < len(ev[0][1]) < 400
(3, b'8', True)
>>> rate(10_000, 0.5)
20000.0
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import numpy as np

__all__ = ["TOPIC", "rate", "synthetic_values", "produce", "consume"]

TOPIC = "interactions"


def rate(events: int, seconds: float | None) -> float | None:
    """Events per second, ``None`` when the time is unknown or zero."""
    if seconds is None or seconds <= 0:
        return None
    return round(events / seconds, 1)


def synthetic_values(n: int, *, n_users: int, d: int, n_arms: int = 1000, seed: int = 0) -> list[tuple[bytes, bytes]]:
    """``n`` ``(key, value)`` pairs of valid ``interactions`` events with an explicit context."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, n_users, size=n)
    arms = rng.integers(0, n_arms, size=n)
    rewards = rng.integers(0, 2, size=n)
    ctx = rng.uniform(-1.0, 1.0, size=(n, d)) / np.sqrt(d)  # norm <= 1: no clipping needed
    ctx = np.round(ctx, 4).tolist()
    out = []
    ts0 = 1.7e12
    for i in range(n):
        u = str(int(users[i]))
        value = json.dumps({"event_id": f"b{seed}-{i}", "user": u, "arm": str(int(arms[i])), "context": ctx[i],
                            "reward": float(rewards[i]), "ts": ts0 + i, "rec_id": None})
        out.append((u.encode(), value.encode()))
    return out


async def produce(address: str, values: list[tuple[bytes, bytes]], started: threading.Event | None = None) -> float:
    """Produce all ``values`` (keyed); return the seconds from the first send to the last ack."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=address, linger_ms=5, max_batch_size=256 * 1024)
    await producer.start()
    try:
        t0 = time.perf_counter()
        if started is not None:
            started.set()
        futures = [await producer.send(TOPIC, key=k, value=v) for k, v in values]
        await asyncio.gather(*futures)
        return time.perf_counter() - t0
    finally:
        await producer.stop()


async def consume(address: str, n: int, settings: Any, work: str) -> float:
    """Seconds to ``getmany`` all ``n`` records of the topic from the beginning, doing ``work`` per value.

    ``work``: ``"none"``, ``"json"`` (``json.loads``) or ``"parse"`` (the pipeline's parser).
    Partitions and batch size are the worker's (``settings``).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    partitions, max_records = settings.partitions, settings.batch_size
    parse: Any = None
    if work == "parse":
        from pipeline.data.catalog import load_catalog
        from pipeline.data.records import parse_interaction

        catalog = load_catalog(settings)

        def parse(v: bytes) -> Any:
            return parse_interaction(v, catalog)  # type: ignore[arg-type]  # adapters satisfy Catalog
    elif work == "json":
        parse = json.loads
    consumer = AIOKafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, group_id=None,
                                max_poll_records=max_records, fetch_max_wait_ms=100)
    await consumer.start()
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = 0
        t0 = time.perf_counter()
        while seen < n:
            batches = await consumer.getmany(timeout_ms=50, max_records=max_records)
            for records in batches.values():
                seen += len(records)
                if parse is not None:
                    for r in records:
                        parse(r.value)
        return time.perf_counter() - t0
    finally:
        await consumer.stop()
