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
   At user level the processor also checks what the device promised, never trusting it: a report must
   carry its epoch (not ahead of the server's clock by more than one, never before the user's last),
   at most ``cap`` reports of a user are accepted per epoch, and none whose version (the device's
   report counter) is past the lifetime budget's report limit — else a dead letter with the reason
   (``beyond the cap`` / ``past the lifetime budget``). Each user's ledger record (epoch, reports in
   it, last version) is committed with the sums (field ``e:<user>``), then mirrored to the public
   ledger keys that ``/budget`` and the dashboard read, with the refused counts (``dropped``,
   ``over_budget``) — the same keys and counters as the global mode's fold.
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
import dataclasses
import json
import logging
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import redis

from models.accounting import NoNoiseEvent, event_to_dict
from models.local import LocalConfig, LocalReport, ReportError, StaleReport, parse_report
from models.local.aggregate import add_report, check_version, clip_context, unit_noise_std
from models.local.items import ItemBlanket
from models.local.seal import AnalyzerKey
from models.local.shuffle import POPULATION, ShuffledBatch, Shuffler
from models.ground.items import ReleasedItems
from models.streaming import ReleasedStats, UnitStats

from ...ingestion import agents
from ...release import timers
from ...config.kafkaconn import client_kwargs
from ...config.redisconn import connect
from ...data.catalog import Catalog, UnknownArmError, UnknownUserError
from .esa import analyzer_key, is_sealed_batch, open_batch
from ...ingestion.ingest import DeadLetterItem, IngestProcessor, PreparedBatch, fresh_messages
from ...config.keys import PublicKeys, partition_of
from ...data.records import TOPICS, dead_letter_value
from ...config.settings import Settings
from ...config.ledger import LedgerRecord
from .local_http import catalog_codebook, check_messages, local_statement
from ...release.stages import projection
from ...state.trusted import TrustedStore

log = logging.getLogger("privrec.local")

__all__ = ["local_config", "ReportIngestProcessor", "check_user_level", "BeyondLimit", "BatchIngestProcessor", "LocalReleaseStage",
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
    items: np.ndarray | None = None  # item reports: the sum of the batches' unbiased estimates h - n p (noisy)
    items_var: float = 0.0           # its public noise variance per item, sum of n p (1 - p)
    items_n: int = 0                 # item reports counted
    ledger: dict[str, LedgerRecord] = field(default_factory=dict)  # user level: per user (epoch, k, last version)


def _latest_value(version: int, vector: np.ndarray | None) -> bytes:
    head = struct.pack("<q", version)
    return head if vector is None else head + vector.astype("<f8").tobytes()


def _decode_shard(raw: dict[bytes, bytes], off: Any, n_units: int, d: int) -> _Shard:
    stats = UnitStats.zeros(n_units=n_units, d=d)
    var = np.zeros(n_units)
    latest: dict[str, tuple[int, np.ndarray | None]] = {}
    seqs: dict[int, int] = {}
    ledger: dict[str, LedgerRecord] = {}
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
        elif kind == "e":
            ledger[name] = LedgerRecord.loads(v)
    shard = _Shard(stats, var, latest, seqs, None if off is None else int(off), ledger=ledger)
    if b"i:sums" in raw:
        shard.items = np.frombuffer(raw[b"i:sums"], dtype="<f8").copy()
        shard.items_var, shard.items_n = float(raw[b"i:var"]), int(raw[b"i:n"])
    return shard


class _LocalIngestBase(IngestProcessor):
    """Shared by the report and the batch processors: partition shards with variances, Lua commit."""

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, config: LocalConfig) -> None:
        super().__init__(client, namespace, catalog)
        self.config = config
        self._local: dict[int, _Shard] = {}
        #: The server's clock (user level: which epochs a report may name).
        self.clock: Callable[[], float] = time.time

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
            if user in new.ledger:
                fields += [f"e:{user}", new.ledger[user].dumps()]
        if new.items is not None and getattr(batch, "item_batches", False):
            fields += ["i:sums", new.items.astype("<f8").tobytes(), "i:var", repr(new.items_var), "i:n",
                       str(new.items_n)]
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
            self._mirror_ledger(batch, new)
        else:
            self.forget(batch.partition)
        return ok


    def _mirror_ledger(self, batch: PreparedBatch, new: _Shard) -> None:
        """User level: the committed ledger records of the batch's users and its refused counts, to the public
        ledger keys (participations are public, DESIGN §2). After the commit: a crash in between leaves the
        mirror one batch behind until the user's next report (the trusted record decides, never the mirror)."""
        refused: Counter[str] = getattr(batch, "refused", Counter())
        records = {u: new.ledger[u].dumps() for u in getattr(batch, "touched_users", ()) if u in new.ledger}
        if not records and not refused:
            return
        keys = PublicKeys(self.store.keys.ns)
        with self.store.r.pipeline(transaction=True) as pipe:
            if records:
                pipe.hset(keys.ledger_participation(batch.partition), mapping=records)
            for name, count in refused.items():
                pipe.hincrby(keys.ledger_summary(batch.partition), name, count)
            pipe.execute()


