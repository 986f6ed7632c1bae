"""The shown lists of ``GET /recommend``: kept in Redis for feedback and logged to Kafka, written behind the answer.

``/recommend`` answers at once; its list waits in this process's memory (:class:`ShownLists`) and is written
with the others of the same few milliseconds: one Redis command (a Lua script: ``SET rec_id list EX 24 h``
for each; a pipeline on a Redis Cluster, whose keys lie in different slots). A batch is written
``flush_seconds`` (10 ms) after its first list, or at once when it holds ``max_batch``. Once stored, the lists
join the Kafka log's queue, which is produced every ``log_seconds`` (100 ms): one record batch per partition
(the partition of the user's key, as ``AIOKafkaProducer.send`` picks it, remembered per user), so the log
costs one produce request per 100 ms instead of a ``send`` per list and a produce request per linger window
(``docs/serving-performance.md``).

What a feedback sees: :meth:`ShownLists.get` looks in the pending lists first, so a ``POST /feedback`` (or a
local-mode ``/report``) on a list whose write is still pending is accepted like any other. Ingest matches a
feedback against the *stored* list (:mod:`pipeline.ingestion.shown_lists`), so ``/feedback`` first writes a
pending list at once, alone (:meth:`ShownLists.stored`: one ``SET``), and answers 503 if that write fails; then
the feedback is claimed with ``SET NX`` and produced with the broker's ack, as before. With several server processes (``web_processes``) a feedback may reach another process than
the one that showed the list: a miss there is read again after the write-behind window.

What a crash costs: the lists shown in the last ``flush_seconds`` (and any batch whose write was under way)
by a process that dies without a clean stop; a feedback on one of them later answers 404 (unknown
``rec_id``), and those lists are missing from ``recommendations``. The log also misses the lists stored in
the last ``log_seconds`` (they take feedback: they are in Redis). A feedback acknowledged before the
crash is on ``interactions`` regardless. A clean stop (SIGTERM, the app's cleanup) writes and logs every
pending list first. A failed write (Redis away) loses its batch too; it is logged and counted in the metric
``privrec_shown_lists_lost`` (since the process started).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncCluster

from ..config.keys import PublicKeys

__all__ = ["ShownLists", "SHOWN", "FLUSH_SECONDS", "MAX_BATCH", "LOG_SECONDS"]

log = logging.getLogger("privrec.web")

#: How long a shown list may wait before its batch is written (seconds).
FLUSH_SECONDS = 0.01
#: A batch this large is written at once.
MAX_BATCH = 256
#: How long a stored list may wait before the log's queue is produced (seconds).
LOG_SECONDS = 0.1
_SET_ALL = """
local ttl = ARGV[1]
for i, key in ipairs(KEYS) do redis.call('SET', key, ARGV[i + 1], 'EX', ttl) end
return #KEYS
"""
#: Users whose Kafka partition is remembered (the partitioner is pure Python murmur2: ~10 µs a key).
_PARTITION_CACHE = 100_000


class ShownLists:
    """Shown lists (``rec_id`` → JSON bytes) waiting to be written, and their batched writer.

    Parameters
    ----------
    client
        The server's asyncio Redis client.
    keys
        Key layout of the server's namespace (``keys.recommendation(rec_id)``).
    ttl_seconds
        Lifetime of a stored list.
    producer
        The log's Kafka producer (``None``: no log), and ``topic`` its topic.
    flush_seconds, max_batch
        The write-behind window and the batch size that writes at once.
    log_seconds
        The log's window: stored lists are produced to ``topic`` this long after the first of them.
    reread_seconds
        Wait before reading a missed ``rec_id`` again (several server processes: another may hold it); 0: no
        second read.
    """

    def __init__(self, client: AsyncRedis, keys: PublicKeys, ttl_seconds: int, *,
                 producer: AIOKafkaProducer | None = None, topic: str = "recommendations",
                 flush_seconds: float = FLUSH_SECONDS, max_batch: int = MAX_BATCH,
                 log_seconds: float = LOG_SECONDS, reread_seconds: float = 0.0) -> None:
        self.client = client
        self.keys = keys
        self.ttl_seconds = ttl_seconds
        self.producer = producer
        self.topic = topic
        self.flush_seconds = flush_seconds
        self.max_batch = max_batch
        self.log_seconds = log_seconds
        self.reread_seconds = reread_seconds
        self.lost = 0  # lists whose write failed
        self._pending: dict[str, bytes] = {}  # rec_id -> list, until its write has finished
        self._batch: list[tuple[str, bytes, bytes]] = []  # (rec_id, list, user key), not yet handed to a write
        self._timer: asyncio.TimerHandle | None = None
        self._log_queue: list[tuple[str, bytes, bytes]] = []  # stored, not yet handed to the producer
        self._log_timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self._waiters: dict[str, asyncio.Future[bool]] = {}  # rec_id -> whether its pending write stored it
        self._partitions: dict[bytes, int] = {}
        self._partitioner = DefaultPartitioner()
        # SET key value EX ttl for every key of the batch, in one command (not on a cluster: cross-slot keys)
        self._set_all = None if isinstance(client, AsyncCluster) else client.register_script(_SET_ALL)

    def put(self, rec_id: str, user: str, value: bytes) -> None:
        """Keep the list for feedback at once and queue its write (does not wait for it)."""
        self._pending[rec_id] = value
        self._batch.append((rec_id, value, user.encode()))
        if len(self._batch) >= self.max_batch:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.flush_seconds, self.flush)

    async def get(self, rec_id: str) -> bytes | None:
        """The list shown under ``rec_id``: pending here, or stored; ``None`` if unknown (or expired)."""
        value = self._pending.get(rec_id)
        if value is not None:
            return value
        raw = await self.client.get(self.keys.recommendation(rec_id))
        if raw is None and self.reread_seconds > 0:  # maybe pending in a sibling server process
            await asyncio.sleep(self.reread_seconds)
            raw = await self.client.get(self.keys.recommendation(rec_id))
        return raw if raw is None or isinstance(raw, bytes) else raw.encode()

    async def stored(self, rec_id: str) -> bool:
        """Wait until the list shown under ``rec_id`` is in Redis if its write is pending here (at most the
        write-behind window); ``False`` if that write failed. Ingest matches a feedback against the stored list, so
        a feedback is produced only once its list is there to match."""
        if rec_id not in self._pending:
            return True
        waiter = self._waiters.get(rec_id)
        if waiter is None:
            waiter = self._waiters[rec_id] = asyncio.get_running_loop().create_future()
        mine = [entry for entry in self._batch if entry[0] == rec_id]
        if mine:  # not handed to a write yet: write this list now, alone (its batch keeps its window)
            self._batch = [entry for entry in self._batch if entry[0] != rec_id]
            self._spawn(self._write(mine))
        return await asyncio.shield(waiter)

    @property
    def pending(self) -> int:
        """Lists shown whose write has not finished."""
        return len(self._pending)

    def flush(self) -> None:
        """Hand the queued lists to a write now."""
        _cancel(self._timer)
        self._timer = None
        batch, self._batch = self._batch, []
        self._spawn(self._write(batch) if batch else None)

    def flush_log(self) -> None:
        """Hand the log's queue to the producer now."""
        _cancel(self._log_timer)
        self._log_timer = None
        batch, self._log_queue = self._log_queue, []
        self._spawn(self._log(batch) if batch else None)

    def _spawn(self, write: Coroutine[Any, Any, None] | None) -> None:
        if write is not None:
            task = asyncio.ensure_future(write)
            self._writes.add(task)  # keep a reference until it is done
            task.add_done_callback(self._writes.discard)

    async def close(self) -> None:
        """Write and log every pending list (a clean stop loses none)."""
        self.flush()
        while self._writes or self._log_queue:
            await asyncio.gather(*self._writes, return_exceptions=True)
            self.flush_log()

    async def _write(self, batch: list[tuple[str, bytes, bytes]]) -> None:
        ok = False
        try:
            ok = await self._store(batch)
        finally:
            for rec_id, _, _ in batch:
                self._pending.pop(rec_id, None)
                waiter = self._waiters.pop(rec_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(ok)
        if self.producer is not None:  # the log follows the store (stored or lost: logged as before)
            self._log_queue += batch
            if self._log_timer is None:
                self._log_timer = asyncio.get_running_loop().call_later(self.log_seconds, self.flush_log)

    async def _store(self, batch: list[tuple[str, bytes, bytes]]) -> bool:
        try:
            if len(batch) == 1:  # a plain SET costs ~60% of a one-command pipeline
                await self.client.set(self.keys.recommendation(batch[0][0]), batch[0][1], ex=self.ttl_seconds)
            elif self._set_all is not None:  # one command for the batch: a fraction of a pipeline's CPU per list
                await self._set_all(keys=[self.keys.recommendation(rec_id) for rec_id, _, _ in batch],
                                    args=[self.ttl_seconds, *(value for _, value, _ in batch)])
            else:  # a cluster: the keys hash to different slots
                async with self.client.pipeline(transaction=False) as pipe:
                    for rec_id, value, _ in batch:
                        pipe.set(self.keys.recommendation(rec_id), value, ex=self.ttl_seconds)
                    await pipe.execute()
            return True
        except Exception as exc:  # Redis away: these lists are lost (feedback on them: 404)
            self.lost += len(batch)
            log.warning("could not store %d shown lists (feedback on them will answer 404): %s", len(batch), exc)
            return False

    async def _log(self, batch: list[tuple[str, bytes, bytes]]) -> None:
        producer = self.producer
        if producer is None:
            return
        try:
            parts: list[int] | None = None
            builders: dict[int, Any] = {}  # partition -> its record batch (aiokafka's BatchBuilder)
            for _, value, key in batch:
                p = self._partitions.get(key)
                if p is None:  # the partition AIOKafkaProducer.send would pick (murmur2 of the key), remembered
                    if parts is None:
                        parts = sorted(await producer.partitions_for(self.topic))
                    p = self._partitioner(key, parts, parts)
                    if len(self._partitions) >= _PARTITION_CACHE:
                        self._partitions.clear()
                    self._partitions[key] = p
                builder = builders.get(p)
                if builder is None:
                    builder = builders[p] = producer.create_batch()
                if builder.append(key=key, value=value, timestamp=None) is None:  # full: send it, start another
                    await producer.send_batch(builder, self.topic, partition=p)
                    builder = builders[p] = producer.create_batch()
                    builder.append(key=key, value=value, timestamp=None)
            for p, builder in builders.items():
                await producer.send_batch(builder, self.topic, partition=p)
        except Exception as exc:  # the log is fire-and-forget, as it was: a broker outage drops these entries
            log.warning("could not log %d shown lists to %s: %s", len(batch), self.topic, exc)


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


SHOWN = web.AppKey("shown", ShownLists)
