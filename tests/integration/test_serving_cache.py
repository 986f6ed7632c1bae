"""Serving's kept scores (per unit and model version) against a real redis-server: the answer is bit for bit
what scoring the request's own candidates gives, for every published version, item term, per-unit width, item
added while running and catalog size, and the memory they take stays within its bound.

The serving models are written to Redis in the layout the solver publishes (``{ns}:model:*``, one transaction);
the expected scores are computed here from the same arrays with :func:`models.ground.linalg.ucb_scores` on the
request's candidates only.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from models.ground.linalg import ucb_scores
from pipeline.config.keys import PublicKeys
from pipeline.data.catalog import SyntheticCatalog
from pipeline.data.catalog_open import OpenCatalog
from pipeline.serve import serving
from pipeline.serve.serving import BadRequest, Recommender
from producers.catalog import build_catalog

_ns = itertools.count()
ALPHA = 0.7


class Published:
    """Serving models written to Redis as the solver writes them; ``expected`` scores a pool from the arrays."""

    def __init__(self, client: redis.Redis, catalog: Any, seed: int) -> None:
        self.client, self.catalog, self.rng = client, catalog, np.random.default_rng(seed)
        self.ns = f"sc{next(_ns)}"
        self.keys = PublicKeys(self.ns)

    def publish(self, version: int, *, width: bool = False, pop: int | None = None, weight: float = 0.5) -> None:
        n, d = self.catalog.n_units, self.catalog.d
        self.theta = self.rng.normal(size=(n, d)) * 0.3
        A = self.rng.normal(size=(n, d, d))
        self.M = np.linalg.inv(np.eye(d) + A @ A.transpose(0, 2, 1))
        self.width = self.rng.uniform(0.1, 2.0, size=n) if width else None
        self.term = None if pop is None else (weight, self.rng.random(pop))
        with self.client.pipeline(transaction=True) as pipe:
            for u in range(n):
                unit = {"theta": self.theta[u].astype("<f8").tobytes(), "M": self.M[u].astype("<f8").tobytes(),
                        "version": str(version)}
                if self.width is not None:
                    unit["width"] = repr(float(self.width[u]))
                pipe.hset(self.keys.model_unit(u), mapping=unit)
            if self.term is not None:
                pipe.hset(self.keys.model_items, mapping={"pop": self.term[1].astype("<f8").tobytes(),
                                                          "weight": repr(self.term[0]), "version": str(version)})
            else:
                pipe.delete(self.keys.model_items)
            pipe.hset(self.keys.model_meta, mapping={"version": str(version), "alpha": repr(ALPHA)})
            pipe.execute()

    def expected(self, user: str, pool: Sequence[str]) -> dict[str, list[float]]:
        """mean, bonus, popularity and score of ``pool``'s items, in pool order, from the pool alone."""
        u = self.catalog.unit_of(user)
        alpha = ALPHA if self.width is None else float(self.width[u])
        mean, bonus = ucb_scores(self.theta[u], self.M[u], self.catalog.features_of(pool), alpha)
        out = {"mean": mean.tolist(), "bonus": bonus.tolist(), "score": (mean + bonus).tolist()}
        if self.term is not None:
            rows = [self.catalog.arm_row(a) for a in pool]
            pop = np.array([self.term[1][r] if r < len(self.term[1]) else 0.0 for r in rows]) * self.term[0]
            out["popularity"], out["score"] = pop.tolist(), (mean + bonus + pop).tolist()
        return out

    def check(self, got: dict[str, Any], user: str, pool: Sequence[str], k: int) -> None:
        """``got`` is the top ``k`` of ``pool`` by the pool's own scores (ties in pool order), bit for bit."""
        want = self.expected(user, pool)
        order = np.argsort(-np.array(want["score"]), kind="stable")[:k].tolist()
        assert [it["item"] for it in got["items"]] == [pool[i] for i in order]
        for field in want:
            assert [it[field] for it in got["items"]] == [want[field][i] for i in order], field