def _copy(shard: _Shard) -> _Shard:
    return _Shard(shard.stats.copy(), shard.var.copy(), dict(shard.latest), dict(shard.seqs), shard.offset,
                  None if shard.items is None else shard.items.copy(), shard.items_var, shard.items_n,
                  dict(shard.ledger))


class BeyondLimit(Exception):
    """A report past what its device may send: ``counter`` ``"dropped"`` (beyond the epoch's cap, or an epoch the
    server cannot accept) or ``"over_budget"`` (past the lifetime budget's report limit)."""

    def __init__(self, counter: str, message: str) -> None:
        super().__init__(message)
        self.counter = counter


class Counted(Protocol):
    """What the cap is checked from: a report's (or a sealed envelope's) user, version and epoch."""

    @property
    def user(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def epoch(self) -> int | None: ...


def check_user_level(config: LocalConfig, ledger: dict[str, LedgerRecord], rep: Counted, now: float
                     ) -> LedgerRecord:
    """The user's ledger record with ``rep`` counted, or :class:`BeyondLimit` / :class:`ReportError` naming why
    not (user level; ``now``: the server's clock). Checked from the report's version and epoch alone: the
    server never trusts the device to have kept its cap or its budget."""
    limit = config.report_limit()
    if limit is not None and rep.version > limit:
        raise BeyondLimit("over_budget", f"past the lifetime budget: version {rep.version} of user {rep.user!r} is "
                                         f"beyond the {limit} reports user_budget epsilon {config.user_budget:g} "
                                         f"allows a device")
    if rep.epoch is None:
        raise ReportError("epoch", "missing: at user level a report carries its epoch (floor(t / epoch_seconds))")
    now_epoch = config.epoch_at(now)
    if rep.epoch > now_epoch + 1:  # one epoch of clock skew at most
        raise BeyondLimit("dropped", f"epoch {rep.epoch} is ahead of the server's epoch {now_epoch} (a device "
                                     f"cannot open a new epoch early)")
    rec = ledger.get(rep.user, LedgerRecord(epoch=-1))
    if rep.epoch < rec.epoch:
        raise BeyondLimit("dropped", f"epoch {rep.epoch} is before user {rep.user!r}'s last reported epoch "
                                     f"{rec.epoch} (epochs never go back)")
    k = rec.k if rep.epoch == rec.epoch else 0
    if k >= config.cap:
        raise BeyondLimit("dropped", f"beyond the cap: user {rep.user!r} already has {k} reports in epoch "
                                     f"{rep.epoch} (cap {config.cap} per epoch); version {rep.version} refused")
    return LedgerRecord(epoch=rep.epoch, k=k + 1, last_version=rep.version)


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
        refused: Counter[str] = Counter()
        now = self.clock()
        for offset, raw in fresh:
            try:
                rep = parse_report(raw, d=cfg.d, algorithm=cfg.algorithm)
                unit = self.catalog.unit_of(rep.user)
                X = self.shown_contexts(rep)
                check_version(new.latest, rep)
                record = check_user_level(cfg, new.ledger, rep, now) if cfg.user_level else None
            except (ReportError, StaleReport, UnknownUserError, UnknownArmError) as e:
                dead.append(DeadLetterItem(offset, raw, f"local report: {e}"))
                continue
            except BeyondLimit as e:
                dead.append(DeadLetterItem(offset, raw, f"local report: {e}"))
                refused[e.counter] += 1
                continue
            if record is not None:
                new.ledger[rep.user] = record
            add_report(cfg, new.stats.gram, new.stats.b, new.stats.count, new.var, new.latest, rep, unit, X)
            units.add(unit)
            users[rep.user] += 1
        batch = PreparedBatch(partition, shard.offset, next_offset, new.stats, np.array(sorted(units), dtype=np.int64),
                              sum(users.values()), len(messages) - len(fresh), dead, dict(users))
        batch.shard = new  # type: ignore[attr-defined]
        batch.touched_units = units  # type: ignore[attr-defined]
        batch.touched_users = set(users)  # type: ignore[attr-defined]
        batch.refused = refused  # type: ignore[attr-defined]
        return batch


class BatchIngestProcessor(_LocalIngestBase):
    """``ldp-shuffled`` → per-unit sums; a batch whose sequence number was counted is a dead letter.

    With a separate shuffler (:mod:`pipeline.modes.local.shuffler_service`) the batches are sealed: ``analyzer_key`` opens
    each content (:func:`pipeline.modes.local.esa.open_batch`); one that does not open is a dead letter (its sealed bytes and
    the reason), and then nothing of its batch counts (the shown items are not linked to the contents).

    With ``items`` (the public calibration of the item reports, :class:`models.local.items.ItemBlanket`), a
    batch's item messages (``msgs``: catalog rows, real items and fakes shuffled together) add their histogram's
    unbiased estimate ``h - n p`` to the partition's item sums, with its public variance ``n p (1 - p)``.

    With codewords and ``item_term`` (the setting ``local_item_term``: the codebook is the catalog itself, codeword
    ``c`` = catalog row ``c``) the same estimate of the codewords' histogram is added to the item sums too: the item
    term, post-processing of what ``b`` is made of.
    """

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, config: LocalConfig,
                 analyzer_key: AnalyzerKey | None = None, items: ItemBlanket | None = None,
                 codebook: np.ndarray | None = None, item_term: bool = False) -> None:
        super().__init__(client, namespace, catalog, config)
        self.analyzer_key = analyzer_key
        self.items = items
        if item_term and not (config.codewords and config.codewords == len(catalog.feature_matrix)):
            raise ValueError(f"`item_term` needs one codeword per catalog item ({len(catalog.feature_matrix)}), got "
                             f"{config.codewords}")
        self.item_term = item_term
        #: ``config.codewords``: the public codebook; a batch's messages are codewords of listens, folded into ``b``
        self.codebook = codebook
        if config.codewords:
            if codebook is None or codebook.shape != (config.codewords, config.d):
                raise ValueError(f"`codebook` must be {config.codewords} x {config.d} with codewords on")
            self.codes = config.blanket
            #: the noise variance one batch message adds per coordinate of b, per unit of n p (1 - p)
            self.code_var = float((codebook**2).sum(axis=0).max())

    def parse_batch(self, offset: int, raw: bytes, dead: list[DeadLetterItem]) -> ShuffledBatch | None:
        """The batch at ``offset`` (opened, if sealed); ``None`` when nothing of it counts (dead letters added)."""
        if not is_sealed_batch(raw):
            return ShuffledBatch.parse(raw, d=self.config.d)
        if self.analyzer_key is None:
            raise ValueError("a sealed batch, but this worker holds no analyzer key (PRIVREC_ANALYZER_KEY)")
        opened = open_batch(raw, self.analyzer_key, self.config)
        dead += [DeadLetterItem(offset, blob, reason) for blob, reason in opened.failed]
        if opened.batch is None or not self.config.codewords:
            return opened.batch
        return dataclasses.replace(opened.batch, messages=self.open_messages(offset, raw, dead))

    def open_messages(self, offset: int, raw: bytes, dead: list[DeadLetterItem]) -> list[int]:
        """Codewords: the batch's messages, each opened on its own; one that does not open or is malformed is a dead
        letter (its sealed bytes and the reason), the rest count."""
        from models.local.esa import SealedBatch, parse_message
        from models.local.seal import SealError

        assert self.analyzer_key is not None
        out: list[int] = []
        for blob in SealedBatch.parse(raw).msgs:
            try:
                out.append(parse_message(self.analyzer_key.open(blob), codewords=self.config.codewords))
            except (SealError, ReportError) as e:
                dead.append(DeadLetterItem(offset, blob, f"sealed message: {e}"))
        return out

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> PreparedBatch:
        shard = self.shard(partition)
        fresh, next_offset = self._batch(partition, list(messages), shard)
        new = _copy(shard)
        dead: list[DeadLetterItem] = []
        units: set[int] = set()
        counted = 0
        items_touched = False
        for offset, raw in fresh:
            try:
                b = self.parse_batch(offset, raw, dead)
                if b is None:
                    continue
                if b.unit >= self.catalog.n_units:
                    raise ValueError(f"batch: unknown unit {b.unit}")
                if b.seq <= new.seqs.get(b.unit, 0):
                    raise ValueError(f"batch: repeated batch {b.seq} of unit {b.unit} (latest {new.seqs[b.unit]})")
                X = np.stack([self.context(i) for i in b.items])
                if self.config.codewords:
                    if b.messages and max(b.messages) > self.config.codewords:
                        raise ValueError(f"batch: msgs must be codeword indices up to {self.config.codewords} (the "
                                         f"dummy)")
                elif b.messages and self.items is None:
                    raise ValueError("batch: item messages, but this namespace has no item reports")
                elif b.messages and max(b.messages) >= self.items.n_items:  # type: ignore[union-attr]
                    raise ValueError(f"batch: msgs must be catalog rows below {self.items.n_items}")  # type: ignore[union-attr]
            except (ValueError, UnknownArmError) as e:
                dead.append(DeadLetterItem(offset, raw, f"shuffled batch: {e}"))
                continue
            per_item: tuple[np.ndarray, float] | None = None  # the batch's item sums and their public variance
            if self.config.codewords:  # the listens: b = sum_c (h_c - n p) codeword_c (models.local.policy)
                assert self.codebook is not None
                real = np.asarray([m for m in b.messages if m < self.config.codewords], dtype=np.int64)  # no dummies
                est = self.codes.estimate(self.codes.histogram(real), b.n)
                new.stats.b[b.unit] += est @ self.codebook
                new.var[b.unit] += self.codes.variance(b.n) * self.code_var
                if self.item_term:  # codeword c is catalog row c: the same estimate, per item
                    per_item = (est, self.codes.variance(b.n))
            elif b.messages and self.items is not None:
                per_item = (self.items.estimate(self.items.histogram(np.asarray(b.messages)), b.n),
                            self.items.variance(b.n))
            if per_item is not None:
                new.items = per_item[0].copy() if new.items is None else new.items + per_item[0]
                new.items_var += per_item[1]
                new.items_n += b.n
                items_touched = True
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
        batch.item_batches = items_touched  # type: ignore[attr-defined]
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
        item_sums: np.ndarray | None = None
        item_var, item_n = 0.0, 0
        for p in range(self.settings.partitions):
            self._reader.forget(p)
            shard = self._reader.shard(p)
            stats.gram += shard.stats.gram
            stats.b += shard.stats.b
            stats.count += shard.stats.count
            var += shard.var
            offsets.append(0 if shard.offset is None else shard.offset)
            if shard.items is not None:
                item_sums = shard.items.copy() if item_sums is None else item_sums + shard.items
                item_var, item_n = item_var + shard.items_var, item_n + shard.items_n
        if self.config.codewords:  # population-wide batches: every unit serves the population's model (count: as counted)
            stats.gram[:], stats.b[:], var[:] = stats.gram.sum(axis=0), stats.b.sum(axis=0), var.sum()
        last = self.client.hget(self.store.keys.pending, "count")
        if not force and last is not None and int(last) == int(stats.count.sum()):
            return None
        version = self.store.pending_version() + 1
        b_tilde = stats.b.reshape(-1).copy() if self.structure == "linucb" else (self.V @ stats.b).reshape(-1)
        released = ReleasedStats(self.structure, self.V, stats.gram, b_tilde, stats.count, version, NoNoiseEvent(),
                                 unit_noise_std(var, None if self.structure == "linucb" else self.V))
        event = json.dumps(event_to_dict(NoNoiseEvent()))  # the server spends nothing: the devices add the noise
        # the item term: the sums of the item reports' estimates, released as they are (the devices added the noise)
        items = None if item_sums is None else (None, ReleasedItems(item_sums, total=item_n,
                                                                    noise_std=float(np.sqrt(item_var))).to_mapping())
        self.store.persist_release(None, released, event, offsets, items=items)
        self.store.publish()
        return version


