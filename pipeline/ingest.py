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
    """Exact statistics per partition, cached in memory and mirrored in Redis."""

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog) -> None:
        self.store = TrustedStore(client, namespace)
        self.catalog = catalog
        self._shards: dict[int, tuple[UnitStats, int | None]] = {}

    def forget(self, partition: int) -> None:
        """Drop the cached state of a partition (e.g. when it is revoked)."""
        self._shards.pop(partition, None)

    def _shard(self, partition: int) -> tuple[UnitStats, int | None]:
        hit = self._shards.get(partition)
        if hit is None:
            hit = self.store.load_partition(partition, self.catalog.n_units, self.catalog.d)
            self._shards[partition] = hit
        return hit

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> PreparedBatch:
        """Parse ``(offset, value)`` messages of one partition and apply them to a copy of its statistics."""
        stats, stored = self._shard(partition)
        msgs = sorted(messages, key=lambda m: m[0])
        fresh = [(o, v) for o, v in msgs if stored is None or o >= stored]
        parsed = parse_batch([v for _, v in fresh], self.catalog)
        dead = [DeadLetterItem(fresh[i][0], fresh[i][1], reason) for i, reason in parsed.dead]
        users = Counter(parsed.users)
        new = stats.copy()
        u_arr = parsed.units
        if len(u_arr):
            new.add(u_arr, parsed.contexts, parsed.rewards)
        next_offset = (fresh[-1][0] + 1) if fresh else (stored if stored is not None else 0)
        return PreparedBatch(partition, stored, next_offset, new, u_arr, len(u_arr), len(msgs) - len(fresh), dead,
                             dict(users))

    def commit(self, batch: PreparedBatch) -> bool:
        """Write the batch atomically; on a lost compare, reload the partition and return ``False``."""
        if batch.expected_offset is not None and batch.next_offset == batch.expected_offset:
            return True  # nothing new
        ok = self.store.commit_partition(batch.partition, batch.stats, batch.units, batch.expected_offset,
                                         batch.next_offset, batch.reasons, batch.users)
        if ok:
            self._shards[batch.partition] = (batch.stats, batch.next_offset)
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
