"""Local mode's ingest: thin adapters from Kafka messages to the analyzer's fold, and its shards in Redis.

Each partition's shard is one :class:`models.local.analyzer.AnalyzerState`, stored field by field in the hash where
the global mode's exact statistics live (``{ns}:trusted:…``; in local mode it holds only sums of noisy reports)
with the partition's next offset. An adapter decodes a batch of messages (a malformed message → ``dead-letters``
with the reason), runs :meth:`models.local.analyzer.Analyzer.step` — the fold the offline twin runs — and commits
the new state's touched fields with the next offset in one Lua script (the global mode's
:data:`pipeline.state.trusted.INGEST_SCRIPT`): a report is never counted twice.

* :class:`ReportIngestProcessor`: ``ldp-reports`` (no shuffler); for ``tree`` a user's new noisy running sum
  *replaces* their previous one, for ``round`` every report adds. At user level the fold also checks what the
  device promised, never trusting it (:func:`models.local.analyzer.check_user_level`: the epoch, the cap per epoch,
  the lifetime budget's report limit); each user's ledger record is committed with the sums (field ``e:<user>``),
  then mirrored to the public ledger keys that ``/budget`` and the dashboard read, with the refused counts
  (``dropped``, ``over_budget``) — the same keys and counters as the global mode's fold.
* :class:`BatchIngestProcessor`: ``ldp-shuffled``, the batches of the shuffler service
  (:mod:`pipeline.modes.local.shuffler_service`), opened with the analyzer's key when sealed
  (:func:`models.local.esa.open_batch`); a batch is counted once (its sequence number is stored with the sums).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import redis

from models.local import LocalConfig, ReportError, parse_report
from models.local.aggregate import clip_context
from models.local.analyzer import Analyzer, AnalyzerState, Batches, DeadLetter, Reports
from models.local.esa import is_sealed_batch, open_batch
from models.local.items import ItemBlanket
from models.local.seal import AnalyzerKey
from models.local.shuffle import ShuffledBatch
from models.streaming import UnitStats

from ...config.keys import PublicKeys
from ...config.settings import Settings
from ...data.catalog import Catalog, UnknownUserError
from ...data.records import TOPICS
from ...ingestion.ingest import DeadLetterItem, IngestProcessor, PreparedBatch, fresh_messages
from ...state.trusted import TrustedStore

__all__ = ["local_config", "report_topic", "read_shard", "LocalBatch", "LocalIngest", "ReportIngestProcessor",
           "BatchIngestProcessor"]


def local_config(settings: Settings, d: int) -> LocalConfig:
    """The namespace's public device calibration."""
    config: LocalConfig = settings.local_config(d)
    return config


def report_topic(settings: Settings) -> str:
    """The topic the analyzer consumes: the reports, or the shuffler's batches."""
    return TOPICS["ldp_shuffled"] if settings.shuffle_batch else TOPICS["ldp_reports"]


def read_shard(store: TrustedStore, partition: int, catalog: Catalog) -> tuple[AnalyzerState, int | None]:
    """A partition's analyzer state and next offset, read in one transaction."""
    raw, offset = store.read_partition(partition)
    return AnalyzerState.from_mapping(raw, n_units=catalog.n_units, d=catalog.d), offset


def catalog_contexts(catalog: Catalog) -> Callable[[Sequence[str]], np.ndarray]:
    """The analyzer's view of the catalog: items' clipped public contexts (``UnknownArmError``, a ``KeyError``)."""
    return lambda items: np.stack([clip_context(x) for x in catalog.features_of(list(items))])


@dataclass(kw_only=True)
class LocalBatch(PreparedBatch):
    """A prepared batch of local mode: the partition's new analyzer state and what of it to write."""

    state: AnalyzerState
    touched_units: set[int] = field(default_factory=set)
    touched_users: set[str] = field(default_factory=set)
    #: user level: refusals per public ledger counter (``dropped``, ``over_budget``)
    refused: Counter[str] = field(default_factory=Counter)
    #: whether the batch added to the item sums (then they are written)
    with_items: bool = False