@pytest.mark.parametrize("variant", ["item term", "per-unit width"])
def test_kept_scores_are_the_pools_own_bit_for_bit(redis_client: redis.Redis, variant: str) -> None:
    catalog = SyntheticCatalog(n_users=4, d=25, n_arms=1000, seed=3)
    world = Published(redis_client, catalog, seed=1)
    # an item term released for the first 900 items: the last 100 have no released sum (0)
    world.publish(1, width=variant == "per-unit width", pop=900 if variant == "item term" else None)
    rec = Recommender(redis_client, world.ns, catalog)
    rng = np.random.default_rng(2)
    arms = list(catalog.arm_ids)
    for user in catalog.users:
        unit = catalog.unit_of(user)
        pools = [list(rng.choice(arms, 25, replace=False)), list(rng.permutation(arms)),  # K = 25, K = 1,000
                 [arms[int(rng.integers(1000))]], arms[880:930]]  # one item; across the item term's end
        for i, pool in enumerate(pools):
            k = [10, serving.MAX_K, 1, 5][i]
            got = rec.recommend(user, pool, k)
            world.check(got, user, pool, min(k, len(pool)))
            kept = rec._scores[unit]
            if i == 0:
                first = kept
                assert kept.done.all()  # 1,000 <= SCORE_WHOLE_ROWS items: the whole catalog at the first request
            assert kept is first  # the next requests of the unit index the same scores
    assert list(rec._scores) == [catalog.unit_of(u) for u in catalog.users]


@pytest.mark.parametrize("kind", ["ties", "nan"])
def test_ties_rank_in_pool_order_and_nan_ranks_last(redis_client: redis.Redis, kind: str) -> None:
    # θ = 0 and M = 0: every score is exactly 0, so the order is the pool's (stable); with a NaN in θ every
    # score of the unit is NaN (non-finite: the numpy path, which ranks NaN last, still in pool order)
    catalog = SyntheticCatalog(n_users=2, d=6, n_arms=60, seed=8)
    world = Published(redis_client, catalog, seed=9)
    world.publish(1)
    theta = np.zeros(catalog.d)
    theta[0] = np.nan if kind == "nan" else 0.0
    for u in range(catalog.n_units):
        redis_client.hset(world.keys.model_unit(u), mapping={"theta": theta.astype("<f8").tobytes(),
                                                             "M": np.zeros((catalog.d, catalog.d)).tobytes()})
    rec = Recommender(redis_client, world.ns, catalog)
    pool = [str(a) for a in (41, 3, 17, 59, 0, 22, 8)]
    for user in catalog.users:
        got = rec.recommend(user, pool, 5)
        assert [it["item"] for it in got["items"]] == pool[:5]
        assert all(it["score"] == 0.0 for it in got["items"])  # NaN is answered as 0 (serving._num)
        assert rec._scores[catalog.unit_of(user)].finite is (kind == "ties")


def test_a_new_version_replaces_the_kept_scores_at_once(redis_client: redis.Redis) -> None:
    catalog = SyntheticCatalog(n_users=3, d=8, n_arms=200, seed=4)
    world = Published(redis_client, catalog, seed=5)
    rec = Recommender(redis_client, world.ns, catalog)  # meta_ttl 0: every request reads the version
    pool = [str(a) for a in range(0, 200, 7)]
    for version in (1, 2, 3):
        world.publish(version, pop=150 if version == 2 else None)  # the item term comes and goes with versions
        for user in ("0", "2"):
            got = rec.recommend(user, pool, 10)
            assert got["model_version"] == version
            world.check(got, user, pool, 10)  # never a previous version's scores


def _open_catalog(tmp_path: Path, n: int, d: int) -> OpenCatalog:
    rng = np.random.default_rng(n)
    lines = ["item,features"] + [f"i{j}," + " ".join(f"{v:.6f}" for v in rng.normal(size=d) * 0.3) for j in range(n)]
    (tmp_path / "items.csv").write_text("\n".join(lines) + "\n")
    return OpenCatalog(build_catalog(tmp_path, d=d, units=3, use_cache=False))


