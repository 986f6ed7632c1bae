"""User-level privacy in the pipeline: per-user tick contributions, clipping, the cap, the ledger.

With ``privacy_unit = user`` (the default), ingest does not add events to the unit statistics at
once. It accumulates each user's events of the current tick in the partition's *pending* hash
(``{ns}:trusted:{ns:p<P>}:pending``, field ``u:<user>``: the user's unit, count, Gram, ``b`` and item
rewards; with ``--model hierarchy`` no Gram and no ``b``: its release reads neither), atomically with the partition's offset (:data:`PENDING_SCRIPT`). At each release tick
every partition is *folded* (:meth:`Folder.fold_partition`, by the worker that owns the partition, the leader
waiting for all of them before it releases: :mod:`pipeline.state.foldround`): the fold takes the partition's pending hash (renamed
to the folding hash with the fold generation bumped, :data:`TAKE_SCRIPT`), so ingest goes on into a fresh pending
hash while the fold plans, then writes the plan in one transaction:

1. a user already folded into this release (their ledger's ``last_version``) waits for the next;
2. a user at the cap (``user_cap`` ticks in this epoch) is not learned from (``cap_policy =
   ignore``: the events are dropped from the statistics, counted in ``dropped``); nor is a user whose
   one more tick would take their spent budget past ``user_budget`` (:class:`~pipeline.config.ledger.LifetimeBudget`;
   counted in ``over_budget``);
3. otherwise (``--model hierarchy``) the user's tick is added to the partition's hierarchy vector
   (:func:`models.streaming.hierarchy.add_contribution`: their listens' mean context and item shares, weighted by
   ``min(1, total reward)``; the hierarchy's contributions carry no Gram and no ``b``, so only the count enters the
   unit statistics), and the user's ``b`` is clipped to norm ``b_clip`` and their item rewards to norm ``item_clip``
   (the sums of every event of the tick, so a user who clicks 50 times counts like one
   participation), added to the unit statistics (the Gram as it is: public — the items the user's
   answered lists showed, never the item they chose), and the user's ledger record counts one more
   participation. Two neighbouring streams (the same user, other rewards and choices) then differ by at
   most ``2 b_clip`` in ``b`` and ``sqrt(2) item_clip`` in the nonnegative item sums per tick: the
   sensitivities the release is calibrated to (defaults: clips 1 and 1, sensitivities 2 and sqrt(2)).

Taking the pending hash bumps the partition's *fold generation*; ingest's script checks it beside the offset, so
an ingest batch prepared against pending contributions that were taken meanwhile is redone from Redis (never
double-counted). A crash between partitions' folds or before the release leaves nothing half done: each
partition's fold writes atomically (a crash after the take leaves the folding hash, folded by the next fold), and
``last_version`` keeps a user to one fold per release.

The ledger (public: who arrived when is public, DESIGN §2): per user ``{"epoch", "k", "last_version",
"past"}`` in ``{ns}:ledger:{ns:p<P>}:participation`` (``past`` = the sum over closed epochs of
``B(k_e) / B(cap)``), and per partition counters in ``{ns}:ledger:{ns:p<P>}:summary``
(``at_cap:<epoch>``, ``dropped``, ``folded``, ``over_budget``), and how many users each record class holds in
``{ns}:ledger:{ns:p<P>}:classes`` (``epoch:k:past``, written by the fold in the same transaction as the records, so
the ledger's figures cost the few classes, not every user). A user's spent budget is ``mu_user = mu * sqrt(past +
B(k) / B(cap))`` (Gaussian DP composes over epochs; ``mu`` is what a capped user gets per epoch).
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis
from numpy.typing import NDArray

from models.accounting.ledger import LedgerColumns
from models.mechanisms.participation import B_CLIP, ITEM_CLIP, clip_scales
from models.streaming.hierarchy import HierarchyLayout, add_contributions, add_rows_in_order

from ..config.keys import PublicKeys
from ..config.ledger import LedgerRecord, LifetimeBudget, class_counts
from .trusted import TrustedKeys, offset_checked_writes

__all__ = ["PENDING_SCRIPT", "TAKE_SCRIPT", "FOLD_COUNTERS", "Fence", "FoldLockLost", "Contribution", "NO_UNIT_STATS", "encode_contribution", "decode_contribution",
           "Contributions", "decode_contributions", "merge_contributions", "Folder",
           "UserLevelKeys"]

#: Ingest (user level): write the touched users' pending contributions and the new offset atomically, if the
#: stored offset and fold generation are still the ones the batch was prepared against.
# KEYS[1] - offset key of the partition        KEYS[2] - pending hash of the partition
# KEYS[3] - dead-letter counts hash            KEYS[4] - per-user interaction counts (ledger)
# KEYS[5] - fold generation of the partition
# ARGV[1] - expected stored offset ("" if none)  ARGV[2] - new next offset  ARGV[3] - expected fold generation
# ARGV[4] - number of pending fields n; then n field/value pairs; then m dead-letter reason/count pairs after
#           their count; then user/count pairs to the end
# return 1 if applied, 0 if the offset or the fold generation differ (nothing written)
PENDING_SCRIPT = offset_checked_writes(4, check="""local gen = redis.call('GET', KEYS[5])
if gen == false then gen = '0' end
if gen ~= ARGV[3] then return 0 end
""")


#: The fold takes a partition's pending contributions: renames the pending hash to the folding hash and bumps the
#: fold generation, unless a folding hash is already there (a fold that did not finish: it is folded first).
# KEYS[1] - pending hash   KEYS[2] - folding hash   KEYS[3] - fold generation
# return 1 if a folding hash is there to fold, 0 if there is nothing to fold
TAKE_SCRIPT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('INCR', KEYS[3])
return 1
"""


