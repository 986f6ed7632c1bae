"""The web server's durable outbox: feedback survives a broker outage, and is counted once.

``POST /feedback``, ``/listen`` and ``/report`` never wait on Kafka. The web server appends the event to a
Redis stream (:meth:`Outbox.put`, one script that also claims the shown list, so a refused or failed request
leaves nothing behind) and answers ``202``; if Redis itself does not answer, the request fails with ``503``
and ``Retry-After`` (the middleware of :mod:`pipeline.apps.web`) and nothing was recorded. A :class:`Forwarder`
(one background task per web process; a Redis lease, renewed every round, lets one forward at a time, so the stream's order is
the order produced) sends the stream's entries to Kafka, oldest first, and keeps each one, with the position
the broker acknowledged (broker identity, topic, partition, offset), **until the workers have counted it**:

* an entry whose broker is the current one is done once the ingest consumer group's committed offset has
  passed it (a worker commits to Kafka only after its Redis commit of the same batch);
* an entry acknowledged by a broker that is gone (a memory-only broker killed and replaced: a new identity,
  :data:`pipeline.services.IDENTITY_TOPIC`) is done if its offset lies below the partition's last counted
  offset in that broker's log — which the worker that adopts the new broker, or ``privrec up``'s reset,
  records atomically with forgetting it (:meth:`pipeline.config.keys.PublicKeys.retired_logs`) — and is sent again
  otherwise: the old log that held it is gone, and no worker counted it. A broker that no worker ever
  adopted (its record is missing while the field ``@adopted`` names the current broker) had none of its
  records counted: all of them are sent again. Until one of these records exists nothing is sent.

The outbox holds raw events, as the ``interactions`` topic does, and only until they are counted; the roles
that may read it (the web, which received them, the workers and the administrator) are those that see the
topic. It is no public kind: serving code never reads it.

Keys, all under the web role's own ``recs`` kind and hash slot (so the ACL of :mod:`pipeline.config.acl` already
lets the web write them, and the enqueue script is valid in a Redis Cluster): ``…:outbox`` (stream: ``t``
topic, ``k`` key, ``v`` value), ``…:outbox-sent`` (hash: entry id → ``identity topic partition offset``),
``…:outbox-lease`` (the forwarding process).

**A forwarder that dies mid-batch.** Before a batch is sent, its entry ids and the end offsets of the
partitions it goes to are written to ``…:outbox-inflight``; the positions are written, and that record
deleted, in one transaction after the acknowledgements. The next forwarder to hold the lease finds a record
left behind and reads those partitions from the recorded ends to their ends now: each entry found gets its
position (it is not sent again), the others are sent.

**Guarantee.** An event answered ``202`` is counted exactly once, through any number of broker deaths, Redis
restarts (Redis's AOF keeps the stream) and web server deaths, except where it is counted twice in these
narrow cases: the broker writes a record but its answer is lost (the producer's own retry writes it again;
a worker counts both), or dies after a worker counted a record it had not yet acknowledged; or a forwarder
dies with a batch in flight and the broker is replaced before the batch is recovered, after a worker
counted past it (logged as an error). Nothing accepted is lost unless Redis loses its AOF.

**Which broker acknowledged.** A position names the broker whose identity was read before the batch, so nothing
but that broker may acknowledge the batch: the forwarder reads the identity again when its reads before the batch
outlived the cached one, and a replacement broker on the same address starts no sooner than
:data:`privrec.ops.repair.NEW_BROKER_AFTER_S` after the old one was seen dead, when the producer
(:data:`~pipeline.config.kafkaconn.PRODUCE_TIMEOUT_MS`) has given up retrying the batches the dead broker did not
acknowledge. A new Tansu broker would take such a retry before its topics exist, acknowledge it without keeping it
(the entries then look counted in the old log) and answer later records at the same offsets without ever
returning them (issue 25).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..config import faults
from ..config.keys import PublicKeys
from ..config.redisconn import connect_async
from ..config.kafkaconn import client_kwargs
from ..services import read_identity_async
from ..config.settings import Settings

__all__ = ["Outbox", "OutboxKeys", "Forwarder", "ENQUEUE_SCRIPT", "OUTBOX", "FORWARDER", "BrokerUnavailable", "accept",
           "uses_outbox", "ingest_group", "pending_count", "start_forwarding", "stop_forwarding", "outbox_metrics",
           "observe_outbox"]

log = logging.getLogger("privrec.outbox")

#: Seconds a read of the broker (its identity, the workers' committed offsets) may take; then new clients.
READ_TIMEOUT = 5.0

#: Claim the shown list (``SET NX EX``, when KEYS[1] is given) and append the event, atomically.
# KEYS[1] - the stream; KEYS[2] (optional) - the shown list's "answered" key
# ARGV[1] topic, ARGV[2] key, ARGV[3] value, ARGV[4] the claim's value, ARGV[5] its TTL in seconds
# returns the entry id, or false when the list was already answered (nothing written)
ENQUEUE_SCRIPT = """
if #KEYS > 1 then
  if not redis.call('SET', KEYS[2], ARGV[4], 'NX', 'EX', tonumber(ARGV[5])) then return false end