# ---------------------------------------------------------------------------------------------- shuffler

class ShufflerTask:
    """``ldp-reports`` → ``ldp-shuffled``: one report per distinct user per unit batch, stripped and shuffled.

    State (open batches, each user's latest version, the next offset of every partition, and an
    *outbox* of completed batches) is one Redis value. Completed batches are saved in the outbox with
    the state that produced them *before* they are sent, then sent, then the outbox is cleared: after a
    crash the outbox is sent again as it was (the aggregate drops a batch whose sequence number it has
    counted), and the reports after the saved offsets are read again. One shuffler per namespace: a
    worker without the analyzer's key runs it (``privrec up`` runs the separate shuffler service instead, so
    its workers, analyzers only, may be several). At user level it checks each report's cap, epoch and
    budget as the report ingest does (:func:`check_user_level`; the ledger is part of its state) and mirrors
    the ledger to the public keys after each save; at every level it mirrors each user's count of accepted reports
    to the public ``ledger_users`` hash (``/budget?user=``'s ``interactions``: the analyzer's batches name no user).
    """

    def __init__(self, client: redis.Redis, settings: Settings, catalog: Catalog, config: LocalConfig) -> None:
        self.r, self.settings, self.catalog, self.config = client, settings, catalog, config
        ns = settings.namespace
        self.key = f"{ns}:shuffle:{{{ns}:shuffle}}:state"
        self.shuffler = Shuffler(config)
        self.versions: dict[str, int] = {}
        #: User level: each user's ledger record (epoch, reports in it, last version), checked before a batch.
        self.ledger: dict[str, LedgerRecord] = {}
        #: Reports accepted per user (every level), mirrored to the public ``ledger_users`` after a save.
        self.accepted: dict[str, int] = {}
        self.offsets: dict[int, int] = {}
        self.outbox: list[bytes] = []
        self.clock: Callable[[], float] = time.time
        #: The public ledger's writes since the last save: records per partition, refused counts per partition.
        self._mirror: dict[int, dict[str, str]] = {}
        self._refused: dict[int, Counter[str]] = {}
        self._counted: set[str] = set()
        self._load()

    def _load(self) -> None:
        raw = self.r.get(self.key)
        if raw is None:
            return
        data = json.loads(raw)
        self.versions = {k: int(v) for k, v in data["versions"].items()}
        self.ledger = {k: LedgerRecord(**v) for k, v in data.get("ledger", {}).items()}
        self.accepted = {k: int(v) for k, v in data.get("accepted", {}).items()}
        self.offsets = {int(k): int(v) for k, v in data["offsets"].items()}
        self.shuffler.seq = {int(k): int(v) for k, v in data["seq"].items()}
        self.outbox = [b.encode() for b in data.get("outbox", [])]
        msgs = data.get("messages", {})
        for unit, reps in data["open"].items():
            for body in reps:
                rep = parse_report(body, d=self.config.d)
                self.shuffler.add(rep, unit=int(unit), messages=msgs.get(unit, {}).get(f"{rep.user}\n{rep.version}", ()))

    def save(self) -> None:
        state = self.shuffler.state()
        ledger = {u: json.loads(rec.dumps()) for u, rec in self.ledger.items()}
        self.r.set(self.key, json.dumps({"versions": self.versions, "offsets": self.offsets, "seq": state["seq"],
                                         "open": state["open"], "messages": state["messages"],
                                         "outbox": [b.decode() for b in self.outbox],
                                         "ledger": ledger, "accepted": self.accepted}))
        if self._mirror or self._refused or self._counted:  # then the public mirror (as the report ingest writes it)
            keys = PublicKeys(self.settings.namespace)
            with self.r.pipeline(transaction=False) as pipe:
                for p, records in self._mirror.items():
                    pipe.hset(keys.ledger_participation(p), mapping=records)
                for p, counts in self._refused.items():
                    for name, count in counts.items():
                        pipe.hincrby(keys.ledger_summary(p), name, count)
                for user in self._counted:  # absolute counts: a lost mirror heals at the user's next report
                    pipe.hset(keys.ledger_users(partition_of(user, self.settings.partitions)), user,
                              self.accepted[user])
                pipe.execute()
            self._mirror, self._refused, self._counted = {}, {}, set()

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
                check_messages(self.config, rep.messages)
                if self.config.codewords:
                    unit = POPULATION  # population-wide batches: distinct users of every unit
                if rep.version <= self.versions.get(rep.user, 0):
                    raise StaleReport(f"stale or repeated version {rep.version} of user {rep.user!r} "
                                      f"(latest {self.versions[rep.user]})")
                if self.config.user_level:  # the cap and the budget, as the report ingest checks them
                    self.ledger[rep.user] = check_user_level(self.config, self.ledger, rep, self.clock())
                    self._mirror.setdefault(partition, {})[rep.user] = self.ledger[rep.user].dumps()
            except BeyondLimit as e:
                dead.append(DeadLetterItem(offset, raw, f"local report: {e}"))
                self._refused.setdefault(partition, Counter())[e.counter] += 1
                continue
            except (ReportError, StaleReport, UnknownUserError, UnknownArmError) as e:
                dead.append(DeadLetterItem(offset, raw, f"local report: {e}"))
                continue
            self.versions[rep.user] = rep.version
            self.accepted[rep.user] = self.accepted.get(rep.user, 0) + 1
            self._counted.add(rep.user)
            out += self.shuffler.add(rep, unit=unit, messages=rep.messages)
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
    key = analyzer_key()  # a separate shuffler: this worker is the analyzer, holding the key that opens reports
    codebook = catalog_codebook(catalog, config.codewords, bool(settings.local_item_term)) if config.codewords else None
    processor: _LocalIngestBase = (BatchIngestProcessor(client, settings.namespace, catalog, config, key,
                                                        codebook=codebook, item_term=bool(settings.local_item_term))
                                   if settings.shuffle_batch else
                                   ReportIngestProcessor(client, settings.namespace, catalog, config))
    agents.register(app, settings, catalog, topic=report_topic(settings), metrics=metrics, metrics_url=metrics_url,
                    processor=processor)
    if settings.shuffle_batch and key is None:  # else the shuffler is its own service (pipeline.modes.local.shuffler_service)
        @app.task
        async def shuffle_task() -> None:
            await shuffle_loop(settings, catalog)

    timers.register(app, settings, catalog, metrics, release=LocalReleaseStage)


