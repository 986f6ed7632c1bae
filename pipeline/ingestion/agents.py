"""Ingest: a batch consumer of ``interactions`` running as a task of the faust worker.

Each poll returns up to ``batch_size`` records per partition; each
partition's records go through :class:`pipeline.ingestion.ingest.IngestProcessor`:
parse, send the dead letters (awaited, so none is lost), then one atomic
Redis commit of statistics + offset. On assignment, partitions are sought to
the offset stored in Redis — the source of truth — so whatever Kafka
redelivers after a crash is skipped, and nothing before it is re-read.
Kafka offsets are committed too, after Redis, for lag monitoring and the web's
outbox forwarder only: after every poll that is not full, and at most every
:data:`KAFKA_COMMIT_SECONDS` while full polls follow each other (a backlog).

:func:`register` adds the task to an app built by :mod:`pipeline.apps.worker_app`; this
module never imports the app (the app imports it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

import faust
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import OffsetAndMetadata

from ..config.kafkaconn import client_kwargs
from ..config.redisconn import connect
from .. import services
from ..data.catalog import Catalog
from .ingest import IngestProcessor, OffsetGap, UserIngestProcessor, _reason_class
from .shown_lists import ShownListCheck
from ..config.metrics import WorkerMetrics
from ..data.records import TOPICS, dead_letter_value
from ..config.settings import Settings
from ..state.foldround import OwnedPartitions
from ..state.trusted import TrustedStore

log = logging.getLogger("privrec.ingest")

__all__ = ["register", "ingest", "make_processor"]


class _SeekToStoredOffsets(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, consumer: AIOKafkaConsumer, processor: IngestProcessor, partitions: int,
                 owned: OwnedPartitions | None = None) -> None:
        self.consumer = consumer
        self.processor = processor
        self.partitions = partitions
        self.owned = owned  # the partitions this worker folds in a fold round (pipeline.state.foldround)

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            self.processor.forget(tp.partition)
        if self.owned is not None:
            self.owned.revoked(tp.partition for tp in revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        stored = self.processor.store.offsets(self.partitions)
        for tp in assigned:
            self.processor.forget(tp.partition)
            off = stored[tp.partition] if tp.partition < len(stored) else None
            if off is None:
                await self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, off)
        if self.owned is not None:
            self.owned.assigned(tp.partition for tp in assigned)
        log.info("assigned partitions %s (stored offsets %s)", sorted(tp.partition for tp in assigned), stored)


#: While polls come back full (a backlog), the Kafka offsets Redis stored are committed at most this often (a commit
#: is a round trip per poll otherwise); a poll that is not full commits them at once.
KAFKA_COMMIT_SECONDS = 0.5

#: What a Redis restart looks like to a client: retried with backoff, never fatal.
REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.BusyLoadingError,
              redis.exceptions.ReadOnlyError)


class Backoff:
    """Exponential backoff, 0.1 s doubling to 5 s, reset after a success."""

    def __init__(self, first: float = 0.1, most: float = 5.0) -> None:
        self.first, self.most, self.delay = first, most, first

    def reset(self) -> None:
        self.delay = self.first

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.most, self.delay * 2)


async def _reseek(consumer: AIOKafkaConsumer, processor: IngestProcessor, partitions: int,
                  tps: list[TopicPartition]) -> None:
    """Forget the cached state of ``tps`` and seek them to the offsets stored in Redis (the source of truth)."""
    stored = processor.store.offsets(partitions)
    for tp in tps:
        processor.forget(tp.partition)
        off = stored[tp.partition] if tp.partition < len(stored) else None
        if off is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, off)


async def _identity(ident: AIOKafkaConsumer, kafka: str) -> str:
    """The broker's identity record (written by the stack's topic creation; written here if missing)."""
    return await services.read_identity_async(ident, kafka)


async def _observe_lag(consumer: AIOKafkaConsumer, assigned: set[TopicPartition], metrics: WorkerMetrics) -> None:
    """Messages between the worker's positions and the ends of its partitions (a metric: never fatal)."""
    try:
        ends = await consumer.end_offsets(list(assigned))
        lag = 0
        for tp in assigned:
            lag += max(0, ends[tp] - await consumer.position(tp))
        metrics.lag.set(lag)
    except Exception:  # noqa: BLE001 - a metric must not stop ingest
        log.debug("ingest lag not observed", exc_info=True)


def register(app: faust.App, settings: Settings, catalog: Catalog, *, topic: str | None = None,
             metrics: WorkerMetrics | None = None, metrics_url: str | None = None,
             processor: IngestProcessor | None = None, owned: OwnedPartitions | None = None) -> None:
    """Run :func:`ingest` as a task of ``app`` (every worker, leader or not); ``topic`` defaults to ``interactions``.

    ``processor``: what a batch of the topic becomes (default: events into exact statistics; local mode
    passes its report processor, :mod:`pipeline.modes.local.localmode`). ``owned``: kept up to date with the
    partitions the consumer is assigned (the fold round's owners, :mod:`pipeline.state.foldround`)."""

    @app.task
    async def ingest_task() -> None:
        await ingest(settings, catalog, topic=topic or TOPICS["interactions"], metrics=metrics,
                     metrics_url=metrics_url, processor=processor, owned=owned)


