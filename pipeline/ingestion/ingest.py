"""The ingest stage: validate events and fold them into exact statistics, idempotently.

Events of one partition are processed in offset order. Each batch becomes a
:class:`PreparedBatch` (parse, skip already-counted offsets, add to a copy of
the partition's statistics), its dead letters are sent, then it is committed
with one Lua script that writes the touched units' statistics together with
the partition's next offset, **only if the stored offset is still the one the
batch started from** (:data:`pipeline.state.trusted.INGEST_SCRIPT`). A redelivered
event therefore lands below the stored offset and is skipped; a stale owner
of a partition after a rebalance loses the compare and reloads.

This class holds no faust state and is tested without a broker; the faust
agent in :mod:`pipeline.apps.worker_app` only feeds it ``(offset, bytes)`` pairs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import redis

from models.mechanisms.participation import B_CLIP, ITEM_CLIP
from models.streaming import UnitStats

from ..data.catalog import Catalog, item_capacity
from ..data.records import MalformedEvent, ParsedBatch, parse_batch, parse_interaction
from .shown_lists import REASON_PREFIXES, ShownListCheck
from ..state.trusted import TrustedStore
from ..state.userlevel import PENDING_SCRIPT, Contribution, UserLevelKeys, decode_contribution, encode_contribution

__all__ = ["IngestProcessor", "UserIngestProcessor", "PreparedBatch", "DeadLetterItem", "OffsetGap", "fresh_messages"]


class OffsetGap(RuntimeError):
    """A batch does not continue from the stored offset (e.g. Redis came back from its AOF with an older
    state): committing it would skip events. The caller seeks the partition back to ``stored``."""

    def __init__(self, partition: int, stored: int, first: int) -> None:
        super().__init__(f"partition {partition}: the batch starts at offset {first}, the stored offset is {stored}")
        self.partition, self.stored, self.first = partition, stored, first


def fresh_messages(partition: int, messages: Sequence[tuple[int, bytes]], stored: int | None
                   ) -> list[tuple[int, bytes]]:
    """The messages at or after the stored offset, in offset order; :class:`OffsetGap` if they start after it
    (the topics here have contiguous offsets: no compaction, no transactions)."""
    fresh = [(o, v) for o, v in sorted(messages, key=lambda m: m[0]) if stored is None or o >= stored]
    if fresh and stored is not None and fresh[0][0] > stored:
        raise OffsetGap(partition, stored, fresh[0][0])
    return fresh


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
    for key in (*REASON_PREFIXES, "not JSON", "not a JSON object", "missing field", "must be a non-empty string", "reward must be",
                "not finite", "outside [0, 1]", "unknown user", "unknown arm", "context has", "context must",
                "ts must", "partition mismatch", "shown"):
        if key in reason:
            return key
    return "other"


class IngestProcessor:
    """Exact statistics per partition, cached in memory and mirrored in Redis.

    With ``item_sums`` the partition also keeps each catalog item's exact reward sum (feedback and
    listens alike: the item term's statistic). An organic listen (``"kind": "listen"``) enters the
    reward statistic ``b`` with weight ``listen_weight`` and never the Gram matrix (its item is the
    user's choice); a feedback's Gram rows are the items its list showed (:func:`parse_batch`).

    Event level, each event's contribution is clipped here: its ``r x`` to norm ``b_clip``, its item
    reward to ``item_clip``, so that two events that *replace* each other (another reward, another
    choice) move ``b`` by at most ``2 b_clip`` and the item sums by ``sqrt(2) item_clip``, the
    sensitivities the release is calibrated to (:func:`models.mechanisms.participation.replace_sensitivity`).
    At user level (:class:`UserIngestProcessor`) the fold clips each user's tick instead.

    ``partitions``: the partition count of the topic; an event whose user belongs to another partition
    than the one it arrived on is dead-lettered (:func:`pipeline.data.records.partition_of`).

    ``shown``: the check of each feedback's list against the one the server recorded for its ``rec_id``
    (:mod:`pipeline.ingestion.shown_lists`); the worker's processor always has one
    (:func:`pipeline.ingestion.agents.make_processor`). ``None`` counts events as they come, for tests of the
    statistics alone.
    """

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, *, item_sums: bool = False,
                 listen_weight: float = 1.0, b_clip: float = B_CLIP, item_clip: float = ITEM_CLIP,
                 partitions: int | None = None, shown: ShownListCheck | None = None) -> None:
        self.store = TrustedStore(client, namespace)
        self.catalog = catalog
        self.n_items = item_capacity(catalog) if item_sums else 0
        self.listen_weight = float(listen_weight)
        self.b_clip, self.item_clip, self.partitions = float(b_clip), float(item_clip), partitions
        self.shown = shown
        self._shards: dict[int, tuple[UnitStats, np.ndarray, int | None]] = {}

    def parse(self, partition: int, raws: list[bytes]) -> ParsedBatch:
        """:func:`parse_batch` with this processor's partition check, then the shown-list check of the valid events
        (one ``MGET`` per batch). A refused event is parsed out again, so the batch's arrays hold only the
        accepted ones; ``dead`` holds every refusal, in event order."""
        kw = {"partition": partition if self.partitions else None, "partitions": self.partitions}
        parsed = parse_batch(raws, self.catalog, **kw)
        if self.shown is None:
            return parsed
        refused = self.shown.refusals(parsed.decoded)
        if not refused:
            return parsed
        out = {i for i, _ in refused}  # (rare: a forged or stale event) parse the accepted rest again
        keep = [i for i, _ in parsed.decoded if i not in out]
        again = parse_batch([raws[i] for i in keep], self.catalog, **kw)
        return again._replace(dead=sorted(parsed.dead + refused + [(keep[j], r) for j, r in again.dead]),
                              decoded=[(keep[j], obj) for j, obj in again.decoded])

    def reward_weights(self, parsed: ParsedBatch) -> np.ndarray:
        """Each event's weight in ``b``: ``r``, and ``listen_weight * r`` for a listen."""
        if not parsed.listens.any() or self.listen_weight == 1.0:
            return parsed.rewards
        return np.where(parsed.listens, self.listen_weight * parsed.rewards, parsed.rewards)

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
        fresh = fresh_messages(partition, msgs, stored)
        parsed = self.parse(partition, [v for _, v in fresh])
        dead = [DeadLetterItem(fresh[i][0], fresh[i][1], reason) for i, reason in parsed.dead]
        users = Counter(parsed.users)
        new = stats.copy()
        u_arr = parsed.units
        X = parsed.contexts
        r = self.reward_weights(parsed)
        # event level: each event's r x clipped to norm b_clip. Contexts are scaled to norm <= 1 by parse_batch (up to
        # one rounding), so with b_clip = 1 nothing is clipped; the relative slack keeps such a context's r x as it
        # is (bit for bit: the offline computation and the restored statistics agree exactly)
        norms = r * np.sqrt(np.einsum("ij,ij->i", X, X))
        over = norms > self.b_clip * (1.0 + 1e-12)
        if over.any():
            r = np.where(over, r * (self.b_clip / np.maximum(norms, 1e-300)), r)
        if len(u_arr):
            if parsed.gram_contexts is X:  # every event's own context is its Gram row (no list, no listen)
                new.add(u_arr, X, r)
            else:
                new.add_parts(u_arr, X, r, u_arr[parsed.gram_events], parsed.gram_contexts)
        new_items, touched = items, {}
        if self.n_items and len(u_arr):
            known = (parsed.items >= 0) & (parsed.items < self.n_items)  # an item beyond the capacity: no sum
            new_items = items.copy()
            # each event's item reward clipped to item_clip; unbuffered, in event order
            np.add.at(new_items, parsed.items[known], np.minimum(parsed.rewards[known], self.item_clip))
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


class UserIngestProcessor(IngestProcessor):
    """Ingest at user level: each user's events of the open tick accumulate in the partition's pending hash.

    Nothing reaches the unit statistics here: the release tick folds the pending contributions, clipped
    per user and capped (:mod:`pipeline.state.userlevel`). The commit checks the stored offset *and* the
    partition's fold generation, so a batch prepared against contributions that a fold has consumed
    is redone from Redis.

    ``unit_stats``: whether each user's contribution carries the flat model's per-unit statistics (the Gram of the
    shown lists and ``b``); ``False`` for ``--model hierarchy``, whose release reads only each user's unit, count and
    item rewards (:func:`models.streaming.hierarchy.add_contribution`), so that per event the worker computes and
    stores no ``d x d`` block.
    """

    #: (the default: a processor built without the constructor, as unit tests of the fold do, keeps them)
    unit_stats: bool = True

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, *, item_sums: bool = False,
                 listen_weight: float = 1.0, b_clip: float = B_CLIP, item_clip: float = ITEM_CLIP,
                 partitions: int | None = None, shown: ShownListCheck | None = None, unit_stats: bool = True) -> None:
        super().__init__(client, namespace, catalog, item_sums=item_sums, listen_weight=listen_weight,
                         b_clip=b_clip, item_clip=item_clip, partitions=partitions, shown=shown)
        self.unit_stats = bool(unit_stats)
        self.client = client
        self.namespace = namespace
        self._pending_script = client.register_script(PENDING_SCRIPT)
        self._users: dict[int, tuple[dict[str, Contribution], int, int | None]] = {}
        #: per partition, the last batch's parse, under its (first offset, last offset, events): a batch redone after
        #: a fold took the pending contributions (every tick) is not parsed again (a partition's log is immutable)
        self._parsed: dict[int, tuple[tuple[int, int, int], ParsedBatch]] = {}

    def forget(self, partition: int) -> None:
        super().forget(partition)
        self._users.pop(partition, None)
        self._parsed.pop(partition, None)

    def _parse_once(self, partition: int, fresh: list[tuple[int, bytes]]) -> ParsedBatch:
        """:meth:`parse` of ``fresh``, or the parse of the same offsets kept from the batch's first attempt."""
        span = (fresh[0][0], fresh[-1][0], len(fresh)) if fresh else (0, -1, 0)
        hit = self._parsed.get(partition)
        if hit is not None and hit[0] == span:
            return hit[1]
        parsed = self.parse(partition, [v for _, v in fresh])
        self._parsed[partition] = (span, parsed)
        return parsed

    def _pending(self, partition: int) -> tuple[dict[str, Contribution], int, int | None]:
        hit = self._users.get(partition)
        if hit is None:
            keys = UserLevelKeys(self.namespace, partition)
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys.pending)
                pipe.get(keys.foldgen)
                pipe.get(self.store.keys.offset(partition))
                raw, gen, off = pipe.execute()
            d = self.catalog.d
            pending = {k.decode()[2:]: decode_contribution(v, d) for k, v in raw.items()}
            hit = (pending, int(gen or 0), None if off is None else int(off))
            self._users[partition] = hit
        return hit

    def prepare(self, partition: int, messages: Sequence[tuple[int, bytes]]) -> PreparedBatch:
        pending, gen, stored = self._pending(partition)
        msgs = sorted(messages, key=lambda m: m[0])
        fresh = fresh_messages(partition, msgs, stored)
        parsed = self._parse_once(partition, fresh)
        dead = [DeadLetterItem(fresh[i][0], fresh[i][1], reason) for i, reason in parsed.dead]
        d = self.catalog.d
        touched = set(parsed.users)
        # the committed state stays as it is until the commit succeeds: the batch works on copies of its own users'
        # contributions only (their arrays are replaced, never written in place, by _fold_users); the commit then
        # puts them into the committed dict, so a batch costs its users, not every pending user of the partition
        work: dict[str, Contribution] = {}
        for u in touched:
            c = pending.get(u)
            if c is not None:
                work[u] = Contribution(c.unit, c.count, c.gram, c.b, dict(c.items))
        self._fold_users(work, parsed, d)
        next_offset = (fresh[-1][0] + 1) if fresh else (stored if stored is not None else 0)
        batch = PreparedBatch(partition, stored, next_offset, UnitStats.zeros(n_units=1, d=d), parsed.units,
                              len(parsed.units), len(msgs) - len(fresh), dead, dict(Counter(parsed.users)))
        batch.pending = {u: work[u] for u in touched}  # type: ignore[attr-defined]
        batch.foldgen = gen  # type: ignore[attr-defined]
        batch.base = pending  # type: ignore[attr-defined]  # the committed contributions it was prepared against
        return batch

    def _fold_users(self, work: dict[str, Contribution], parsed: ParsedBatch, d: int) -> None:
        """Add each event to its user's open contribution: per user of the batch, one product
        ``gram += G_u^T G_u`` over the user's Gram rows (the shown items, :func:`parse_batch`),
        ``b += X_u^T r_u`` (listens weighted by ``listen_weight``; equal to adding the events one at a time up to
        rounding; the user-level sums are clipped and noised per tick, and nothing compares them bit for bit).

        A contribution's ``gram`` and ``b`` are replaced by new arrays, never written in place (``prepare``
        shares them with the committed state). Without :attr:`unit_stats`, only the counts and item rewards."""
        n = len(parsed.users)
        if not n:
            return
        if not self.unit_stats:
            for user, unit in zip(parsed.users, parsed.units.tolist()):
                c = work.get(user)
                if c is None:
                    c = work[user] = Contribution.empty(unit, d, unit_stats=False)
                c.count += 1
            self._fold_items(work, parsed)
            return
        X = parsed.contexts
        rb = self.reward_weights(parsed)
        local: dict[str, int] = {}
        ids = np.fromiter((local.setdefault(u, len(local)) for u in parsed.users), dtype=np.int64, count=n)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        ends = np.r_[starts[1:], n]
        names = list(local)
        own = parsed.gram_contexts is X
        if not own:  # the Gram rows of each user: rows of the user's events
            row_user = ids[parsed.gram_events]
            row_order = np.argsort(row_user, kind="stable")
            row_ids = row_user[row_order]
        for s, e in zip(starts.tolist(), ends.tolist()):
            rows = order[s:e]
            uid = int(sorted_ids[s])
            user = names[uid]
            c = work.get(user)
            if c is None:
                c = work[user] = Contribution.empty(int(parsed.units[rows[0]]), d)
            Xu = X[rows]
            if own:
                Gu = Xu
            else:
                lo, hi = np.searchsorted(row_ids, [uid, uid + 1])
                Gu = parsed.gram_contexts[row_order[lo:hi]]
            c.gram = c.gram + Gu.T @ Gu
            c.b = c.b + rb[rows] @ Xu
            c.count += e - s
        self._fold_items(work, parsed)

    def _fold_items(self, work: dict[str, Contribution], parsed: ParsedBatch) -> None:
        """Add each event's item reward to its user's contribution (every user of the batch is in ``work``)."""
        if not self.n_items:
            return
        n_items = self.n_items
        # the item sums take the unscaled reward (Python ints and floats: no numpy scalar per event)
        for user, a, r in zip(parsed.users, parsed.items.tolist(), parsed.rewards.tolist()):
            if 0 <= a < n_items:
                c = work[user]
                c.items[a] = c.items.get(a, 0.0) + r

    def commit(self, batch: PreparedBatch) -> bool:
        if batch.expected_offset is not None and batch.next_offset == batch.expected_offset:
            return True
        keys = UserLevelKeys(self.namespace, batch.partition)
        args: list[object] = ["" if batch.expected_offset is None else str(batch.expected_offset),
                              str(batch.next_offset), str(batch.foldgen)]  # type: ignore[attr-defined]
        fields: list[object] = []
        for user, c in batch.pending.items():  # type: ignore[attr-defined]
            fields += [f"u:{user}", encode_contribution(c)]
        args.append(len(fields) // 2)
        args += fields
        reasons = batch.reasons
        args.append(len(reasons))
        for reason, count in reasons.items():
            args += [reason[:200], count]
        for user, count in batch.users.items():
            args += [user, count]
        ok = bool(self._pending_script(keys=[self.store.keys.offset(batch.partition), keys.pending,
                                             self.store.keys.deadletters(batch.partition),
                                             self.store.keys.user_counts(batch.partition), keys.foldgen],
                                       args=args))
        if ok:
            base: dict[str, Contribution] = batch.base  # type: ignore[attr-defined]
            base.update(batch.pending)  # type: ignore[attr-defined]
            self._users[batch.partition] = (base, batch.foldgen, batch.next_offset)  # type: ignore[attr-defined]
            self._parsed.pop(batch.partition, None)
        else:  # the offset moved (another owner) or a fold consumed pending contributions: reload (the parse is kept)
            IngestProcessor.forget(self, batch.partition)
            self._users.pop(batch.partition, None)
        return ok
