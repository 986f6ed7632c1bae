"""Fold rounds (:mod:`pipeline.state.foldround`) on a real redis-server: the fold spread over the workers that own the
partitions writes exactly what one process folding every partition writes, and its lock keeps two folds of one
partition from both writing (the live stack with two workers: ``test_faults.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import redis

from models.streaming.hierarchy import HierarchyLayout
from pipeline.state.foldround import FoldRounds, OwnedPartitions, request_key
from pipeline.state.userlevel import Contribution, Fence, Folder, FoldLockLost, UserLevelKeys, encode_contribution

D, N_UNITS, N_ITEMS, P, CAP = 4, 3, 10, 4, 2
FEATURES = np.random.default_rng(0).normal(size=(N_ITEMS, D))


def make_folder(client: redis.Redis, ns: str) -> Folder:
    layout = HierarchyLayout(d=D, n_items=N_ITEMS, n_units=N_UNITS, shares={"pool": 0.2, "items": 0.5, "units": 0.3})
    return Folder(client, ns, d=D, n_units=N_UNITS, n_items=0, cap=CAP, capacity=5,
                  ratio=lambda k: min(k, CAP) ** 2 / CAP**2, hierarchy=(layout, lambda: FEATURES))


def send(client: redis.Redis, ns: str, seed: int, users: int = 120) -> None:
    """A tick's pending contributions, as ingest writes them: users ``0..users-1`` (the same users every tick, so
    later ticks meet users at the cap and users already in the release), spread over the partitions."""
    rng = np.random.default_rng(seed)
    for i in range(users):
        field = f"u:{i}"
        items = {int(a): float(rng.random()) for a in rng.integers(0, N_ITEMS, size=2)}
        c = Contribution(i % N_UNITS, int(rng.integers(1, 4)), None, None, items)
        client.hset(UserLevelKeys(ns, i % P).pending, field, encode_contribution(c))


def snapshot(client: redis.Redis, ns: str) -> dict[str, object]:
    """Every key of ``ns`` (its name without the namespace) and its value, less the fold round's own keys."""
    out: dict[str, object] = {}
    for key in sorted(client.scan_iter(f"{ns}:*")):
        name = key.decode().replace(ns, "NS")
        if name.endswith((":folded", ":foldlock", ":request")):
            continue
        kind = client.type(key).decode()
        out[name] = client.hgetall(key) if kind == "hash" else client.get(key)
    return out