@dataclass(frozen=True)
class UserLevelKeys:
    """The user-level keys of one partition (all in the partition's hash slot)."""

    ns: str
    partition: int

    def _key(self, kind: str, name: str) -> str:
        return f"{self.ns}:{kind}:{{{self.ns}:p{self.partition}}}:{name}"

    @property
    def pending(self) -> str:
        return self._key("trusted", "pending")

    @property
    def folding(self) -> str:
        """The contributions one fold took from :attr:`pending` (deleted when the fold is written)."""
        return self._key("trusted", "folding")

    @property
    def foldgen(self) -> str:
        return self._key("trusted", "foldgen")

    @property
    def fold_lock(self) -> str:
        """Who folds the partition now (a token, set with ``NX`` and an expiry: :mod:`pipeline.state.foldround`)."""
        return self._key("trusted", "foldlock")

    @property
    def folded(self) -> str:
        """The last fold round recorded for the partition and that fold's counters (``round``, ``summary``)."""
        return self._key("trusted", "folded")

    @property
    def participation(self) -> str:
        """Public ledger: per user, participations per epoch (``LedgerRecord`` JSON)."""
        return PublicKeys(self.ns).ledger_participation(self.partition)

    @property
    def classes(self) -> str:
        """Public ledger: users per class of their participation record (``epoch:k:past``)."""
        return PublicKeys(self.ns).ledger_classes(self.partition)

    @property
    def summary(self) -> str:
        """Public ledger: counters of the partition (``at_cap:<epoch>``, ``dropped``, ``folded``)."""
        return PublicKeys(self.ns).ledger_summary(self.partition)


#: What a partition's fold counts (:meth:`Folder.fold_partition`'s summary; a fold round sums them).
FOLD_COUNTERS = ("folded", "at_cap", "dropped", "waiting", "over_budget")


class FoldLockLost(RuntimeError):
    """A fold's partition lock expired and another fold holds it now: this fold wrote nothing."""


@dataclass(frozen=True)
class Fence:
    """A fold held under its partition's fold lock (:mod:`pipeline.state.foldround`): the lock's key and this fold's
    token, and the hash where the fold records its round and counters (in the fold's own transaction)."""

    lock: str
    token: bytes
    folded: str
    round: int

    def check(self, pipe: Any) -> None:
        """Raise :class:`FoldLockLost` unless the lock still holds this fold's token (``pipe`` watches the lock)."""
        if pipe.get(self.lock) != self.token:
            raise FoldLockLost(f"{self.lock}: the lock expired and changed hands; this fold wrote nothing")

    def mark(self, pipe: Any, summary: dict[str, int]) -> None:
        pipe.hset(self.folded, mapping={"round": self.round, "summary": json.dumps(summary, sort_keys=True)})