@pytest.mark.parametrize("whole_rows", [serving.SCORE_WHOLE_ROWS, 4])
def test_items_added_while_running_are_scored(redis_client: redis.Redis, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, whole_rows: int) -> None:
    # whole_rows 4: a catalog "larger" than SCORE_WHOLE_ROWS, scored only at the rows requests name
    monkeypatch.setattr(serving, "SCORE_WHOLE_ROWS", whole_rows)
    catalog = _open_catalog(tmp_path, 12, 5)
    world = Published(redis_client, catalog, seed=6)
    world.publish(1, pop=12)  # the item term covers the 12 built items
    rec = Recommender(redis_client, world.ns, catalog)
    user = "someone new"  # served by the public rule
    unit = catalog.unit_of(user)
    world.check(rec.recommend(user, ["i3", "i0", "i7"], 3), user, ["i3", "i0", "i7"], 3)
    assert int(rec._scores[unit].done.sum()) == (12 if whole_rows >= 12 else 3)
    added = catalog.add_items(["n0", "n1"], np.array([[0.5, 0, 0, 0, 0], [0, 0, 0.2, 0.1, 0]]))
    assert added == ["n0", "n1"]
    pool = ["n1", "i3", "n0", "i11"]  # new rows (no item-term sum: popularity 0) beside kept ones
    got = rec.recommend(user, pool, 4)
    world.check(got, user, pool, 4)
    assert {it["item"]: it["popularity"] for it in got["items"]}["n1"] == 0.0
    kept = rec._scores[unit]
    assert len(kept.done) == 14 and int(kept.done.sum()) == (14 if whole_rows >= 14 else 6)  # + n1, n0, i11
    # no candidates: every item ranked (OpenCatalog.rank_all), the answer's scores the kept ones
    everything = list(catalog.arm_ids)
    world.check(rec.recommend(user, None, 14), user, everything, 14)


def test_unknown_or_repeated_candidates_are_refused_before_scoring(redis_client: redis.Redis) -> None:
    catalog = SyntheticCatalog(n_users=2, d=4, n_arms=30, seed=7)
    world = Published(redis_client, catalog, seed=8)
    world.publish(1)
    rec = Recommender(redis_client, world.ns, catalog)
    for pool, field in ((["1", "no-such-item"], "candidates"), (["1", "1"], "candidates")):
        with pytest.raises(BadRequest) as err:
            rec.recommend("0", pool, 2)
        assert err.value.parameter == field
    assert not rec._scores  # nothing scored for a refused request
    world.check(rec.recommend("0", ["5", "1"], 2), "0", ["5", "1"], 2)


def test_the_kept_scores_stay_within_their_bound(redis_client: redis.Redis) -> None:
    catalog = SyntheticCatalog(n_users=6, d=6, n_arms=500, seed=9)
    world = Published(redis_client, catalog, seed=10)
    world.publish(1)
    per_unit = 500 * (3 * 8 + 1)  # mean, bonus, score (float64) and the done flag per item, no item term
    bound = 2 * per_unit + 100
    rec = Recommender(redis_client, world.ns, catalog, score_cache_bytes=bound)
    pool = [str(a) for a in range(0, 500, 3)]
    for user in ["0", "1", "2", "3", "4", "5", "1", "3", "0"]:
        world.check(rec.recommend(user, pool, 10), user, pool, 10)
        assert len(rec._scores) <= 2 and rec._scores_bytes <= bound
        assert rec._scores_bytes == sum(s.nbytes for s in rec._scores.values()) == per_unit * len(rec._scores)
        assert next(reversed(rec._scores)) == int(user)  # the unit just served is kept, the least recent went
    assert list(rec._scores) == [3, 0]
    tiny = Recommender(redis_client, world.ns, catalog, score_cache_bytes=0)  # still keeps the unit it serves
    for user in ["0", "1", "1"]:
        world.check(tiny.recommend(user, pool, 10), user, pool, 10)
        assert list(tiny._scores) == [int(user)]
