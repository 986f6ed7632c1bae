"""The fold, spread over the workers: each folds the partitions it owns, the leader releases their sum once.

At user level a release tick first folds every partition's pending contributions
(:meth:`pipeline.state.userlevel.Folder.fold_partition`). One process folding them all took 2 s for 100,000 users in
one tick on this machine (docs/capacity.md), above the 1 s tick period. A *fold round* shares that work out:

1. the leader writes a fold request, the round ``r`` and the release ``version`` it folds into, in one transaction
   (``{ns}:trusted:{ns:fold}:request``);
2. every worker polls the request (:data:`FOLD_POLL_S`; :meth:`FoldRounds.answer`). For each partition its ingest
   consumer owns (Kafka's group assignment decides who owns what: :class:`OwnedPartitions`) whose last recorded
   round is below ``r`` it takes the partition's fold lock (``SET NX PX``, a random token), reads the round again,
   folds the partition into ``version``, and records round ``r`` and the fold's counters in the partition's
   ``folded`` hash, in the fold's own transaction, fenced by the lock (:class:`~pipeline.state.userlevel.Fence`:
   a fold whose lock expired writes nothing);
3. the leader folds the partitions it owns itself, the same way, then waits for the others' rounds. A partition no
   one has recorded after :data:`FOLD_GRACE_S` (no one owns it during a rebalance; its worker is stopped) it folds
   itself, under the same lock: a worker still folding it holds the lock, and the leader's fold then finds the round
   recorded and skips it;
4. once every partition has recorded round ``r``, the leader reads the exact statistics and releases them with one
   draw of noise (:meth:`pipeline.release.stages.ReleaseStage.tick`).

Each partition's fold is the same code on the same data whichever process runs it, and partitions are disjoint (all a
user's events go to one partition, and so do their ledger record and cap), so the statistics, the release, its noise
and its accounting are those of one process folding every partition: nothing here touches privacy. A stale request
(the leader stopped mid-round) is harmless: its version is not released yet, and the next round folds into it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from .userlevel import FOLD_COUNTERS, Fence, Folder, UserLevelKeys

__all__ = ["FOLD_GRACE_S", "FOLD_LOCK_MS", "FOLD_POLL_S", "FoldRounds", "OwnedPartitions", "request_key"]

#: How long a partition's fold lock lasts unless renewed (ms). Its holder renews it every third of that while it
#: folds (a fold of 100,000 users takes ~2 s here), so a worker that dies holding it delays that partition's fold
#: by at most this: the consumer group's own session timeout (6 s) for the same death.
FOLD_LOCK_MS = 6_000
#: How long the leader leaves a partition to the worker that owns it before folding it itself (s).
FOLD_GRACE_S = 0.5
#: How often a worker looks for a fold request (s).
FOLD_POLL_S = 0.05

#: Delete the lock only if it still holds the caller's token (never another holder's lock).
_UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
#: Extend the lock only if it still holds the caller's token.
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"


def request_key(namespace: str) -> str:
    """The fold request: ``round`` and ``version`` (a hash, written by the leader in one transaction)."""
    return f"{namespace}:trusted:{{{namespace}:fold}}:request"


class OwnedPartitions:
    """The partitions this process's ingest consumer is assigned now (its rebalance listener sets them)."""

    def __init__(self) -> None:
        self.partitions: frozenset[int] = frozenset()

    def assigned(self, partitions: Iterable[int]) -> None:
        self.partitions = frozenset(int(p) for p in partitions)

    def revoked(self, partitions: Iterable[int]) -> None:
        self.partitions = self.partitions - {int(p) for p in partitions}


