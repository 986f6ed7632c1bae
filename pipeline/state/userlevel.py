"""User-level privacy in the pipeline: per-user tick contributions, clipping, the cap, the ledger.

With ``privacy_unit = user`` (the default), ingest does not add events to the unit statistics at
once. It accumulates each user's events of the current tick in the partition's *pending* hash
(``{ns}:trusted:{ns:p<P>}:pending``, field ``u:<user>``: the user's unit, count, Gram, ``b`` and item
rewards; with ``--model hierarchy`` no Gram and no ``b``: its release reads neither), atomically with the partition's offset (:data:`PENDING_SCRIPT`). At each release tick the
leader *folds* every partition (:meth:`Folder.fold_partition`): it takes the partition's pending hash (renamed
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

import math
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from models.mechanisms.participation import B_CLIP, ITEM_CLIP, clip_scale
from models.streaming.hierarchy import HierarchyLayout, add_contribution

from ..config.keys import PublicKeys
from ..config.ledger import LedgerRecord, LifetimeBudget, class_counts
from .trusted import TrustedKeys, offset_checked_writes

__all__ = ["PENDING_SCRIPT", "TAKE_SCRIPT", "Contribution", "NO_UNIT_STATS", "encode_contribution", "decode_contribution",
           "merge_contributions", "Folder",
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

    def fold(self, partitions: int, version: int) -> dict[str, int]:
        """Fold every partition into the statistics of release ``version``; counters of what happened."""
        total = {"folded": 0, "at_cap": 0, "dropped": 0, "waiting": 0, "over_budget": 0}
        for p in range(partitions):
            for key, value in self.fold_partition(p, version).items():
                total[key] += value
        return total

    def fold_partition(self, partition: int, version: int, retries: int = 50) -> dict[str, int]:
        """Fold one partition's pending contributions into release ``version``.

        The tick's contributions are first *taken*: the pending hash is renamed to the partition's folding hash
        with the fold generation bumped, in one script (:data:`TAKE_SCRIPT`; ingest batches prepared against them
        are refused and redone against the new, empty pending hash). Ingest then goes on while the fold plans:
        nothing it writes can make the fold start over (a fold that read the pending hash under ``WATCH`` was
        redone at every ingest batch, so a tick of thousands of users could take seconds). The plan's writes
        (statistics, records, counters) and the folding hash's deletion are one transaction: a crash in between
        leaves the folding hash, which the next fold folds first. Users already folded into ``version`` go back
        to the pending hash, merged with what they sent since (under ``WATCH``: a few users, a short window)."""
        keys = UserLevelKeys(self.ns, partition)
        stats_key = self.trusted.stats(partition)
        epoch = self.epoch_of(version)
        empty = {"folded": 0, "at_cap": 0, "dropped": 0, "waiting": 0, "over_budget": 0}
        if not int(self._take(keys=[keys.pending, keys.folding, keys.foldgen])):
            return empty
        taken = self.r.hgetall(keys.folding)
        if not taken:
            self.r.delete(keys.folding)
            return empty
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
                    if waiting:  # back to pending, with what the user sent since the take
                        pipe.watch(keys.pending, keys.foldgen)
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
                    pipe.execute()
                    return out["summary"]
                except redis.WatchError:  # ingest wrote pending meanwhile: merge the waiting users again
                    continue
        raise RuntimeError(f"partition {partition}: the fold lost {retries} races with ingest in a row while "
                           f"returning {len(waiting)} waiting users to the pending hash")

    def _plan(self, pending: dict[bytes, bytes], stats_raw: dict[bytes, bytes], users: Sequence[str],
              records_raw: Sequence[bytes | None], version: int, epoch: int) -> dict[str, Any]:
        from .trusted import HIERARCHY_FIELD, decode_hierarchy, decode_items, decode_stats  # exact statistics

        stats = decode_stats(stats_raw, self.n_units, self.d)
        hvec = None if self.hierarchy is None else decode_hierarchy(stats_raw, self.hierarchy[0].dim)
        features = None if self.hierarchy is None else self.hierarchy[1]()
        items = decode_items(stats_raw, self.n_items) if self.n_items else np.zeros(0)
        touched_units: set[int] = set()
        stats_units: set[int] = set()  # units whose gram and b were added to
        touched_items: set[int] = set()
        remove: list[bytes] = []
        records: dict[str, str] = {}
        summary = {"folded": 0, "at_cap": 0, "dropped": 0, "waiting": 0, "over_budget": 0}
        # users per record class (LedgerRecord.class_field): -1 for each rewritten record's old class, +1 for its new
        classes: Counter[str] = Counter()
        old_class: dict[str, str] = {}

        def write(user: str, record: LedgerRecord) -> None:
            records[user] = record.dumps()
            if user in old_class:
                classes[old_class[user]] -= 1
            classes[record.class_field] += 1

        for field_name, user, raw_rec in zip(list(pending), users, records_raw):
            stored = LedgerRecord.loads(raw_rec)
            if raw_rec is not None:
                old_class[user] = stored.class_field
            rec = stored.at(epoch, self.ratio)
            if rec.last_version >= version:
                summary["waiting"] += 1  # already in this release: the events wait for the next one
                continue
            c = decode_contribution(pending[field_name], self.d)
            remove.append(field_name)
            if rec.k >= self.cap:
                summary["dropped"] += c.count  # at the cap: served and logged, not learned from
                write(user, LedgerRecord(rec.epoch, rec.k, rec.last_version, rec.past))
                continue
            if self.budget is not None and not self.budget.allows(rec, epoch):
                summary["over_budget"] += c.count  # past the lifetime budget: served and logged, not learned from
                write(user, rec)
                continue
            if c.gram is not None and c.b is not None:  # the flat model's statistics (none for the hierarchy)
                scale = clip_scale(math.sqrt(float(c.b @ c.b)), self.b_clip)  # np.linalg.norm's sum, bit for bit
                stats.gram[c.unit] += c.gram
                stats.b[c.unit] += scale * c.b
                stats_units.add(c.unit)
            stats.count[c.unit] += c.count
            touched_units.add(c.unit)
            if self.n_items and c.items:
                iscale = clip_scale(math.sqrt(sum(v * v for v in c.items.values())), self.item_clip)
                for item, value in c.items.items():
                    items[item] += iscale * value
                    touched_items.add(item)
            if hvec is not None and self.hierarchy is not None and features is not None:
                add_contribution(hvec, self.hierarchy[0], c.unit, c.items, features)
            k = rec.k + 1
            write(user, LedgerRecord(epoch, k, version, rec.past))
            summary["folded"] += 1
            if k == self.cap:
                summary["at_cap"] += 1
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
        return {"stats": out_stats, "remove": remove, "records": records, "counts": counts, "summary": summary,
                "classes": classes}

