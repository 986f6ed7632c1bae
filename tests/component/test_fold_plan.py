"""The fold's plan over a tick's users at once equals the user-by-user loop it replaced, bit for bit.

The live release is compared with the offline twin bit for bit, so the vectorised plan
(:meth:`pipeline.state.userlevel.Folder._plan`) must write the very bytes the sequential loop wrote: the same
statistics (floating-point sums in the same order), ledger records (less those that would be written as they are
stored), class counts and counters. The loop is kept
here as the reference, as it stood before the plan was vectorised.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import redis

from models.mechanisms.participation import clip_scale
from models.streaming.hierarchy import HierarchyLayout, add_contribution
from pipeline.config.ledger import LedgerRecord, LifetimeBudget
from pipeline.state.trusted import HIERARCHY_FIELD, decode_hierarchy, decode_items, decode_stats
from pipeline.state.userlevel import (
    Contribution,
    Folder,
    decode_contribution,
    decode_contributions,
    encode_contribution,
)

D, N_UNITS, N_ITEMS, CAPACITY = 4, 3, 12, 5


def sequential_plan(f: Folder, pending: dict[bytes, bytes], stats_raw: dict[bytes, bytes], users: list[str],
                    records_raw: list[bytes | None], version: int, epoch: int) -> dict[str, Any]:
    """The fold's plan one user after the other (the loop before it was vectorised)."""
    stats = decode_stats(stats_raw, f.n_units, f.d)
    hvec = None if f.hierarchy is None else decode_hierarchy(stats_raw, f.hierarchy[0].dim)
    features = None if f.hierarchy is None else f.hierarchy[1]()
    items = decode_items(stats_raw, f.n_items) if f.n_items else np.zeros(0)
    touched_units: set[int] = set()
    stats_units: set[int] = set()
    touched_items: set[int] = set()
    remove: list[bytes] = []
    records: dict[str, str] = {}
    summary = {"folded": 0, "at_cap": 0, "dropped": 0, "waiting": 0, "over_budget": 0}
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
        rec = stored.at(epoch, f.ratio)
        if rec.last_version >= version:
            summary["waiting"] += 1
            continue
        c = decode_contribution(pending[field_name], f.d)
        remove.append(field_name)
        if rec.k >= f.cap:
            summary["dropped"] += c.count
            write(user, LedgerRecord(rec.epoch, rec.k, rec.last_version, rec.past))
            continue
        if f.budget is not None and not f.budget.allows(rec, epoch):
            summary["over_budget"] += c.count
            write(user, rec)
            continue
        if c.gram is not None and c.b is not None:
            scale = clip_scale(math.sqrt(float(c.b @ c.b)), f.b_clip)
            stats.gram[c.unit] += c.gram
            stats.b[c.unit] += scale * c.b
            stats_units.add(c.unit)
        stats.count[c.unit] += c.count
        touched_units.add(c.unit)
        if f.n_items and c.items:
            iscale = clip_scale(math.sqrt(sum(v * v for v in c.items.values())), f.item_clip)
            for item, value in c.items.items():
                items[item] += iscale * value
                touched_items.add(item)
        if hvec is not None and f.hierarchy is not None and features is not None:
            add_contribution(hvec, f.hierarchy[0], c.unit, c.items, features)
        k = rec.k + 1
        write(user, LedgerRecord(epoch, k, version, rec.past))
        summary["folded"] += 1
        if k == f.cap:
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