class FoldRounds:
    """The leader's side (:meth:`fold`) and every worker's side (:meth:`answer`) of a fold round."""

    def __init__(self, folder: Folder, owned: OwnedPartitions | None = None, *, grace: float = FOLD_GRACE_S,
                 lock_ms: int = FOLD_LOCK_MS) -> None:
        self.folder, self.r, self.ns = folder, folder.r, folder.ns
        #: the partitions this process folds without waiting for anyone (``None``: every partition, as a lone
        #: process does: a federated site, the offline tools)
        self.owned = owned
        self.grace, self.lock_ms = float(grace), int(lock_ms)
        self._unlock = self.r.register_script(_UNLOCK)
        self._renew = self.r.register_script(_RENEW)

    def fold(self, partitions: int, version: int) -> dict[str, int]:
        """The leader: fold every partition into release ``version`` (this process's own now, the rest by their
        owners, any left after the grace here); the round's counters summed, and ``partitions_here``."""
        with self.r.pipeline(transaction=True) as pipe:
            pipe.hincrby(request_key(self.ns), "round", 1)
            pipe.hset(request_key(self.ns), "version", int(version))
            rnd = int(pipe.execute()[0])
        everyone = range(partitions)
        own = set(everyone) if self.owned is None else set(self.owned.partitions) & set(everyone)
        here = sum(self._fold_locked(p, rnd, version, wait=True) for p in sorted(own))
        rest = [p for p in everyone if p not in own]
        start = time.monotonic()
        while rest:
            rest = [p for p, r in zip(rest, self._rounds(rest)) if r < rnd]
            if rest and time.monotonic() - start >= self.grace:  # no one took them: fold them here
                here += sum(self._fold_locked(p, rnd, version, wait=True) for p in rest)
            elif rest:
                time.sleep(0.005)
        total = dict.fromkeys(FOLD_COUNTERS, 0)
        for raw in self._summaries(everyone, rnd):
            for name in FOLD_COUNTERS:
                total[name] += int(raw.get(name, 0))
        return {**total, "partitions_here": here}

    def answer(self) -> int:
        """A worker: fold the owned partitions the latest request has not seen folded; how many it folded."""
        mine = sorted(self.owned.partitions) if self.owned is not None else []
        if not mine:
            return 0
        rnd_raw, version_raw = self.r.hmget(request_key(self.ns), ["round", "version"])
        if rnd_raw is None or version_raw is None:
            return 0
        rnd, version = int(rnd_raw), int(version_raw)
        return sum(self._fold_locked(p, rnd, version, wait=False)
                   for p, r in zip(mine, self._rounds(mine)) if r < rnd)

    def _fold_locked(self, partition: int, rnd: int, version: int, *, wait: bool) -> int:
        """Fold ``partition`` into ``version`` under its lock unless round ``rnd`` is recorded (1 if folded here).
        ``wait``: wait for the lock (its holder finishes, or the lock expires); else give up if it is held."""
        keys = UserLevelKeys(self.ns, partition)
        token = os.urandom(16)
        while not self.r.set(keys.fold_lock, token, nx=True, px=self.lock_ms):
            if not wait:
                return 0
            time.sleep(0.005)
        try:
            if self._rounds([partition])[0] >= rnd:  # its owner (or the leader) folded it meanwhile
                return 0
            with self._renewed(keys.fold_lock, token, partition):
                self.folder.fold_partition(partition, version, fence=Fence(keys.fold_lock, token, keys.folded, rnd))
            return 1
        finally:
            self._unlock(keys=[keys.fold_lock], args=[token])

    @contextlib.contextmanager
    def _renewed(self, lock: str, token: bytes, partition: int) -> Iterator[None]:
        """Renew ``lock`` every third of its expiry while the body runs (a renewal between the fold's ``WATCH`` and
        ``EXEC`` makes the fold's transaction run again, as an ingest write does)."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(self.lock_ms / 3000):
                if not self._renew(keys=[lock], args=[token, self.lock_ms]):
                    return  # lost (expired and taken): the fold's fence refuses its write

        renewal = threading.Thread(target=renew, name=f"fold-lock-p{partition}", daemon=True)
        renewal.start()
        try:
            yield
        finally:
            done.set()
            renewal.join()

    def _rounds(self, partitions: Sequence[int]) -> list[int]:
        """The last round each partition recorded (0: none yet)."""
        with self.r.pipeline(transaction=False) as pipe:
            for p in partitions:
                pipe.hget(UserLevelKeys(self.ns, p).folded, "round")
            return [int(raw) if raw is not None else 0 for raw in pipe.execute()]

    def _summaries(self, partitions: Iterable[int], rnd: int) -> list[dict[str, int]]:
        """The counters of the partitions' folds of round ``rnd``."""
        with self.r.pipeline(transaction=False) as pipe:
            for p in partitions:
                pipe.hmget(UserLevelKeys(self.ns, p).folded, ["round", "summary"])
            rows = pipe.execute()
        return [json.loads(summary) for r, summary in rows if r is not None and int(r) == rnd and summary]