class LocalIngest(IngestProcessor):
    """Shared by the report and the batch adapters: the shards (cached), the fold, the Lua commit, the mirror."""

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, analyzer: Analyzer) -> None:
        super().__init__(client, namespace, catalog)
        self.analyzer = analyzer
        self.config = analyzer.config
        self._local: dict[int, tuple[AnalyzerState, int | None]] = {}
        #: The server's clock (user level: which epochs a report may name).
        self.clock: Callable[[], float] = time.time

    def forget(self, partition: int) -> None:
        super().forget(partition)
        self._local.pop(partition, None)

    def shard(self, partition: int) -> tuple[AnalyzerState, int | None]:
        hit = self._local.get(partition)
        if hit is None:
            hit = self._local[partition] = read_shard(self.store, partition, self.catalog)
        return hit

    def fold(self, partition: int, messages: Sequence[tuple[int, bytes]],
             decode: Callable[[list[tuple[int, bytes]], list[DeadLetterItem]], Reports | Batches]) -> LocalBatch:
        """Decode the fresh messages (dead letters added), fold them, and say what changed."""
        state, offset = self.shard(partition)
        fresh = fresh_messages(partition, list(messages), offset)
        next_offset = (fresh[-1][0] + 1) if fresh else (offset if offset is not None else 0)
        dead: list[DeadLetterItem] = []
        decoded = decode(fresh, dead)
        new, refused = self.analyzer.step(state, decoded)
        raw = dict(fresh)
        dead += [DeadLetterItem(d.key, raw[d.key], d.reason) for d in refused]
        dead.sort(key=lambda item: item.offset)
        out = {d.key for d in refused}
        units: set[int] = set()
        users: Counter[str] = Counter()
        counted = 0
        if isinstance(decoded, Reports):
            for key, rep, unit in decoded.entries:
                if key not in out:
                    units.add(unit)
                    users[rep.user] += 1
            counted = sum(users.values())
        else:
            for key, b in decoded.entries:
                if key not in out:
                    units.add(b.unit)
                    counted += b.n
        return LocalBatch(partition, offset, next_offset, UnitStats(new.gram, new.b, new.count), np.array(sorted(units), dtype=np.int64),
                          counted, len(messages) - len(fresh), dead, dict(users), state=new, touched_units=units,
                          touched_users=set(users), refused=Counter(d.counter for d in refused if d.counter),
                          with_items=new.items is not state.items)

    def commit(self, batch: PreparedBatch) -> bool:
        if batch.expected_offset is not None and batch.next_offset == batch.expected_offset:
            return True
        assert isinstance(batch, LocalBatch), "local mode commits the batches it prepared"
        fields: list[object] = []
        for name, value in batch.state.to_mapping(batch.touched_units, batch.touched_users, batch.with_items).items():
            fields += [name, value]
        ok = self.store.commit_fields(batch.partition, fields, batch.expected_offset, batch.next_offset,
                                      batch.reasons, batch.users)
        if ok:
            self._local[batch.partition] = (batch.state, batch.next_offset)
            self._mirror_ledger(batch)
        else:
            self.forget(batch.partition)
        return ok

    def _mirror_ledger(self, batch: LocalBatch) -> None:
        """User level: the committed ledger records of the batch's users and its refused counts, to the public
        ledger keys (participations are public, DESIGN §2). After the commit: a crash in between leaves the
        mirror one batch behind until the user's next report (the trusted record decides, never the mirror)."""
        ledger = batch.state.ledger
        records = {u: ledger[u].dumps() for u in batch.touched_users if u in ledger}
        if not records and not batch.refused:
            return
        keys = PublicKeys(self.store.keys.ns)
        with self.store.r.pipeline(transaction=True) as pipe:
            if records:
                pipe.hset(keys.ledger_participation(batch.partition), mapping=records)
            for name, count in batch.refused.items():
                pipe.hincrby(keys.ledger_summary(batch.partition), name, count)
            pipe.execute()


class ReportIngestProcessor(LocalIngest):
    """``ldp-reports`` → per-unit sums of the reports, each user's latest version (and ``tree``: noisy sum)."""

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, config: LocalConfig) -> None:
        super().__init__(client, namespace, catalog,
                         Analyzer(config, catalog.n_units, catalog_contexts(catalog)))

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> LocalBatch:
        return self.fold(partition, messages, self._decode)

    def _decode(self, fresh: list[tuple[int, bytes]], dead: list[DeadLetterItem]) -> Reports:
        cfg = self.config
        entries = []
        for offset, raw in fresh:
            try:
                rep = parse_report(raw, d=cfg.d, algorithm=cfg.algorithm)
                entries.append((offset, rep, self.catalog.unit_of(rep.user)))
            except (ReportError, UnknownUserError) as e:
                dead.append(DeadLetterItem(offset, raw, f"local report: {e}"))
        return Reports(entries, now=self.clock())


class BatchIngestProcessor(LocalIngest):
    """``ldp-shuffled`` → per-unit sums; a batch whose sequence number was counted is a dead letter.

    With the shuffler service the batches are sealed: ``analyzer_key`` opens each content
    (:func:`models.local.esa.open_batch`); one that does not open is a dead letter (its sealed bytes and the
    reason), and then nothing of its batch counts (the shown items are not linked to the contents). ``items``,
    ``codebook`` and ``item_term``: see :class:`models.local.analyzer.Analyzer` (``item_blanket``, ``codebook``,
    ``item_term``); ``item_term`` needs one codeword per catalog item.
    """

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, config: LocalConfig,
                 analyzer_key: AnalyzerKey | None = None, items: ItemBlanket | None = None,
                 codebook: np.ndarray | None = None, item_term: bool = False) -> None:
        if item_term and not (config.codewords and config.codewords == len(catalog.feature_matrix)):
            raise ValueError(f"`item_term` needs one codeword per catalog item ({len(catalog.feature_matrix)}), got "
                             f"{config.codewords}")
        super().__init__(client, namespace, catalog, Analyzer(config, catalog.n_units, catalog_contexts(catalog),
                                                              codebook, items, item_term))
        self.analyzer_key = analyzer_key

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> LocalBatch:
        return self.fold(partition, messages, self._decode)

    def _decode(self, fresh: list[tuple[int, bytes]], dead: list[DeadLetterItem]) -> Batches:
        entries = []
        for offset, raw in fresh:
            try:
                batch = self.parse_batch(offset, raw, dead)
            except ValueError as e:
                dead.append(DeadLetterItem(offset, raw, f"shuffled batch: {e}"))
                continue
            if batch is not None:
                entries.append((offset, batch))
        return Batches(entries)

    def parse_batch(self, offset: int, raw: bytes, dead: list[DeadLetterItem]) -> ShuffledBatch | None:
        """The batch at ``offset`` (opened, if sealed); ``None`` when nothing of it counts (dead letters added)."""
        if not is_sealed_batch(raw):
            return ShuffledBatch.parse(raw, d=self.config.d)
        if self.analyzer_key is None:
            raise ValueError("a sealed batch, but this worker holds no analyzer key (PRIVREC_ANALYZER_KEY)")
        opened = open_batch(raw, self.analyzer_key, self.config)
        dead += [DeadLetterItem(offset, blob, reason) for blob, reason in opened.failed]
        return opened.batch