end
return redis.call('XADD', KEYS[1], '*', 't', ARGV[1], 'k', ARGV[2], 'v', ARGV[3])
"""


#: Take or extend the forwarding lease (KEYS[1]) for ARGV[1] by ARGV[2] ms; 1 if held, 0 if another holds it;
#: ARGV[2] = 0 releases it (when held).
LEASE_SCRIPT = """
local holder = redis.call('GET', KEYS[1])
if holder ~= false and holder ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then redis.call('DEL', KEYS[1]) return 1 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
"""

#: Milliseconds a forwarder holds the lease without renewing it (it renews every round, at least every 50 ms
#: when idle): a web process that dies holding it delays forwarding by at most this.
LEASE_MS = 10_000


def uses_outbox(settings: Settings) -> bool:
    """Whether this web server writes feedback through the outbox: global mode and local mode without the
    shuffler (their ingested topics' offsets are the ones the workers store); federated and shuffled local
    stacks produce directly."""
    return settings.mode == "global" or (settings.mode == "local" and not settings.shuffle_batch)


def ingest_group(settings: Settings) -> str:
    """The workers' consumer group (:func:`pipeline.ingestion.agents.ingest`)."""
    return f"privrec-{settings.namespace}-ingest"


@dataclass(frozen=True)
class OutboxKeys:
    """The outbox's keys: in the ``recs`` kind and slot of ``ns`` (the web role's own)."""

    ns: str

    def _key(self, name: str) -> str:
        return PublicKeys(self.ns).recommendation(name)

    @property
    def stream(self) -> str:
        return self._key("outbox")

    @property
    def sent(self) -> str:
        return self._key("outbox-sent")

    @property
    def lease(self) -> str:
        return self._key("outbox-lease")

    @property
    def inflight(self) -> str:
        """Hash: the batch being sent (``ident``, ``ids``, ``ends``: the partitions' end offsets before it)."""
        return self._key("outbox-inflight")


class Outbox:
    """Appends events to the outbox stream (the web's request path)."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.keys = OutboxKeys(namespace)
        self.client = client
        self._script = client.register_script(ENQUEUE_SCRIPT)
        self.added = asyncio.Event()  # set on every put: wakes the local forwarder

    async def put(self, topic: str, key: bytes, value: bytes, *, claim: tuple[str, str, int] | None = None
                  ) -> str | None:
        """Append ``(topic, key, value)``; with ``claim = (answered_key, item, ttl)`` only if the key is new.

        Returns the entry id, or ``None`` if the claim was taken (the shown list was already answered).
        """
        keys = [self.keys.stream] + ([claim[0]] if claim else [])
        args: list[Any] = [topic, key, value] + ([claim[1], claim[2]] if claim else [])
        out = await self._script(keys=keys, args=args)
        if out is None:
            return None
        self.added.set()
        return out.decode() if isinstance(out, bytes) else str(out)


class _Backoff:
    def __init__(self) -> None:
        self.delay = 0.1

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, 2.0)

    def reset(self) -> None:
        self.delay = 0.1


class Forwarder:
    """Drains the outbox into Kafka (see the module docstring); :meth:`run` is the web app's background task.

    Parameters
    ----------
    client
        A Redis client of its own (it blocks on the stream).
    settings
        The web server's settings (namespace, partitions, Kafka options).
    producer
        A started producer of its own (``acks=all``, the default), with a bounded ``request_timeout_ms``.
    batch
        At most this many entries per round.
    """

    def __init__(self, client: aioredis.Redis, settings: Settings, producer: AIOKafkaProducer, *,
                 batch: int = 500, outbox: Outbox | None = None) -> None:
        self.r = client
        self.settings = settings
        self.producer = producer
        self.keys = OutboxKeys(settings.namespace)
        self.public = PublicKeys(settings.namespace)
        self.batch = batch
        self.outbox = outbox
        self.me = f"{os.getpid()}-{id(self):x}"
        self.forwarded = 0  # entries acknowledged by a broker (this process)
        self.resent = 0     # entries sent again because the broker holding them died uncounted
        self._identity: str | None = None
        self._identity_at = 0.0
        self._committed: dict[tuple[str, int], int] = {}
        self._committed_at = 0.0
        self._consumer: AIOKafkaConsumer | None = None
        self._group: AIOKafkaConsumer | None = None  # never subscribes: reads the workers' committed offsets
        self._waiting_logged = False
        self._after: bytes | None = None  # the last entry this process sent
        self._settled_at = 0.0
        self._settled_for: str | None = None
        self._held = False
        self._lease_script = client.register_script(LEASE_SCRIPT)

    # ------------------------------------------------------------------ broker state

    async def _start_clients(self) -> None:
        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(**client_kwargs(self.settings), enable_auto_commit=False)
            await self._consumer.start()
        if self._group is None:
            self._group = AIOKafkaConsumer(**client_kwargs(self.settings), group_id=ingest_group(self.settings),
                                           enable_auto_commit=False)
            await self._group.start()

    async def close(self) -> None:
        for c in (self._consumer, self._group):
            if c is not None:
                try:
                    await asyncio.wait_for(c.stop(), READ_TIMEOUT)
                except Exception:  # noqa: BLE001 - closing a client of a dead broker
                    log.debug("closing a Kafka client failed", exc_info=True)
        self._consumer = self._group = None

    def forget_broker(self) -> None:
        """Read the broker's identity and committed offsets again before the next send (after any error)."""
        self._identity = None
        self._committed_at = 0.0
        self._after = None

    async def identity(self) -> str:
        """The current broker's identity (cached half a second)."""
        if self._identity is None or time.monotonic() - self._identity_at > 0.5:
            await self._start_clients()
            assert self._consumer is not None
            self._identity = await asyncio.wait_for(read_identity_async(self._consumer, self.settings.kafka or ""),
                                                    READ_TIMEOUT)
            self._identity_at = time.monotonic()
        return self._identity

    async def committed(self, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The ingest group's committed offsets of ``wanted`` partitions on the current broker (cached 0.2 s)."""
        if time.monotonic() - self._committed_at > 0.2 or not wanted <= self._committed.keys():
            await self._start_clients()
            assert self._group is not None
            got: dict[tuple[str, int], int] = {}
            for topic, p in sorted(wanted):
                off = await asyncio.wait_for(self._group.committed(TopicPartition(topic, p)), READ_TIMEOUT)
                got[(topic, p)] = -1 if off is None else int(off)
            self._committed = got
            self._committed_at = time.monotonic()
        return self._committed

    # ------------------------------------------------------------------ the loop

    async def _lease(self) -> bool:
        """Take or renew the forwarding lease (atomically: two forwarders would send the same entries)."""
        held = bool(await self._lease_script(keys=[self.keys.lease], args=[self.me, LEASE_MS]))
        if held and not self._held:
            self._after = None  # another process may have sent entries meanwhile
            await self.recover()
        self._held = held
        return held

    async def recover(self) -> None:
        """A batch left in flight by a forwarder that died: find where its entries landed, record it."""
        raw = await self.r.hgetall(self.keys.inflight)
        if not raw:
            return
        who = raw[b"ident"].decode()
        ids = [i.encode() for i in json.loads(raw[b"ids"])]
        ends = {(t, int(p)): int(o) for t, p, o in json.loads(raw[b"ends"])}
        known = await self.r.hmget(self.keys.sent, ids)
        values: dict[bytes, bytes] = {}
        for eid, rec in zip(ids, known):
            if rec is None:
                got = await self.r.xrange(self.keys.stream, min=eid.decode(), max=eid.decode())
                if got:
                    values[got[0][1][b"v"]] = eid
        positions: dict[bytes, str] = {}
        ident = await self.identity()
        if values and who == ident:
            positions = await self._find(values, ends, ident)
        elif values:
            # the broker that took them is gone; were any counted? Only if a partition's retired log ends
            # beyond where that partition ended before the batch
            for (_, p), end in ends.items():
                counted = await self.r.hget(self.public.retired_logs(p), who)
                if counted is not None and int(counted) > end:
                    log.error("outbox: a forwarder died with %d events in flight to a broker that is gone, after "
                              "a worker counted part of partition %d beyond them: they are sent again and some "
                              "may be counted twice", len(values), p)
                    break
        async with self.r.pipeline(transaction=True) as pipe:
            if positions:
                pipe.hset(self.keys.sent, mapping=positions)  # type: ignore[arg-type]
            pipe.delete(self.keys.inflight)
            await pipe.execute()
        log.warning("outbox: recovered a batch a forwarder left in flight: %d of %d events had reached the broker",
                    len(positions), len(values))

    async def _find(self, values: dict[bytes, bytes], ends: dict[tuple[str, int], int], ident: str
                    ) -> dict[bytes, str]:
        """Read the partitions from where they ended before the batch to their ends now; the entries found."""
        await self._start_clients()
        assert self._consumer is not None
        tps = [TopicPartition(t, p) for t, p in ends]
        now = await asyncio.wait_for(self._consumer.end_offsets(tps), READ_TIMEOUT)
        todo = {tp for tp in tps if now[tp] > ends[(tp.topic, tp.partition)]}
        self._consumer.assign(list(todo))
        for tp in todo:
            self._consumer.seek(tp, ends[(tp.topic, tp.partition)])
        found: dict[bytes, str] = {}
        while todo:
            batches = await asyncio.wait_for(self._consumer.getmany(*todo, timeout_ms=1000), READ_TIMEOUT)
            for tp, records in batches.items():
                for rec in records:
                    eid = values.get(bytes(rec.value or b""))
                    if eid is not None:
                        found[eid] = f"{ident} {tp.topic} {tp.partition} {rec.offset}"
            for tp in list(todo):
                if await self._consumer.position(tp) >= now[tp]:
                    todo.discard(tp)
        return found

    async def run(self) -> None:
        """Forward until cancelled; errors (broker or Redis away) back off from 0.1 s to 2 s."""
        backoff = _Backoff()
        try:
            while True:
                try:
                    if not await self._lease():
                        await asyncio.sleep(1.0)
                        continue
                    busy = await self.step()
                    backoff.reset()
                    if not busy:
                        await self._idle()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the broker or Redis away: keep the entries, retry
                    log.warning("outbox: %s: %s; retrying in %.1f s", type(exc).__name__, exc, backoff.delay)
                    self.forget_broker()
                    await self.close()  # new clients: those of a dead broker may wait on it for ever
                    await backoff.wait()
        finally:
            await self.close()
            try:
                await self._lease_script(keys=[self.keys.lease], args=[self.me, 0])
            except (redis.exceptions.RedisError, OSError):
                pass

    async def _idle(self) -> None:
        """Until a local put, or 50 ms (another process's puts, the workers' progress)."""
        if self.outbox is None:
            await asyncio.sleep(0.05)
            return
        self.outbox.added.clear()
        try:
            await asyncio.wait_for(self.outbox.added.wait(), 0.05)
        except asyncio.TimeoutError:
            pass

    async def step(self) -> bool:
        """One round: settle what the workers counted (at most every 0.2 s), send the next unsent entries in
        stream order; whether there is more to do at once."""
        ident = await self.identity()
        if time.monotonic() - self._settled_at > 0.2 or ident != self._settled_for:
            if not await self.settle(ident):
                await asyncio.sleep(0.2)
                return False
        todo = await self._unsent()
        if not todo:
            return False
        await self._send(ident, todo)
        return True

    async def settle(self, ident: str) -> bool:
        """Drop the entries the workers counted; mark for sending again those a dead broker held uncounted.

        Returns ``False`` while a broker is gone and no worker has yet recorded where its logs ended (nothing
        may be sent meanwhile: the order would change and a counted entry might be sent again).
        """
        sent = {eid: rec.decode().split(" ") for eid, rec in (await self.r.hgetall(self.keys.sent)).items()}
        done: list[bytes] = []
        again: list[bytes] = []
        waiting = False
        mine = {(topic, int(p)) for who, topic, p, _ in sent.values() if who == ident}
        committed = await self.committed(mine) if mine else {}
        retired: dict[tuple[int, str], int | None] = {}
        for eid, (who, topic, p_raw, o_raw) in sent.items():
            p, o = int(p_raw), int(o_raw)
            if who == ident:
                if o < committed[(topic, p)]:
                    done.append(eid)
                continue
            if (p, who) not in retired:
                end, adopted = await self.r.hmget(self.public.retired_logs(p), [who, "@adopted"])
                if end is None and adopted is not None and adopted.decode() == ident:
                    end = b"0"  # the workers moved to this broker and never adopted that one: none of it counted
                retired[(p, who)] = None if end is None else int(end)
            end = retired[(p, who)]
            if end is None:
                waiting = True  # no worker has adopted the new broker yet: it will say where the old log ended
            elif o < end:
                done.append(eid)
            else:
                again.append(eid)
        if done:
            async with self.r.pipeline(transaction=True) as pipe:
                pipe.xdel(self.keys.stream, *done)
                pipe.hdel(self.keys.sent, *done)
                await pipe.execute()
        if again:
            await self.r.hdel(self.keys.sent, *again)
            self.resent += len(again)
            self._after = None  # send from the oldest unsent entry: these come first, in stream order
            log.warning("outbox: %d events acknowledged by a broker that is gone, and never counted: sending "
                        "them again", len(again))
        if waiting:
            if not self._waiting_logged:
                log.warning("outbox: a new broker; waiting for a worker to record where the old logs ended")
                self._waiting_logged = True
            return False
        self._waiting_logged = False
        self._settled_at, self._settled_for = time.monotonic(), ident
        return True

    async def _unsent(self) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """The next entries without a recorded position, oldest first, after the last one this process sent."""
        start = "-" if self._after is None else "(" + self._after.decode()
        while True:
            entries = await self.r.xrange(self.keys.stream, min=start, count=self.batch)
            if not entries:
                return []
            sent = await self.r.hmget(self.keys.sent, [eid for eid, _ in entries])
            todo = [(eid, f) for (eid, f), rec in zip(entries, sent) if rec is None]
            if todo:
                return todo
            self._after = entries[-1][0]
            start = "(" + self._after.decode()

    async def _send(self, ident: str, todo: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        # before sending: which entries, and where their partitions ended, so that a forwarder that dies between
        # the broker's acknowledgements and the write of the positions is recovered from, not sent twice
        topics = sorted({f[b"t"].decode() for _, f in todo})
        await self._start_clients()
        assert self._consumer is not None
        tps = [TopicPartition(t, p) for t in topics for p in sorted(await self.producer.partitions_for(t))]
        ends = await asyncio.wait_for(self._consumer.end_offsets(tps), READ_TIMEOUT)
        if await self.identity() != ident:  # the reads outlived the identity read, and another broker answers now
            self.forget_broker()
            return
        await self.r.hset(self.keys.inflight, mapping={  # type: ignore[arg-type]
            "ident": ident, "ids": json.dumps([eid.decode() for eid, _ in todo]),
            "ends": json.dumps([[tp.topic, tp.partition, int(off)] for tp, off in ends.items()])})
        futures: list[asyncio.Future[Any]] = []
        enqueue_error: BaseException | None = None
        for _, f in todo:
            try:
                futures.append(await self.producer.send(f[b"t"].decode(), value=f[b"v"], key=f.get(b"k") or None))
            except KafkaError as exc:  # no metadata within the request timeout: the rest is not sent
                enqueue_error = exc
                break
        todo = todo[:len(futures)]
        # no timeout of our own here: a record abandoned while its request is in flight may still be written, and
        # would then be sent twice; the producer's request timeout bounds the wait and resolves every future
        results = await asyncio.gather(*futures, return_exceptions=True)
        positions: dict[bytes, str] = {}
        failed: BaseException | None = None
        for (eid, _), res in zip(todo, results):
            if isinstance(res, BaseException):
                failed = failed or res
                continue
            positions[eid] = f"{ident} {res.topic} {res.partition} {res.offset}"
        faults.point("outbox-acknowledged")
        async with self.r.pipeline(transaction=True) as pipe:
            if positions:
                pipe.hset(self.keys.sent, mapping=positions)  # type: ignore[arg-type]
            pipe.delete(self.keys.inflight)
            await pipe.execute()
        self.forwarded += len(positions)
        failed = failed or enqueue_error
        if failed is not None:
            self._after = None  # the failed ones are sent again first
            raise failed
        self._after = todo[-1][0]


def pending_count(client: redis.Redis, namespace: str) -> int:
    """Entries in the outbox (sent or not) — for tests and ``privrec status``."""
    return int(client.xlen(OutboxKeys(namespace).stream))


class BrokerUnavailable(RuntimeError):
    """A direct produce (no outbox: federated, shuffled local mode) failed or timed out: answer 503."""


async def accept(client: aioredis.Redis, outbox: Outbox | None, producer: AIOKafkaProducer, topic: str, key: bytes,
                 value: bytes, *, claim: tuple[str, str, int] | None = None) -> bool:
    """Record an accepted event: in the outbox when there is one, else produced and acknowledged by the broker.

    ``claim = (answered_key, item, ttl)``: one answer per shown list; returns ``False`` (nothing recorded) when
    it was already answered. Raises :class:`BrokerUnavailable` when a direct produce fails (the claim is then
    released, so the client's retry is accepted) and Redis's errors when Redis does not answer.
    """
    if outbox is not None:
        return await outbox.put(topic, key, value, claim=claim) is not None
    if claim is not None and not await client.set(claim[0], claim[1], nx=True, ex=claim[2]):
        return False
    try:
        await producer.send_and_wait(topic, key=key, value=value)
    except KafkaError as exc:
        if claim is not None:
            await client.delete(claim[0])  # not recorded: the list may be answered again
        raise BrokerUnavailable(f"the broker did not acknowledge the event ({type(exc).__name__})") from exc
    return True


OUTBOX = web.AppKey("outbox", Outbox)
FORWARDER = web.AppKey("forwarder", Forwarder)


async def start_forwarding(app: web.Application, settings: Settings, client: aioredis.Redis,
                           producer: AIOKafkaProducer) -> asyncio.Task[None] | None:
    """Give ``app`` its outbox and start its forwarder (``None``: this stack produces directly)."""
    if not uses_outbox(settings):
        return None
    assert settings.redis_url is not None
    app[OUTBOX] = Outbox(client, settings.namespace)
    app[FORWARDER] = Forwarder(connect_async(settings.redis_url), settings, producer, outbox=app[OUTBOX])
    return asyncio.ensure_future(app[FORWARDER].run())


async def stop_forwarding(app: web.Application, task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
        pass
    await app[FORWARDER].r.aclose()


def outbox_metrics(registry: CollectorRegistry) -> dict[str, Any]:
    """Register the outbox's and the stack repairs' metrics on the web server's registry; pass what it returns
    to :func:`observe_outbox`."""
    return {
        "pending": Gauge("privrec_outbox_entries", "Events in the outbox: not yet sent, or sent and not yet "
                         "counted by a worker", registry=registry),
        "forwarded": Counter("privrec_outbox_forwarded_total", "Outbox events acknowledged by a broker "
                             "(this process's forwarder)", registry=registry),
        "resent": Counter("privrec_outbox_resent_total", "Outbox events sent again: a dead broker held them "
                          "and no worker had counted them", registry=registry),
        "repairs": Counter("privrec_stack_repairs_total", "Repairs of the embedded broker or redis-server by "
                           "the supervisor", ["service"], registry=registry),
        "seen": {},
    }


async def observe_outbox(app: web.Application, m: dict[str, Any]) -> None:
    """Bring the metrics of :func:`outbox_metrics` up to date (``GET /metrics``)."""
    if OUTBOX not in app:
        return
    client = app[OUTBOX].client
    m["pending"].set(await client.xlen(app[OUTBOX].keys.stream))
    fwd = app[FORWARDER]
    for name, total in (("forwarded", fwd.forwarded), ("resent", fwd.resent)):
        m[name].inc(max(0, total - m["seen"].get(name, 0)))
        m["seen"][name] = total
    for service, raw in (await client.hgetall(PublicKeys(fwd.settings.namespace).stack_repairs)).items():
        name, total = service.decode(), int(raw)
        m["repairs"].labels(name).inc(max(0, total - m["seen"].get(("repairs", name), 0)))
        m["seen"][("repairs", name)] = total