@dataclass
class Contribution:
    """One user's events of the open tick, before clipping (trusted).

    ``gram`` and ``b`` are the flat model's per-unit statistics (the shown lists' Gram, the reward-weighted contexts);
    ``None`` for ``--model hierarchy``, whose release reads only the unit, the count and the item rewards
    (:func:`models.streaming.hierarchy.add_contribution`): the worker then neither computes nor stores them.
    """

    unit: int
    count: int
    gram: np.ndarray | None   # (d, d)
    b: np.ndarray | None      # (d,)
    items: dict[int, float]

    @classmethod
    def empty(cls, unit: int, d: int, *, unit_stats: bool = True) -> Contribution:
        if not unit_stats:
            return cls(unit, 0, None, None, {})
        return cls(unit, 0, np.zeros((d, d)), np.zeros(d), {})


#: The first value of an encoded contribution without ``gram`` and ``b`` (a unit is never negative).
NO_UNIT_STATS = -1.0


def encode_contribution(c: Contribution) -> bytes:
    """``[unit, count, gram..., b..., n_items, (item, reward)...]`` as little-endian float64; without the
    statistics (``gram`` is ``None``) ``[-1, unit, count, n_items, (item, reward)...]`` (:data:`NO_UNIT_STATS`)."""
    items = sorted(c.items.items())
    if c.gram is None or c.b is None:  # a few values: struct, not numpy (the same bytes; per touched user and batch)
        values = [NO_UNIT_STATS, c.unit, c.count, len(items), *[v for pair in items for v in pair]]
        return struct.pack(f"<{len(values)}d", *values)
    tail = np.array([len(items), *[v for pair in items for v in pair]], dtype=np.float64)
    head = np.array([c.unit, c.count], dtype=np.float64)
    return np.concatenate([head, c.gram.reshape(-1), c.b, tail]).astype("<f8").tobytes()


def merge_contributions(a: Contribution, b: Contribution) -> Contribution:
    """One user's two contributions of the same tick as one (``a``'s events, then ``b``'s); without the statistics
    if either has none (one namespace's contributions all carry them, or none does: the model decides)."""
    items = dict(a.items)
    for item, value in b.items.items():
        items[item] = items.get(item, 0.0) + value
    if a.gram is None or b.gram is None or a.b is None or b.b is None:
        return Contribution(a.unit, a.count + b.count, None, None, items)
    return Contribution(a.unit, a.count + b.count, a.gram + b.gram, a.b + b.b, items)


def decode_contribution(raw: bytes, d: int) -> Contribution:
    """The inverse of :func:`encode_contribution` (either layout); ``ValueError`` if ``raw`` has not the length its
    layout and item count make for dimension ``d``."""
    a = np.frombuffer(raw, dtype="<f8")
    if len(a) and a[0] == NO_UNIT_STATS:
        stats, at = 0, 3
        unit, count = int(a[1]), int(a[2])
    else:
        stats, at = d * d + d, 2 + d * d + d
        unit, count = int(a[0]), int(a[1])
    n = int(a[at]) if len(a) > at else -1
    if n < 0 or len(a) != at + 1 + 2 * n:
        raise ValueError(f"a pending contribution of {len(a)} values is neither layout of encode_contribution "
                         f"for d = {d}")
    pairs = a[at + 1:at + 1 + 2 * n].tolist()  # Python floats: no numpy scalar per item
    items = {int(k): v for k, v in zip(pairs[::2], pairs[1::2])}
    if not stats:
        return Contribution(unit, count, None, None, items)
    return Contribution(unit, count, a[2:2 + d * d].reshape(d, d).copy(), a[2 + d * d:at].copy(), items)