def make_processor(client: redis.Redis, settings: Settings, catalog: Catalog) -> IngestProcessor:
    """The ``interactions`` processor a worker runs: user or event level, with the clips, the partition check and the
    shown-list check (:mod:`pipeline.ingestion.shown_lists`) of the settings (the privacy audit, ``tests/privacy``,
    builds it here too)."""
    make = UserIngestProcessor if settings.user_level else IngestProcessor
    b_clip, item_clip = settings.clips
    return make(client, settings.namespace, catalog, item_sums=settings.item_term or settings.hierarchy,
                listen_weight=settings.listen_weight_in_force, b_clip=b_clip, item_clip=item_clip,
                partitions=settings.partitions, shown=ShownListCheck.for_settings(client, settings),
                **({"unit_stats": not settings.hierarchy} if settings.user_level else {}))


async def ingest(settings: Settings, catalog: Catalog, *, topic: str, metrics: WorkerMetrics | None = None,
                 metrics_url: str | None = None, processor: IngestProcessor | None = None,
                 owned: OwnedPartitions | None = None) -> None:
    """Consume ``topic`` (``interactions``, or a federated site's own topic) in batches until the worker stops."""
    client = connect(settings.redis_url or "redis://127.0.0.1:6379/0")
    if processor is None:
        processor = make_processor(client, settings, catalog)
    TrustedStore(client, settings.namespace).ensure_config(
        settings.model_config() | {"catalog_fingerprint": catalog.fingerprint})
    consumer = AIOKafkaConsumer(
        **client_kwargs(settings), group_id=f"privrec-{settings.namespace}-ingest",
        enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000,
        heartbeat_interval_ms=1000, max_poll_records=settings.batch_size, fetch_max_wait_ms=100)
    producer = AIOKafkaProducer(**client_kwargs(settings), linger_ms=5)
    await producer.start()
    # the broker's identity: a memory-only broker that restarts comes back with empty logs and a new identity,
    # and offsets stored against the old logs must not skip (or re-count) the new ones
    ident = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False)
    await ident.start()
    consumer.subscribe([topic], listener=_SeekToStoredOffsets(consumer, processor, settings.partitions, owned))
    await consumer.start()
    loop = _IngestLoop(settings, client, processor, consumer, producer, ident, metrics, metrics_url)
    try:
        await loop.run()
    finally:
        await consumer.stop()
        await producer.stop()
        await ident.stop()