def tick(seed: int, *, hierarchy: bool, n: int = 400) -> tuple[Folder, dict[str, Any]]:
    """A folder and a tick's inputs covering every case: new users, records from an earlier epoch (closed into
    ``past``), users at the cap, past the budget, already in this release, several items (zero rewards too, items
    beyond the contexts), a record whose ``past`` is stored as an integer, statistics already there."""
    rng = np.random.default_rng(seed)
    cap = 3
    ratio = lambda k: min(k, cap) ** 2 / cap**2  # noqa: E731
    F = rng.normal(size=(N_ITEMS - 2, D)) * rng.choice([0.3, 2.0], size=(N_ITEMS - 2, 1))  # some beyond norm 1
    layout = HierarchyLayout(d=D, n_items=N_ITEMS, n_units=N_UNITS,
                             shares={"pool": 0.2, "items": 0.5, "units": 0.3})
    f = Folder(redis.Redis(), "t", d=D, n_units=N_UNITS, n_items=0 if hierarchy else N_ITEMS, cap=cap,
               capacity=CAPACITY, ratio=ratio, hierarchy=(layout, lambda: F) if hierarchy else None)
    f.budget = LifetimeBudget(epsilon=1.0, delta=1e-5, mu=1.0, mu_cap=0.4, cap=cap, ratio=ratio)
    version = 3 * CAPACITY + 2
    epoch = f.epoch_of(version)
    pending: dict[bytes, bytes] = {}
    users, records = [], []
    for i in range(n):
        its = {int(a): float(rng.choice([0.0, 0.5, 1.0, 3.0, rng.random()]))
               for a in rng.integers(0, N_ITEMS, size=int(rng.integers(0, 5)))}
        unit = int(rng.integers(0, N_UNITS))
        if hierarchy:
            c = Contribution(unit, int(rng.integers(1, 4)), None, None, its)
        else:
            X = rng.normal(size=(3, D))
            c = Contribution(unit, 3, X.T @ X, rng.normal(size=D) * rng.choice([0.1, 3.0]), its)
        pending[f"u:{i}".encode()] = encode_contribution(c)
        users.append(str(i))
        kind = rng.integers(0, 6)
        past = float(rng.choice([0.0, 0.5, 4.0, 9.0]))
        rec = [None, LedgerRecord(epoch - 1, int(rng.integers(0, cap + 1)), version - 4, past),
               LedgerRecord(epoch, int(rng.integers(0, cap + 1)), version - 1, past),
               LedgerRecord(epoch, 1, version, 0.0), LedgerRecord(epoch - 2, 1, 2, past),
               LedgerRecord(epoch, 0, version - 1, 0)][kind]  # the last: past 0 (an int) prints as "0"
        records.append(None if rec is None else rec.dumps().encode())
    stats_raw: dict[bytes, bytes] = {b"n:1": b"7", b"g:1": (np.eye(D) * 0.1).tobytes(), b"b:1": np.ones(D).tobytes(),
                                     b"i:3": b"0.1"}
    if hierarchy:
        stats_raw[HIERARCHY_FIELD] = (rng.normal(size=layout.dim) * 1e-3).tobytes()
    return f, {"pending": pending, "stats_raw": stats_raw, "users": users, "records_raw": records,
               "version": version, "epoch": epoch}


@pytest.mark.parametrize("hierarchy", [True, False], ids=["hierarchy", "flat"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_vectorised_plan_writes_the_bytes_the_sequential_loop_wrote(hierarchy: bool, seed: int) -> None:
    f, args = tick(seed, hierarchy=hierarchy)
    want = sequential_plan(f, **args)
    got = f._plan(**args)
    assert got["stats"] == want["stats"]
    stored = {u: raw.decode() for u, raw in zip(args["users"], args["records_raw"]) if raw is not None}
    assert {**stored, **got["records"]} == {**stored, **want["records"]}  # the ledger hash after the fold
    unchanged = want["records"].keys() - got["records"].keys()  # left out: the stored record reads the same
    assert unchanged and all(stored[u] == want["records"][u] for u in unchanged)
    assert got["remove"] == want["remove"]
    assert (got["counts"], got["summary"]) == (want["counts"], want["summary"])
    assert {k: v for k, v in got["classes"].items() if v} == {k: v for k, v in want["classes"].items() if v}
    s = want["summary"]  # the tick covered every case
    assert min(s["folded"], s["at_cap"], s["dropped"], s["waiting"], s["over_budget"]) > 0


def test_the_plan_of_a_tick_where_nobody_folds_writes_no_statistics() -> None:
    f, args = tick(3, hierarchy=True, n=30)
    args["version"] = 1  # every stored record already has a later version: everybody waits
    args["records_raw"] = [LedgerRecord(0, 1, 5).dumps().encode()] * len(args["users"])
    got = f._plan(**args)
    assert got["stats"] == {} and got["records"] == {} and got["remove"] == []
    assert got["summary"]["waiting"] == len(args["users"])


def test_decoding_many_contributions_equals_decoding_each_and_refuses_what_decode_contribution_refuses() -> None:
    rng = np.random.default_rng(5)
    cs = [Contribution(int(rng.integers(0, 9)), int(rng.integers(1, 5)), None, None,
                       {int(a): float(rng.random()) for a in rng.integers(0, 50, size=int(rng.integers(0, 4)))})
          for _ in range(20)]
    cs += [Contribution(2, 1, rng.normal(size=(D, D)), rng.normal(size=D), {4: 1.0})]
    raws = [encode_contribution(c) for c in cs]
    many = decode_contributions(raws, D)
    for i, raw in enumerate(raws):
        one = decode_contribution(raw, D)
        lo, hi = many.starts[i], many.starts[i + 1]
        assert (int(many.unit[i]), int(many.count[i])) == (one.unit, one.count)
        assert dict(zip(many.items[lo:hi].tolist(), many.rewards[lo:hi].tolist())) == one.items
        if one.gram is not None:
            assert many.gram[many.stats_row[i]].tobytes() == one.gram.tobytes()
            assert many.b[many.stats_row[i]].tobytes() == one.b.tobytes()
        else:
            assert many.stats_row[i] == -1
    for bad in (raws[0][:-8], raws[-1][:-8], raws[0][:-3], b""):
        with pytest.raises(ValueError, match="neither layout"):
            decode_contributions([raws[1], bad], D)
