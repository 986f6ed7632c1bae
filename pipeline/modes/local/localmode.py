"""Local mode's server side: reports in, sums of reports out; no exact per-user value ever arrives.

Devices (the page, :class:`models.local.LocalClient`) send reports to ``ldp-reports`` (key = user,
through ``POST /report``). The same flow as the global mode runs on them:

1. **ingest** (:class:`ReportIngestProcessor`, run by :func:`pipeline.ingestion.agents.ingest`): each partition's
   reports are parsed (a malformed report, an unknown user or item, a report of the other algorithm,
   a stale or repeated version → ``dead-letters`` with the reason) and added to the partition's
   per-unit sums — for ``tree`` a user's new noisy running sum *replaces* their previous one, for
   ``round`` every report adds — together with each user's latest version and the public noise
   variance of each unit's sum, committed with the partition's next offset in one Lua script (the
   global mode's :data:`pipeline.state.trusted.INGEST_SCRIPT`): a report is never counted twice.
   With shuffling, :class:`ShufflerTask` sits in between: it consumes ``ldp-reports``, keeps one
   report per distinct user per unit batch, and produces stripped, shuffled batches to
   ``ldp-shuffled``, which :class:`BatchIngestProcessor` adds (a batch counted once: its sequence
   number is stored with the sums).
2. **release** (:class:`LocalReleaseStage`): sums the partitions and publishes them as the released
   statistics, with the public noise std of the sum; the server adds no noise (the devices did).
3. **solve** and **serve**: unchanged.

The partition hashes live where the global mode's exact statistics live (``{ns}:trusted:…``) and
are read by the same code, but in local mode they hold only sums of noisy reports.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from models.accounting import NoNoiseEvent, event_to_dict
from models.local import LocalConfig, LocalReport, ReportError, StaleReport, parse_report
from models.local.aggregate import add_report, check_version, clip_context, unit_noise_std
from models.local.shuffle import ShuffledBatch, Shuffler
from models.streaming import ReleasedStats, UnitStats

from ...ingestion import agents
from ...release import timers
from ...config.kafkaconn import client_kwargs
from ...config.redisconn import connect
from ...data.catalog import Catalog, UnknownArmError, UnknownUserError
from ...ingestion.ingest import DeadLetterItem, IngestProcessor, PreparedBatch, fresh_messages
from ...data.records import TOPICS, dead_letter_value
from ...config.settings import Settings
from .local_http import local_statement
from ...release.stages import projection
from ...state.trusted import TrustedStore

log = logging.getLogger("privrec.local")

__all__ = ["local_config", "ReportIngestProcessor", "BatchIngestProcessor", "LocalReleaseStage",
           "ShufflerTask", "report_topic", "register"]


def local_config(settings: Settings, d: int) -> LocalConfig:
    """The namespace's public device calibration."""
    config: LocalConfig = settings.local_config(d)
    return config


def report_topic(settings: Settings) -> str:
    """The topic the aggregate consumes: the reports, or the shuffler's batches."""
    return TOPICS["ldp_shuffled"] if settings.shuffle_batch else TOPICS["ldp_reports"]


# ---------------------------------------------------------------------------------------------- ingest

@dataclass
class _Shard:
    stats: UnitStats
    var: np.ndarray
    latest: dict[str, tuple[int, np.ndarray | None]]
    seqs: dict[int, int]
    offset: int | None


def _latest_value(version: int, vector: np.ndarray | None) -> bytes:
    head = struct.pack("<q", version)
    return head if vector is None else head + vector.astype("<f8").tobytes()