@pytest.fixture
def answering() -> Iterator[Callable[[FoldRounds], None]]:
    """Start workers: each answers fold requests every 10 ms in a thread of its own, until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(rounds: FoldRounds) -> None:
        def loop() -> None:
            while not stop.wait(0.01):
                rounds.answer()
        threads.append(threading.Thread(target=loop, daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for t in threads:
        t.join()


def owning(*partitions: int) -> OwnedPartitions:
    owned = OwnedPartitions()
    owned.assigned(partitions)
    return owned


def test_workers_and_the_leader_fold_what_one_process_folding_every_partition_folds(
        redis_client: redis.Redis, answering: Callable[[FoldRounds], None]) -> None:
    one, spread = make_folder(redis_client, "one"), make_folder(redis_client, "spread")
    answering(FoldRounds(spread, owning(0, 1)))
    answering(FoldRounds(spread, owning(2)))
    leader = FoldRounds(spread, owning(3), grace=30.0)  # (a long grace: the workers fold their own partitions)
    # four ticks; the second folds into release 1 again (its users wait), the last meets every user at the cap
    seen = {"folded": 0, "waiting": 0, "dropped": 0}
    for seed, version in ((1, 1), (2, 1), (3, 2), (4, 3)):
        send(redis_client, "one", seed)
        send(redis_client, "spread", seed)
        expected = {"folded": 0, "at_cap": 0, "dropped": 0, "waiting": 0, "over_budget": 0}
        for p in range(P):
            for name, value in one.fold_partition(p, version).items():
                expected[name] += value
        got = leader.fold(P, version)
        assert got == {**expected, "partitions_here": 1}
        assert snapshot(redis_client, "spread") == snapshot(redis_client, "one")
        seen = {name: seen[name] + got[name] for name in seen}
    assert min(seen.values()) > 0  # users folded, users waiting for the next release, users at the cap
    rounds = [int(redis_client.hget(UserLevelKeys("spread", p).folded, "round")) for p in range(P)]
    assert rounds == [4] * P


def test_the_leader_folds_a_partition_no_one_owns_after_the_grace(redis_client: redis.Redis) -> None:
    folder = make_folder(redis_client, "orphan")
    send(redis_client, "orphan", 5)
    t0 = time.monotonic()
    got = FoldRounds(folder, owning(0), grace=0.3).fold(P, 1)
    assert time.monotonic() - t0 >= 0.3
    assert got["partitions_here"] == P and got["folded"] == 120
    assert all(redis_client.hlen(UserLevelKeys("orphan", p).pending) == 0 for p in range(P))


def test_a_fold_whose_lock_changed_hands_writes_nothing_and_the_next_holder_folds_its_users_once(
        redis_client: redis.Redis) -> None:
    folder = make_folder(redis_client, "fence")
    send(redis_client, "fence", 6)
    keys = UserLevelKeys("fence", 0)
    redis_client.set(keys.fold_lock, b"B")  # A's lock expired and B took it
    with pytest.raises(FoldLockLost):
        folder.fold_partition(0, 1, fence=Fence(keys.fold_lock, b"A", keys.folded, 1))
    assert redis_client.hlen(keys.participation) == 0  # nothing written: no record, no statistics, no round
    assert not redis_client.exists(folder.trusted.stats(0)) and not redis_client.exists(keys.folded)
    assert redis_client.hlen(keys.folding) == 30  # the users A took wait in the folding hash for the next fold
    summary = folder.fold_partition(0, 1, fence=Fence(keys.fold_lock, b"B", keys.folded, 1))
    assert summary["folded"] == 30 and redis_client.hlen(keys.participation) == 30
    assert not redis_client.exists(keys.folding)
    assert redis_client.hget(keys.folded, "round") == b"1"


def test_a_worker_leaves_a_partition_another_fold_holds_and_folds_it_once_free(redis_client: redis.Redis) -> None:
    folder = make_folder(redis_client, "held")
    send(redis_client, "held", 7)
    redis_client.hset(request_key("held"), mapping={"round": 1, "version": 1})
    lock = UserLevelKeys("held", 1).fold_lock
    redis_client.set(lock, b"someone")
    worker = FoldRounds(folder, owning(0, 1))
    assert worker.answer() == 1  # partition 0; partition 1 is someone else's fold now
    assert redis_client.hlen(UserLevelKeys("held", 1).pending) == 30
    redis_client.delete(lock)
    assert worker.answer() == 1 and worker.answer() == 0  # partition 1 now, then nothing left in round 1
    assert redis_client.hlen(UserLevelKeys("held", 1).participation) == 30


class SlowFolder(Folder):
    """A fold that takes ``delay`` seconds before it folds (a large partition)."""

    delay = 1.0

    def fold_partition(self, *args: object, **kwargs: object) -> dict[str, int]:
        time.sleep(self.delay)
        return super().fold_partition(*args, **kwargs)  # type: ignore[arg-type]


def test_the_lock_is_renewed_while_a_long_fold_runs(redis_client: redis.Redis) -> None:
    layout = HierarchyLayout(d=D, n_items=N_ITEMS, n_units=N_UNITS, shares={"pool": 0.2, "items": 0.5, "units": 0.3})
    folder = SlowFolder(redis_client, "slow", d=D, n_units=N_UNITS, n_items=0, cap=CAP, capacity=5,
                        ratio=lambda k: min(k, CAP) ** 2 / CAP**2, hierarchy=(layout, lambda: FEATURES))
    send(redis_client, "slow", 8)
    lock = UserLevelKeys("slow", 0).fold_lock
    rounds = FoldRounds(folder, owning(0, 1, 2, 3), lock_ms=300)
    result: dict[str, int] = {}
    leader = threading.Thread(target=lambda: result.update(rounds.fold(P, 1)))
    leader.start()
    time.sleep(0.7)  # beyond the lock's 300 ms: still held, renewed
    assert redis_client.get(lock) is not None
    assert not redis_client.set(lock, b"intruder", nx=True, px=300)
    leader.join()
    assert result["folded"] == 120 and result["partitions_here"] == P
    assert all(not redis_client.exists(UserLevelKeys("slow", p).fold_lock) for p in range(P))  # all released