@dataclass(frozen=True)
class Contributions:
    """Many users' contributions as arrays (:func:`decode_contributions`), user ``i`` of ``n`` in row ``i``.

    User ``i``'s items and their rewards are ``items[starts[i]:starts[i + 1]]`` and ``rewards[...]``, in the order
    :func:`decode_contribution` gives them; ``gram`` and ``b`` hold one row per user with the flat model's
    statistics (``stats_row[i]``: user ``i``'s row, ``-1`` for a contribution without them).
    """

    unit: NDArray[np.int64]
    count: NDArray[np.int64]
    starts: NDArray[np.int64]
    items: NDArray[np.int64]
    rewards: NDArray[np.float64]
    stats_row: NDArray[np.int64]
    gram: NDArray[np.float64]   # (users with statistics, d, d)
    b: NDArray[np.float64]      # (users with statistics, d)

    def take(self, rows: NDArray[np.int64]) -> Contributions:
        """The contributions of the users ``rows`` (increasing), in that order."""
        sizes = np.diff(self.starts)[rows]
        pairs = np.repeat(self.starts[rows], sizes) + _ranks(sizes)
        with_stats = self.stats_row[rows]
        kept = with_stats[with_stats >= 0]
        stats_row = np.full(len(rows), -1, dtype=np.int64)
        stats_row[with_stats >= 0] = np.arange(len(kept))
        return Contributions(self.unit[rows], self.count[rows], np.r_[0, np.cumsum(sizes)].astype(np.int64),
                             self.items[pairs], self.rewards[pairs], stats_row, self.gram[kept], self.b[kept])


def _ranks(sizes: NDArray[np.int64]) -> NDArray[np.int64]:
    """``0, 1, ..., sizes[0] - 1, 0, 1, ..., sizes[1] - 1, ...``: each element's rank within its group."""
    ends = np.cumsum(sizes)
    out: NDArray[np.int64] = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - sizes, sizes)
    return out


def decode_contributions(raws: Sequence[bytes], d: int) -> Contributions:
    """:func:`decode_contribution` of each of ``raws`` at once (either layout, mixed), as arrays; ``ValueError``
    as :func:`decode_contribution` when one has not the length its layout and item count make for dimension ``d``.

    >>> raws = [encode_contribution(Contribution(3, 2, None, None, {5: 1.0, 9: 0.5})),
    ...         encode_contribution(Contribution(1, 1, np.eye(2), np.ones(2), {}))]
    >>> c = decode_contributions(raws, 2)
    >>> c.unit.tolist(), c.count.tolist(), c.starts.tolist(), c.items.tolist(), c.rewards.tolist()
    ([3, 1], [2, 1], [0, 2, 2], [5, 9], [1.0, 0.5])
    >>> c.stats_row.tolist(), c.gram.tolist(), c.b.tolist()
    ([-1, 0], [[[1.0, 0.0], [0.0, 1.0]]], [[1.0, 1.0]])
    """
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)

    def refuse(ok: NDArray[np.bool_]) -> None:
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"a pending contribution of {lengths[bad] / 8:g} values is neither layout of "
                             f"encode_contribution for d = {d}")

    refuse((lengths > 0) & (lengths % 8 == 0))
    a = np.frombuffer(b"".join(raws), dtype="<f8")
    size = lengths // 8
    start = np.cumsum(size) - size
    plain = a[start] == NO_UNIT_STATS
    at = np.where(plain, 3, 2 + d * d + d)
    refuse(size > at)
    unit, count, n_items = a[np.where(plain, start + 1, start)], a[np.where(plain, start + 2, start + 1)], a[start + at]
    refuse(np.isfinite(unit) & np.isfinite(count) & np.isfinite(n_items))
    n_items = n_items.astype(np.int64)  # int(): toward zero
    refuse((n_items >= 0) & (size == at + 1 + 2 * n_items))
    pairs = np.repeat(start + at + 1, n_items) + 2 * _ranks(n_items)
    items = a[pairs]
    if not np.isfinite(items).all():
        raise ValueError("a pending contribution names an item that is not a finite number")
    stats = np.flatnonzero(~plain)
    stats_row = np.full(n, -1, dtype=np.int64)
    stats_row[stats] = np.arange(len(stats))
    gram = a[start[stats, None] + 2 + np.arange(d * d)].reshape(len(stats), d, d)
    b = a[start[stats, None] + 2 + d * d + np.arange(d)].reshape(len(stats), d)
    return Contributions(unit.astype(np.int64), count.astype(np.int64), np.r_[0, np.cumsum(n_items)].astype(np.int64),
                         items.astype(np.int64), a[pairs + 1], stats_row, gram, b)