def _decode_shard(raw: dict[bytes, bytes], off: Any, n_units: int, d: int) -> _Shard:
    stats = UnitStats.zeros(n_units=n_units, d=d)
    var = np.zeros(n_units)
    latest: dict[str, tuple[int, np.ndarray | None]] = {}
    seqs: dict[int, int] = {}
    for k, v in raw.items():
        kind, _, name = k.decode().partition(":")
        if kind == "g":
            stats.gram[int(name)] = np.frombuffer(v, dtype="<f8").reshape(d, d)
        elif kind == "b":
            stats.b[int(name)] = np.frombuffer(v, dtype="<f8")
        elif kind == "n":
            stats.count[int(name)] = int(v)
        elif kind == "v":
            var[int(name)] = float(v)
        elif kind == "s":
            seqs[int(name)] = int(v)
        elif kind == "l":
            version = struct.unpack("<q", v[:8])[0]
            latest[name] = (version, np.frombuffer(v[8:], dtype="<f8").copy() if len(v) > 8 else None)
    return _Shard(stats, var, latest, seqs, None if off is None else int(off))


class _LocalIngestBase(IngestProcessor):
    """Shared by the report and the batch processors: partition shards with variances, Lua commit."""

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, config: LocalConfig) -> None:
        super().__init__(client, namespace, catalog)
        self.config = config
        self._local: dict[int, _Shard] = {}

    def forget(self, partition: int) -> None:
        super().forget(partition)
        self._local.pop(partition, None)

    def shard(self, partition: int) -> _Shard:
        hit = self._local.get(partition)
        if hit is None:
            with self.store.r.pipeline(transaction=True) as pipe:
                pipe.hgetall(self.store.keys.stats(partition))
                pipe.get(self.store.keys.offset(partition))
                raw, off = pipe.execute()
            hit = self._local[partition] = _decode_shard(raw, off, self.catalog.n_units, self.catalog.d)
        return hit

    def context(self, item: str) -> np.ndarray:
        return clip_context(self.catalog.features_of([item])[0])

    def shown_contexts(self, rep: LocalReport) -> np.ndarray:
        """The clipped contexts of every item of the list ``rep`` answers (the server added them: public)."""
        if not rep.shown:
            raise ReportError("shown", "missing: the server adds the answered list's items before the report is "
                                       "queued (a report written to ldp-reports by anyone else is refused)")
        return np.stack([clip_context(x) for x in self.catalog.features_of(list(rep.shown))])

    def _batch(self, partition: int, msgs: list[tuple[int, bytes]], shard: _Shard) -> tuple[
            list[tuple[int, bytes]], int]:
        fresh = fresh_messages(partition, msgs, shard.offset)
        next_offset = (fresh[-1][0] + 1) if fresh else (shard.offset if shard.offset is not None else 0)
        return fresh, next_offset

    def commit(self, batch: PreparedBatch) -> bool:
        if batch.expected_offset is not None and batch.next_offset == batch.expected_offset:
            return True
        new: _Shard = batch.shard  # type: ignore[attr-defined]
        fields: list[Any] = []
        for u in sorted(batch.touched_units):  # type: ignore[attr-defined]
            fields += [f"g:{u}", new.stats.gram[u].astype("<f8").tobytes(), f"b:{u}",
                       new.stats.b[u].astype("<f8").tobytes(), f"n:{u}", str(int(new.stats.count[u])),
                       f"v:{u}", repr(float(new.var[u]))]
            if u in new.seqs:
                fields += [f"s:{u}", str(new.seqs[u])]
        for user in sorted(batch.touched_users):  # type: ignore[attr-defined]
            fields += [f"l:{user}", _latest_value(*new.latest[user])]
        args: list[Any] = ["" if batch.expected_offset is None else str(batch.expected_offset),
                           str(batch.next_offset), len(fields) // 2, *fields, len(batch.reasons)]
        for reason, count in batch.reasons.items():
            args += [reason[:200], count]
        for user, count in batch.users.items():
            args += [user, count]
        keys = [self.store.keys.offset(batch.partition), self.store.keys.stats(batch.partition),
                self.store.keys.deadletters(batch.partition), self.store.keys.user_counts(batch.partition)]
        ok = bool(self.store._ingest(keys=keys, args=args))
        if ok:
            new.offset = batch.next_offset
            self._local[batch.partition] = new
        else:
            self.forget(batch.partition)
        return ok


def _copy(shard: _Shard) -> _Shard:
    return _Shard(shard.stats.copy(), shard.var.copy(), dict(shard.latest), dict(shard.seqs), shard.offset)


class ReportIngestProcessor(_LocalIngestBase):
    """``ldp-reports`` → per-unit sums of the reports, each user's latest version (and ``tree``: noisy sum)."""

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> PreparedBatch:
        shard = self.shard(partition)
        fresh, next_offset = self._batch(partition, list(messages), shard)
        new = _copy(shard)
        cfg = self.config
        dead: list[DeadLetterItem] = []
        units: set[int] = set()
        users: Counter[str] = Counter()
        for offset, raw in fresh:
            try:
                rep = parse_report(raw, d=cfg.d, algorithm=cfg.algorithm)
                unit = self.catalog.unit_of(rep.user)
                X = self.shown_contexts(rep)
                check_version(new.latest, rep)
            except (ReportError, StaleReport, UnknownUserError, UnknownArmError) as e:
                dead.append(DeadLetterItem(offset, raw, f"local report: {e}"))
                continue
            add_report(cfg, new.stats.gram, new.stats.b, new.stats.count, new.var, new.latest, rep, unit, X)
            units.add(unit)
            users[rep.user] += 1
        batch = PreparedBatch(partition, shard.offset, next_offset, new.stats, np.array(sorted(units), dtype=np.int64),
                              sum(users.values()), len(messages) - len(fresh), dead, dict(users))
        batch.shard = new  # type: ignore[attr-defined]
        batch.touched_units = units  # type: ignore[attr-defined]
        batch.touched_users = set(users)  # type: ignore[attr-defined]
        return batch


class BatchIngestProcessor(_LocalIngestBase):
    """``ldp-shuffled`` → per-unit sums; a batch whose sequence number was counted is a dead letter."""

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> PreparedBatch:
        shard = self.shard(partition)
        fresh, next_offset = self._batch(partition, list(messages), shard)
        new = _copy(shard)
        dead: list[DeadLetterItem] = []
        units: set[int] = set()
        counted = 0
        for offset, raw in fresh:
            try:
                b = ShuffledBatch.parse(raw, d=self.config.d)
                if b.unit >= self.catalog.n_units:
                    raise ValueError(f"batch: unknown unit {b.unit}")
                if b.seq <= new.seqs.get(b.unit, 0):
                    raise ValueError(f"batch: repeated batch {b.seq} of unit {b.unit} (latest {new.seqs[b.unit]})")
                X = np.stack([self.context(i) for i in b.items])
            except (ValueError, UnknownArmError) as e:
                dead.append(DeadLetterItem(offset, raw, f"shuffled batch: {e}"))
                continue
            new.stats.gram[b.unit] += X.T @ X
            new.stats.b[b.unit] += np.asarray(b.vectors).sum(axis=0)
            new.stats.count[b.unit] += b.n
            new.var[b.unit] += b.n * self.config.report_variance(1)
            new.seqs[b.unit] = b.seq
            units.add(b.unit)
            counted += b.n
        batch = PreparedBatch(partition, shard.offset, next_offset, new.stats, np.array(sorted(units), dtype=np.int64),
                              counted, len(messages) - len(fresh), dead, {})
        batch.shard = new  # type: ignore[attr-defined]
        batch.touched_units = units  # type: ignore[attr-defined]
        batch.touched_users = set()  # type: ignore[attr-defined]
        return batch


# ---------------------------------------------------------------------------------------------- release

@dataclass
class LocalReleaseStage:
    """Leader-only: the partitions' sums of reports → the released statistics (no server noise)."""

    settings: Settings
    catalog: Catalog
    client: redis.Redis
    config: LocalConfig = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.store = TrustedStore(self.client, s.namespace)
        self.store.ensure_config(s.model_config() | {"catalog_fingerprint": self.catalog.fingerprint})
        self.config = local_config(s, self.catalog.d)
        self.structure, self.V = projection(s.algorithm, self.catalog.W)
        self.statement = local_statement(self.config)
        self._reader = _LocalIngestBase(self.client, s.namespace, self.catalog, self.config)

    def recover(self) -> int:
        return self.store.publish()

    def tick(self, *, force: bool = False) -> int | None:
        self.recover()
        c = self.catalog
        stats, var, offsets = UnitStats.zeros(n_units=c.n_units, d=c.d), np.zeros(c.n_units), []
        for p in range(self.settings.partitions):
            self._reader.forget(p)
            shard = self._reader.shard(p)
            stats.gram += shard.stats.gram
            stats.b += shard.stats.b
            stats.count += shard.stats.count
            var += shard.var
            offsets.append(0 if shard.offset is None else shard.offset)
        last = self.client.hget(self.store.keys.pending, "count")
        if not force and last is not None and int(last) == int(stats.count.sum()):
            return None
        version = self.store.pending_version() + 1
        b_tilde = stats.b.reshape(-1).copy() if self.structure == "linucb" else (self.V @ stats.b).reshape(-1)
        released = ReleasedStats(self.structure, self.V, stats.gram, b_tilde, stats.count, version, NoNoiseEvent(),
                                 unit_noise_std(var, None if self.structure == "linucb" else self.V))
        event = json.dumps(event_to_dict(NoNoiseEvent()))  # the server spends nothing: the devices add the noise
        self.store.persist_release(None, released, event, offsets)
        self.store.publish()
        return version


# ---------------------------------------------------------------------------------------------- shuffler

class ShufflerTask:
    """``ldp-reports`` → ``ldp-shuffled``: one report per distinct user per unit batch, stripped and shuffled.

    State (open batches, each user's latest version, the next offset of every partition, and an
    *outbox* of completed batches) is one Redis value. Completed batches are saved in the outbox with
    the state that produced them *before* they are sent, then sent, then the outbox is cleared: after a
    crash the outbox is sent again as it was (the aggregate drops a batch whose sequence number it has
    counted), and the reports after the saved offsets are read again. One shuffler per namespace
    (``privrec up`` runs it in the single worker).
    """

    def __init__(self, client: redis.Redis, settings: Settings, catalog: Catalog, config: LocalConfig) -> None:
        self.r, self.settings, self.catalog, self.config = client, settings, catalog, config
        ns = settings.namespace
        self.key = f"{ns}:shuffle:{{{ns}:shuffle}}:state"
        self.shuffler = Shuffler(config)
        self.versions: dict[str, int] = {}
        self.offsets: dict[int, int] = {}
        self.outbox: list[bytes] = []
        self._load()

    def _load(self) -> None:
        raw = self.r.get(self.key)
        if raw is None:
            return
        data = json.loads(raw)
        self.versions = {k: int(v) for k, v in data["versions"].items()}
        self.offsets = {int(k): int(v) for k, v in data["offsets"].items()}
        self.shuffler.seq = {int(k): int(v) for k, v in data["seq"].items()}
        self.outbox = [b.encode() for b in data.get("outbox", [])]
        for unit, reps in data["open"].items():
            for body in reps:
                self.shuffler.add(parse_report(body, d=self.config.d), unit=int(unit))

    def save(self) -> None:
        state = self.shuffler.state()
        self.r.set(self.key, json.dumps({"versions": self.versions, "offsets": self.offsets, "seq": state["seq"],
                                         "open": state["open"], "outbox": [b.decode() for b in self.outbox]}))

    def process(self, partition: int, messages: Sequence[tuple[int, bytes]]
                ) -> tuple[list[ShuffledBatch], list[DeadLetterItem]]:
        start = self.offsets.get(partition)
        out: list[ShuffledBatch] = []
        dead: list[DeadLetterItem] = []
        for offset, raw in sorted(messages):
            if start is not None and offset < start:
                continue
            try:
                rep = parse_report(raw, d=self.config.d, algorithm=self.config.algorithm)
                unit = self.catalog.unit_of(rep.user)
                if not rep.shown:
                    raise ReportError("shown", "missing: the server adds the answered list's items")
                for a in rep.shown:
                    self.catalog.arm_row(a)
                if rep.version <= self.versions.get(rep.user, 0):
                    raise StaleReport(f"stale or repeated version {rep.version} of user {rep.user!r} "
                                      f"(latest {self.versions[rep.user]})")
            except (ReportError, StaleReport, UnknownUserError, UnknownArmError) as e:
                dead.append(DeadLetterItem(offset, raw, f"local report: {e}"))
                continue
            self.versions[rep.user] = rep.version
            out += self.shuffler.add(rep, unit=unit)
        if messages:
            self.offsets[partition] = max(o for o, _ in messages) + 1
        return out, dead


def reset_shuffler_offsets(client: redis.Redis, namespace: str) -> None:
    """A new (memory-only) broker's log starts at offset 0: forget the shuffler's read positions, keep the rest."""
    key = f"{namespace}:shuffle:{{{namespace}:shuffle}}:state"
    raw = client.get(key)
    if raw is not None:
        data = json.loads(raw)
        data["offsets"] = {}
        client.set(key, json.dumps(data))


async def shuffle_loop(settings: Settings, catalog: Catalog) -> None:
    """Run the shuffler until the worker stops (a task of the worker's app)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    client = connect(settings.redis_url or "redis://127.0.0.1:6379/0")
    task = ShufflerTask(client, settings, catalog, local_config(settings, catalog.d))
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_max_wait_ms=100)
    producer = AIOKafkaProducer(**client_kwargs(settings), linger_ms=5)
    await producer.start()
    await consumer.start()
    topic = TOPICS["ldp_reports"]
    tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
    consumer.assign(tps)

    async def seek_stored() -> None:
        for tp in tps:
            off = task.offsets.get(tp.partition)
            if off is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, off)

    async def flush_outbox() -> None:
        for value in task.outbox:
            batch = ShuffledBatch.parse(value, d=task.config.d)
            await producer.send_and_wait(TOPICS["ldp_shuffled"], key=str(batch.unit).encode(), value=value)
        if task.outbox:
            task.outbox = []
            task.save()

    await flush_outbox()
    await seek_stored()
    backoff = agents.Backoff()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=int(settings.batch_seconds * 1000),
                                             max_records=settings.batch_size)
            try:
                for tp, records in batches.items():
                    msgs = [(r.offset, r.value if r.value is not None else b"") for r in records]
                    out, dead = task.process(tp.partition, msgs)
                    for item in dead:
                        await producer.send_and_wait(TOPICS["dead_letters"], value=dead_letter_value(
                            item.raw, item.reason, tp.topic, tp.partition, item.offset))
                    task.outbox += [b.to_json() for b in out]
                if batches:
                    task.save()           # the state and its completed batches, before any is sent
                    await flush_outbox()  # then sent, then cleared
                backoff.reset()
            except agents.REDIS_DOWN as exc:  # Redis restarting: reload the saved state and re-read from it
                log.warning("shuffler: Redis unavailable (%s); retrying in %.1f s", exc, backoff.delay)
                await backoff.wait()
                try:
                    task = ShufflerTask(client, settings, catalog, task.config)
                    await flush_outbox()
                    await seek_stored()
                except agents.REDIS_DOWN:
                    continue
    except asyncio.CancelledError:
        raise
    finally:
        await consumer.stop()
        await producer.stop()


def register(app: Any, settings: Settings, catalog: Catalog, *, metrics: Any = None, metrics_url: str | None = None
             ) -> None:
    """Local mode's worker: the ingest task on the reports (or batches), the shuffler, the release timer."""
    config = local_config(settings, catalog.d)
    client = connect(settings.redis_url or "redis://127.0.0.1:6379/0")
    make = BatchIngestProcessor if settings.shuffle_batch else ReportIngestProcessor
    processor = make(client, settings.namespace, catalog, config)
    agents.register(app, settings, catalog, topic=report_topic(settings), metrics=metrics, metrics_url=metrics_url,
                    processor=processor)
    if settings.shuffle_batch:
        @app.task
        async def shuffle_task() -> None:
            await shuffle_loop(settings, catalog)

    timers.register(app, settings, catalog, metrics, release=LocalReleaseStage)


