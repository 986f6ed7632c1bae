"""parse_batch over many events agrees with parsing each event alone (a batch of one), bit for bit."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from models.streaming import UnitStats
from pipeline.data.catalog import SyntheticCatalog
from pipeline.data.records import MalformedEvent, parse_batch, parse_interaction

CAT = SyntheticCatalog(n_users=6, d=5, n_arms=40, seed=0)
HUGE = "1" + "0" * 400
MALFORMED = [
    b"{not json", b"[1, 2, 3]", b"\xff\xfe\x00garbage", b'{"a": 1, "a": 2}',
    b'{"event_id": "m", "user": "1", "arm": "2"}',
    b'{"event_id": "m", "user": "nobody", "arm": "2", "reward": 1}',
    b'{"event_id": "m", "user": "1", "arm": "no-such-arm", "reward": 1}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1, "context": [0.1, 0.2]}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": NaN}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1, "context": [1, Infinity, 0, 0, 0]}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1.5}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": true}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": "yes"}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1, "context": [true, 0, 0, 0, 0]}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1, "ts": "now"}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": -0.5}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1.0000000001}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1.0, "ts": true}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1.0, "ts": Infinity}',
    b'{"event_id": "m", "user": "1", "arm": "2", "reward": 1.0, "ts": -1e400}',
    f'{{"event_id": "m", "user": "1", "arm": "2", "reward": {HUGE}}}'.encode(),
    f'{{"event_id": "m", "user": "1", "arm": "2", "reward": 1, "ts": {HUGE}}}'.encode(),
    f'{{"event_id": "m", "user": "1", "arm": "2", "reward": 1, "context": [{HUGE}, 0, 0, 0, 0]}}'.encode(),
]


def _events(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ev = {"event_id": f"e{i}", "user": str(rng.randrange(6)), "arm": str(rng.randrange(40)),
              "reward": rng.random(), "ts": 1.7e12 + i}
        if i % 2:
            ev["context"] = [rng.uniform(-1, 1) for _ in range(5)]  # often longer than 1: clipped
        if i % 11 == 0:
            ev["context"] = [1, 0, 0, 0, 0]  # integers, norm exactly 1
        out.append(json.dumps(ev).encode())
    return out


def _one_by_one(raws: list[bytes]) -> tuple:
    units, rows, rewards, users, dead = [], [], [], [], []
    for i, raw in enumerate(raws):
        try:
            u, x, r, user = parse_interaction(raw, CAT)
        except MalformedEvent as exc:
            dead.append((i, str(exc)))
            continue
        units.append(u), rows.append(x), rewards.append(r), users.append(user)
    return units, np.vstack(rows) if rows else np.zeros((0, 5)), rewards, users, dead


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_equals_one_by_one_with_malformed_events_mixed_in(seed: int) -> None:
    raws = _events(500, seed)
    for k, bad in enumerate(MALFORMED):
        raws.insert((37 * k + seed) % len(raws), bad)
    units, X, rewards, users, dead = _one_by_one(raws)
    got = parse_batch(raws, CAT)
    assert got.units.tolist() == units
    assert got.contexts.tobytes() == X.tobytes()
    assert got.rewards.tolist() == rewards and got.users == users
    assert got.dead == dead and len(dead) == len(MALFORMED)


def test_huge_integers_are_malformed_not_a_crash() -> None:
    for raw in MALFORMED[-3:]:
        with pytest.raises(MalformedEvent):
            parse_interaction(raw, CAT)
        assert len(parse_batch([raw], CAT).dead) == 1


def test_batched_statistics_equal_sequential_updates_bit_for_bit() -> None:
    got = parse_batch(_events(2000, 7), CAT)
    batched, sequential = UnitStats.zeros(n_units=6, d=5), UnitStats.zeros(n_units=6, d=5)
    batched.add(got.units, got.contexts, got.rewards)
    for u, x, r in zip(got.units, got.contexts, got.rewards):
        sequential.add(np.array([u]), x[None, :], np.array([r]))
    assert batched.to_mapping() == sequential.to_mapping()


def test_decoded_holds_exactly_the_accepted_events_in_order() -> None:
    """``ParsedBatch.decoded`` (what the shown-list check reads) pairs each accepted event with its index in the
    batch — also when an event is refused only after the loop (a NaN context)."""
    good = {"event_id": "a", "user": "1", "arm": "2", "reward": 1.0}
    raws = [json.dumps(good).encode(), b"{not json",
            b'{"event_id": "n", "user": "1", "arm": "2", "reward": 1.0, "context": [NaN, 0, 0, 0, 0]}',
            json.dumps({**good, "event_id": "b", "user": "3"}).encode()]
    parsed = parse_batch(raws, CAT)
    assert [i for i, _ in parsed.dead] == [1, 2]
    assert [(i, ev["event_id"]) for i, ev in parsed.decoded] == [(0, "a"), (3, "b")]
    assert [ev["user"] for _, ev in parsed.decoded] == parsed.users