class Folder:
    """The release tick's first step at user level: fold each partition's pending contributions."""

    def __init__(self, client: redis.Redis, namespace: str, *, d: int, n_units: int, n_items: int, cap: int,
                 capacity: int, ratio: Callable[[int], float], b_clip: float = B_CLIP,
                 item_clip: float = ITEM_CLIP,
                 hierarchy: tuple[HierarchyLayout, Callable[[], np.ndarray]] | None = None) -> None:
        self.r, self.ns, self.d, self.n_units, self.n_items = client, namespace, d, n_units, n_items
        #: ``--model hierarchy``: its layout and the catalog's contexts as of now (a callable: an open catalog grows;
        #: rows beyond them are zero contexts); every folded user's tick is also added to the partition's hierarchy
        #: vector (models.streaming.hierarchy)
        self.hierarchy = hierarchy
        self.cap, self.capacity, self.ratio = int(cap), int(capacity), ratio
        self.b_clip, self.item_clip = float(b_clip), float(item_clip)
        self.trusted = TrustedKeys(namespace)
        self._take = client.register_script(TAKE_SCRIPT)
        #: The users' lifetime budget (``user_budget``), set by the release stage; ``None``: none enforced.
        self.budget: LifetimeBudget | None = None

    def epoch_of(self, version: int) -> int:
        return (max(1, version) - 1) // self.capacity

    def fold_partition(self, partition: int, version: int, retries: int = 50, *,
                       fence: Fence | None = None) -> dict[str, int]:
        """Fold one partition's pending contributions into release ``version``.

        The tick's contributions are first *taken*: the pending hash is renamed to the partition's folding hash
        with the fold generation bumped, in one script (:data:`TAKE_SCRIPT`; ingest batches prepared against them
        are refused and redone against the new, empty pending hash). Ingest then goes on while the fold plans:
        nothing it writes can make the fold start over (a fold that read the pending hash under ``WATCH`` was
        redone at every ingest batch, so a tick of thousands of users could take seconds). The plan's writes
        (statistics, records, counters) and the folding hash's deletion are one transaction: a crash in between
        leaves the folding hash, which the next fold folds first. Users already folded into ``version`` go back
        to the pending hash, merged with what they sent since (under ``WATCH``: a few users, a short window).

        ``fence``: the partition's fold lock this fold holds (:mod:`pipeline.state.foldround`). The transaction then
        writes only while the lock still holds this fold's token (``WATCH``), else raises :class:`FoldLockLost`
        with nothing written, and it records the fold round and its counters beside the statistics."""
        keys = UserLevelKeys(self.ns, partition)
        stats_key = self.trusted.stats(partition)
        epoch = self.epoch_of(version)
        empty = dict.fromkeys(FOLD_COUNTERS, 0)
        if not int(self._take(keys=[keys.pending, keys.folding, keys.foldgen])):
            return self._nothing_taken(keys, fence, empty)
        taken = self.r.hgetall(keys.folding)
        if not taken:
            self.r.delete(keys.folding)
            return self._nothing_taken(keys, fence, empty)
        stats_raw = self.r.hgetall(stats_key)
        users = [k.decode()[2:] for k in taken]
        records_raw = self.r.hmget(keys.participation, users)
        out = self._plan(taken, stats_raw, users, records_raw, version, epoch)
        classes = out["classes"]
        if not self.r.exists(keys.classes):  # none kept yet (a namespace from before them): count them once
            classes.update(class_counts(self.r.hvals(keys.participation)))
        removed = set(out["remove"])
        waiting = {f: raw for f, raw in taken.items() if f not in removed}
        for _ in range(retries):
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    back: dict[bytes, bytes] = {}
                    watched = ([keys.pending, keys.foldgen] if waiting else []) + ([fence.lock] if fence else [])
                    if watched:
                        pipe.watch(*watched)
                    if fence is not None:
                        fence.check(pipe)
                    if waiting:  # back to pending, with what the user sent since the take
                        later = pipe.hmget(keys.pending, list(waiting))
                        back = {f: raw if now is None else encode_contribution(merge_contributions(
                            decode_contribution(raw, self.d), decode_contribution(now, self.d)))
                            for (f, raw), now in zip(waiting.items(), later)}
                    pipe.multi()
                    if out["stats"]:
                        pipe.hset(stats_key, mapping=out["stats"])
                    if out["records"]:
                        pipe.hset(keys.participation, mapping=out["records"])
                    for name, value in out["counts"].items():
                        if value:
                            pipe.hincrby(keys.summary, name, value)
                    for name, value in classes.items():
                        if value:
                            pipe.hincrby(keys.classes, name, value)
                    if back:
                        pipe.hset(keys.pending, mapping=back)  # type: ignore[arg-type]
                        pipe.incr(keys.foldgen)
                    pipe.delete(keys.folding)
                    if fence is not None:
                        fence.mark(pipe, out["summary"])
                    pipe.execute()
                    return out["summary"]
                except redis.WatchError:  # ingest wrote pending meanwhile: merge the waiting users again
                    continue
        raise RuntimeError(f"partition {partition}: the fold lost {retries} races with ingest in a row while "
                           f"returning {len(waiting)} waiting users to the pending hash")

    def _nothing_taken(self, keys: UserLevelKeys, fence: Fence | None, empty: dict[str, int]) -> dict[str, int]:
        """Nothing pending: under a fence, record the round as folded (with the lock's check), nothing else."""
        if fence is not None:
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(fence.lock)
                    fence.check(pipe)
                    pipe.multi()
                    fence.mark(pipe, empty)
                    pipe.execute()
                except redis.WatchError:
                    raise FoldLockLost(f"partition {keys.partition}: the fold lock changed hands") from None
        return empty

    def _plan(self, pending: dict[bytes, bytes], stats_raw: dict[bytes, bytes], users: Sequence[str],
              records_raw: Sequence[bytes | None], version: int, epoch: int) -> dict[str, Any]:
        """What folding ``pending`` into release ``version`` writes, computed over all its users at once.

        Each user's fate depends only on their record's class (epoch, ``k``, ``past``: :class:`LedgerColumns`) and
        ``last_version``, so the cap and the budget are asked per class, with the ledger's own rules
        (:meth:`LedgerRecord.at`, :meth:`LifetimeBudget.allows`). The statistics are the sums the users' turns
        would make one after the other, bit for bit: every sum runs in the users' order (``np.add.at``) over the
        same floating-point terms (:func:`~models.streaming.hierarchy.add_contributions`)."""
        from .trusted import HIERARCHY_FIELD, decode_hierarchy, decode_items, decode_stats  # exact statistics

        stats = decode_stats(stats_raw, self.n_units, self.d)
        hvec = None if self.hierarchy is None else decode_hierarchy(stats_raw, self.hierarchy[0].dim)
        items = decode_items(stats_raw, self.n_items) if self.n_items else np.zeros(0)
        fields = list(pending)
        ledger = LedgerColumns.loads(records_raw)
        # per class (the last: no record stored, class_of -1): the record as of this epoch and what it allows
        stored = [*ledger.classes, LedgerRecord()]
        now = [c.at(epoch, self.ratio) for c in stored]
        cls = ledger.class_of
        budget = self.budget
        at_cap = np.array([r.k >= self.cap for r in now])[cls]
        allowed = np.array([budget is None or r.k >= self.cap or budget.allows(r, epoch) for r in now])[cls]
        waiting = ledger.last_version >= version  # already in this release: the events wait for the next one
        taken = np.flatnonzero(~waiting)
        c = decode_contributions([pending[fields[i]] for i in taken.tolist()], self.d)
        capped = at_cap[taken]  # served and logged, not learned from
        over = ~capped & ~allowed[taken]  # past the lifetime budget: served and logged, not learned from
        folded = ~capped & ~over
        k_next = np.array([r.k + 1 for r in now], dtype=np.int64)[cls[taken]]
        summary = {"folded": int(folded.sum()), "at_cap": int((folded & (k_next == self.cap)).sum()),
                   "dropped": int(c.count[capped].sum()), "waiting": int(waiting.sum()),
                   "over_budget": int(c.count[over].sum())}
        records, classes = self._records(ledger, now, users, records_raw, taken, folded, version, epoch)
        f = c.take(np.flatnonzero(folded))
        np.add.at(stats.count, f.unit, f.count)
        touched_units = set(f.unit.tolist())
        with_stats = np.flatnonzero(f.stats_row >= 0)  # the flat model's statistics (none for the hierarchy)
        stats_units = set(f.unit[with_stats].tolist())
        if len(with_stats):
            # one dot per user: np.linalg.norm's sum, bit for bit
            scale = clip_scales(np.array([math.sqrt(float(row @ row)) for row in f.b]), self.b_clip)
            add_rows_in_order(stats.gram, f.unit[with_stats], f.gram)
            add_rows_in_order(stats.b, f.unit[with_stats], scale[:, None] * f.b)
        touched_items: set[int] = set()
        if self.n_items and len(f.items):
            owner = np.repeat(np.arange(len(f.unit)), np.diff(f.starts))
            squares = np.zeros(len(f.unit))
            np.add.at(squares, owner, f.rewards * f.rewards)  # 0 + r_1^2 + r_2^2 + ...: Python's sum, in order
            iscale = clip_scales(np.sqrt(squares), self.item_clip)
            np.add.at(items, f.items, iscale[owner] * f.rewards)
            touched_items = set(f.items.tolist())
        if hvec is not None and self.hierarchy is not None:
            add_contributions(hvec, self.hierarchy[0], f.unit, f.starts, f.items, f.rewards, self.hierarchy[1]())
        out_stats: dict[str, Any] = {}
        for u in touched_units:
            if u in stats_units:
                out_stats[f"g:{u}"] = stats.gram[u].astype("<f8").tobytes()
                out_stats[f"b:{u}"] = stats.b[u].astype("<f8").tobytes()
            out_stats[f"n:{u}"] = str(int(stats.count[u]))
        for a in touched_items:
            out_stats[f"i:{a}"] = repr(float(items[a]))
        if hvec is not None and summary["folded"]:
            out_stats[HIERARCHY_FIELD.decode()] = hvec.astype("<f8").tobytes()
        counts = {f"at_cap:{epoch}": summary["at_cap"], "dropped": summary["dropped"], "folded": summary["folded"],
                  "over_budget": summary["over_budget"]}
        return {"stats": out_stats, "remove": [fields[i] for i in taken.tolist()], "records": records,
                "counts": counts, "summary": summary, "classes": classes}

    def _records(self, ledger: LedgerColumns, now: list[LedgerRecord], users: Sequence[str],
                 records_raw: Sequence[bytes | None], taken: NDArray[np.int64], folded: NDArray[np.bool_],
                 version: int, epoch: int) -> tuple[dict[str, str], Counter[str]]:
        """The ledger records the fold writes for the ``taken`` users (a folded user: one more participation, in
        ``version``; the others: their record as of ``epoch``, left out where the stored one reads the same), and
        the change in users per record class."""
        classes: Counter[str] = Counter()
        if not len(taken):
            return {}, classes
        cls = ledger.class_of[taken]
        out: list[str | None] = [None] * len(taken)
        rows = taken.tolist()
        order = np.lexsort((folded, cls))
        bounds = np.flatnonzero(np.r_[True, (np.diff(cls[order]) != 0) | (np.diff(folded[order]) != 0), True])
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            group = order[lo:hi].tolist()
            c = int(cls[group[0]])
            rec = now[c]
            if folded[group[0]]:
                new = LedgerRecord(epoch, rec.k + 1, version, rec.past)
                texts = [new.dumps()] * len(group)
            else:  # at the cap or past the budget: the record as of this epoch, its last_version kept
                new = rec
                texts = rec.dumps_many(ledger.last_version[taken[group]].tolist())
            written = 0
            for i, text in zip(group, texts):
                raw = records_raw[rows[i]]
                if raw is None or raw != text.encode():  # (an unchanged record: nothing to write, no class moves)
                    out[i] = text
                    written += 1
            classes[new.class_field] += written
            if c >= 0:
                classes[ledger.classes[c].class_field] -= written  # the rewritten records' old class
        return {users[row]: text for row, text in zip(rows, out) if text is not None}, classes
