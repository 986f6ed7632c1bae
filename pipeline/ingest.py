"""The ingest stage: validate events and fold them into exact statistics, idempotently.

Events of one partition are processed in offset order. Each batch becomes a
:class:`PreparedBatch` (parse, skip already-counted offsets, add to a copy of
the partition's statistics), its dead letters are sent, then it is committed
with one Lua script that writes the touched units' statistics together with
the partition's next offset, **only if the stored offset is still the one the
batch started from** (:data:`pipeline.trusted.INGEST_SCRIPT`). A redelivered
event therefore lands below the stored offset and is skipped; a stale owner
of a partition after a rebalance loses the compare and reloads.

This class holds no faust state and is tested without a broker; the faust
agent in :mod:`pipeline.app` only feeds it ``(offset, bytes)`` pairs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import redis

from models.streaming import UnitStats

from .catalog import Catalog
from .records import MalformedEvent, parse_batch, parse_interaction
from .trusted import TrustedStore

__all__ = ["IngestProcessor", "PreparedBatch", "DeadLetterItem"]


@dataclass(frozen=True)
class DeadLetterItem:
    offset: int
    raw: bytes
    reason: str


@dataclass
class PreparedBatch:
    """One partition's batch, parsed and applied to a copy of its statistics, not yet committed."""

    partition: int
    expected_offset: int | None
    next_offset: int
    stats: UnitStats
    units: np.ndarray
    counted: int
    duplicates: int
    dead: list[DeadLetterItem] = field(default_factory=list)
    users: dict[str, int] = field(default_factory=dict)
    items: np.ndarray | None = None                           # the partition's item sums after the batch
    touched_items: dict[int, float] = field(default_factory=dict)  # item -> new exact sum

    @property
    def reasons(self) -> dict[str, int]:
        return dict(Counter(_reason_class(d.reason) for d in self.dead))


def _reason_class(reason: str) -> str:
    """A short, bounded label for counting (the full reason goes to the dead letter)."""
    for key in ("not JSON", "not a JSON object", "missing field", "must be a non-empty string", "reward must be",
                "not finite", "outside [0, 1]", "unknown user", "unknown arm", "context has", "context must",
                "ts must"):
        if key in reason:
            return key
    return "other"


class IngestProcessor:
    """Exact statistics per partition, cached in memory and mirrored in Redis.

    With ``item_sums`` the partition also keeps each catalog item's exact reward sum (feedback and
    listens alike: the item term's statistic). An organic listen (``"kind": "listen"``) enters the
    bandit statistic with weight ``listen_weight`` (context and reward scaled by its square root).
    """

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, *, item_sums: bool = False,
                 listen_weight: float = 1.0) -> None:
        self.store = TrustedStore(client, namespace)
        self.catalog = catalog
        self.n_items = len(catalog.feature_matrix) if item_sums else 0
        self.listen_scale = float(np.sqrt(listen_weight))
        self._shards: dict[int, tuple[UnitStats, np.ndarray, int | None]] = {}

    def forget(self, partition: int) -> None:
        """Drop the cached state of a partition (e.g. when it is revoked)."""
        self._shards.pop(partition, None)

    def _shard(self, partition: int) -> tuple[UnitStats, np.ndarray, int | None]:
        hit = self._shards.get(partition)
        if hit is None:
            hit = self.store.load_partition_items(partition, self.catalog.n_units, self.catalog.d, self.n_items)
            self._shards[partition] = hit
        return hit

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> PreparedBatch:
        """Parse ``(offset, value)`` messages of one partition and apply them to a copy of its statistics."""
        stats, items, stored = self._shard(partition)
        msgs = sorted(messages, key=lambda m: m[0])
        fresh = [(o, v) for o, v in msgs if stored is None or o >= stored]
        parsed = parse_batch([v for _, v in fresh], self.catalog)
        dead = [DeadLetterItem(fresh[i][0], fresh[i][1], reason) for i, reason in parsed.dead]
        users = Counter(parsed.users)
        new = stats.copy()
        u_arr = parsed.units
        X, r = parsed.contexts, parsed.rewards
        if parsed.listens.any() and self.listen_scale != 1.0:  # a listen is a weighted sample of the bandit
            scale = np.where(parsed.listens, self.listen_scale, 1.0)
            X, r = X * scale[:, None], r * scale
        if len(u_arr):
            new.add(u_arr, X, r)
        new_items, touched = items, {}
        if self.n_items and len(u_arr):
            known = parsed.items >= 0
            new_items = items.copy()
            np.add.at(new_items, parsed.items[known], parsed.rewards[known])  # unbuffered, in event order
            touched = {int(a): float(new_items[a]) for a in np.unique(parsed.items[known])}
        next_offset = (fresh[-1][0] + 1) if fresh else (stored if stored is not None else 0)
        return PreparedBatch(partition, stored, next_offset, new, u_arr, len(u_arr), len(msgs) - len(fresh), dead,
                             dict(users), new_items, touched)

    def commit(self, batch: PreparedBatch) -> bool:
        """Write the batch atomically; on a lost compare, reload the partition and return ``False``."""
        if batch.expected_offset is not None and batch.next_offset == batch.expected_offset:
            return True  # nothing new
        ok = self.store.commit_partition(batch.partition, batch.stats, batch.units, batch.expected_offset,
                                         batch.next_offset, batch.reasons, batch.users, batch.touched_items)
        if ok:
            items = batch.items if batch.items is not None else np.zeros(self.n_items)
            self._shards[batch.partition] = (batch.stats, items, batch.next_offset)
        else:
            self.forget(batch.partition)
        return ok

    def process(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> PreparedBatch:
        """``prepare`` + ``commit``, retrying once after a lost compare (for callers without dead-letter I/O)."""
        batch = self.prepare(partition, messages)
        if not self.commit(batch):
            batch = self.prepare(partition, messages)
            if not self.commit(batch):
                raise RuntimeError(f"partition {partition}: offset changed twice under us; another worker owns it")
        return batch