class _IngestLoop:
    """One worker's ingest: poll, check the broker's identity, count each partition's batch into Redis, then commit
    exactly the offsets Redis stored to Kafka; re-read from Redis's offsets whenever either side may have moved."""

    def __init__(self, settings: Settings, client: redis.Redis, processor: IngestProcessor,
                 consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, ident: AIOKafkaConsumer,
                 metrics: WorkerMetrics | None, metrics_url: str | None) -> None:
        self.settings, self.client, self.processor = settings, client, processor
        self.consumer, self.producer, self.ident = consumer, producer, ident
        self.metrics, self.metrics_url = metrics, metrics_url
        self.worker_id = os.environ.get("PRIVREC_WORKER_ID", f"worker-{os.getpid()}")
        self.status_key = f"{settings.namespace}:ops:{{{settings.namespace}:ops}}:workers"
        self.known: str | None = None
        self.last_identity = 0.0
        self.counted = 0
        self.last_status = 0.0
        self.to_commit: dict[TopicPartition, OffsetAndMetadata] = {}  # stored in Redis, not yet committed to Kafka
        self.last_kafka_commit = 0.0
        self.backoff = Backoff()
        self.reread = False  # whether the assigned partitions must be re-read from the offsets Redis holds

    async def run(self) -> None:
        s = self.settings
        while True:
            if self.reread:
                try:
                    await _reseek(self.consumer, self.processor, s.partitions, list(self.consumer.assignment()))
                    self.reread = False
                    # offsets not yet committed to Kafka may be another broker's, or more than Redis kept: never
                    # committed (the next counted batches commit what Redis holds now)
                    self.to_commit = {}
                except REDIS_DOWN as exc:
                    log.warning("Redis unavailable (%s); retrying in %.1f s", exc, self.backoff.delay)
                    await self.backoff.wait()
                    continue
            batches = await self.consumer.getmany(timeout_ms=int(s.batch_seconds * 1000), max_records=s.batch_size)
            # records in hand: from which broker's logs? (one small fetch per non-empty poll, and every 2 s: a new
            # broker's shorter logs may return nothing at the old positions)
            if (batches or time.monotonic() - self.last_identity > 2.0) and await self._broker_moved():
                continue
            try:
                await self._count(batches)
                await self._report_status()
                self.backoff.reset()
            except OffsetGap as gap:  # Redis holds an older offset than this poll continues from: re-read from it
                log.warning("%s; re-reading from the stored offset", gap)
                self.reread = True
            except (CommitFailedError, IllegalStateError) as exc:
                # the group rebalanced under the Kafka commit (lag monitoring and the outbox only: Redis holds the
                # offsets that count); never fatal, re-read what is assigned now from Redis
                log.warning("Kafka offset commit refused (%s: %s): a rebalance; re-reading from the stored offsets",
                            type(exc).__name__, exc)
                self.reread = True
            except REDIS_DOWN as exc:
                # Redis restarting: what of this poll was not committed is re-read from the offsets Redis holds
                # once it answers (its AOF may have kept less than we wrote)
                log.warning("Redis unavailable (%s: %s); retrying in %.1f s", type(exc).__name__, exc,
                            self.backoff.delay)
                self.reread = True
                await self.backoff.wait()

    async def _broker_moved(self) -> bool:
        """Read the broker's identity; ``True`` (poll again, re-reading) if it is unreadable or a new one."""
        self.last_identity = time.monotonic()
        try:
            current = await _identity(self.ident, self.settings.kafka or "")
        except Exception as exc:  # noqa: BLE001 - the broker going away: poll again
            log.warning("broker identity unreadable (%s); re-reading", exc)
            self.reread = True
            await asyncio.sleep(0.5)
            return True
        if current == self.known:
            return False
        try:
            if self.processor.store.adopt_broker(current, self.settings.partitions):
                log.warning("a new broker (identity %s): its logs start again, the stored offsets "
                            "were reset; statistics, noise and releases are kept", current)
        except REDIS_DOWN as exc:
            log.warning("Redis unavailable (%s); retrying in %.1f s", exc, self.backoff.delay)
            self.reread = True
            await self.backoff.wait()
            return True
        self.known = current
        self.reread = True  # this poll may have been read against the old offsets: read again
        return True

    async def _count(self, batches: dict[TopicPartition, list]) -> None:  # type: ignore[type-arg]
        """Count each partition's records into Redis, then commit to Kafka the offsets the Redis commits stored:
        exactly these, never the consumer's positions (a batch not committed to Redis must not look counted to the
        web's outbox forwarder, which drops an event once the group's committed offset passes it); during a backlog
        at most every :data:`KAFKA_COMMIT_SECONDS` (a later commit only makes the forwarder keep an event longer)."""
        processor, metrics = self.processor, self.metrics
        stored_to = self.to_commit
        for tp, records in batches.items():
            msgs = [(r.offset, r.value if r.value is not None else b"") for r in records]
            batch = processor.prepare(tp.partition, msgs)
            for item in batch.dead:
                await self.producer.send_and_wait(TOPICS["dead_letters"], key=None, value=dead_letter_value(
                    item.raw, item.reason, tp.topic, tp.partition, item.offset))
                if metrics is not None:
                    metrics.dead.labels(_reason_class(item.reason)).inc()
            if not processor.commit(batch):
                # another writer moved the offset (or Redis came back with an older state): reload, redo
                batch = processor.prepare(tp.partition, msgs)
                if not processor.commit(batch):
                    log.warning("partition %d: stored offset moved twice; re-reading from it", tp.partition)
                    self.reread = True
                    break
            self.counted += batch.counted
            stored_to[tp] = OffsetAndMetadata(batch.next_offset, "")
            if metrics is not None:
                metrics.ingested.inc(batch.counted)
        now = time.monotonic()
        full = sum(map(len, batches.values())) >= self.settings.batch_size
        if stored_to and (not full or now - self.last_kafka_commit >= KAFKA_COMMIT_SECONDS):
            assigned = self.consumer.assignment()  # a partition revoked meanwhile is its new owner's to commit
            self.to_commit = {}
            self.last_kafka_commit = now
            mine = {tp: o for tp, o in stored_to.items() if tp in assigned}
            if mine:
                await self.consumer.commit(mine)

    async def _report_status(self) -> None:
        """At most once a second: the worker's status hash (and the lag metrics)."""
        now = time.monotonic()
        if now - self.last_status <= 1.0:
            return
        self.last_status = now
        assigned = self.consumer.assignment()
        if self.metrics is not None and assigned:
            await _observe_lag(self.consumer, assigned, self.metrics)
        self.client.hset(self.status_key, self.worker_id, json.dumps({
            "pid": os.getpid(), "counted": self.counted, "at_ms": int(time.time() * 1000),
            "partitions": sorted(tp.partition for tp in assigned), "metrics": self.metrics_url}))
