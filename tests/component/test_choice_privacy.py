"""Issue 19: what a user chose never reaches a public statistic; sensitivities match the replace relation; one
partition per user.

The Gram matrix is released exactly (public), so it must not depend on which shown item a user acted on, nor
on an organic listen; ``b`` and the item sums carry the choice and are released through noise calibrated to
the difference of two replacing contributions.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from models.mechanisms import make_mechanism
from models.mechanisms.participation import B_CLIP, ITEM_CLIP, clip_scale, replace_sensitivity
from pipeline.data.catalog import SyntheticCatalog
from pipeline.config.keys import partition_of
from pipeline.data.records import parse_batch
from pipeline.config.settings import Settings
from pipeline.release.statements import privacy_statement, user_level_statement
from pipeline.state.userlevel import Contribution

CAT = SyntheticCatalog(n_users=6, d=4, n_arms=30, seed=0)


def _event(i: int, user: str, arm: str, reward: float, **extra: object) -> bytes:
    return json.dumps({"event_id": f"e{i}", "user": user, "arm": arm, "reward": reward, **extra}).encode()


def test_a_feedback_adds_every_shown_item_to_the_gram_and_only_the_chosen_one_to_b() -> None:
    shown = ["3", "7", "11"]
    parsed = parse_batch([_event(0, "1", "7", 1.0, shown=shown)], CAT)
    assert not parsed.dead
    np.testing.assert_array_equal(parsed.gram_contexts, CAT.feature_matrix[[3, 7, 11]])
    assert parsed.gram_events.tolist() == [0, 0, 0]
    np.testing.assert_array_equal(parsed.contexts[0], CAT.feature_matrix[7])  # b's row: the chosen item


def test_neighbours_that_choose_differently_from_the_same_lists_have_the_same_gram() -> None:
    """Two streams: the same users shown the same lists; other items chosen, other rewards, and a listen of another
    item. The Gram rows (the public part) are identical; only b's rows and rewards differ."""
    lists = [["1", "2", "3"], ["4", "5"], ["6", "7", "8", "9"]]
    a = [_event(0, "1", "1", 1.0, shown=lists[0]), _event(1, "2", "4", 0.0, shown=lists[1]),
         _event(2, "1", "9", 1.0, shown=lists[2]), _event(3, "1", "20", 1.0, kind="listen")]
    b = [_event(0, "1", "3", 0.0, shown=lists[0]), _event(1, "2", "5", 1.0, shown=lists[1]),
         _event(2, "1", "6", 0.5, shown=lists[2]), _event(3, "1", "25", 1.0, kind="listen")]
    pa, pb = parse_batch(a, CAT), parse_batch(b, CAT)
    assert not pa.dead and not pb.dead
    np.testing.assert_array_equal(pa.gram_contexts, pb.gram_contexts)
    np.testing.assert_array_equal(pa.gram_events, pb.gram_events)
    assert 3 not in pa.gram_events.tolist()  # the listen has no Gram row
    assert not np.array_equal(pa.contexts, pb.contexts)


@pytest.mark.parametrize("extra, reason", [
    ({"shown": ["1", "2"]}, "arm '7' is not in the shown list"),
    ({"shown": []}, "shown must be a non-empty list"),
    ({"shown": "7"}, "shown must be a non-empty list"),
    ({"shown": ["7", "no-such-item"]}, "shown: unknown arm"),
    ({"shown": ["7"], "kind": "listen"}, "a listen answers no shown list"),
])
def test_a_bad_shown_list_is_dead_lettered_with_the_reason(extra: dict[str, object], reason: str) -> None:
    parsed = parse_batch([_event(0, "1", "7", 1.0, **extra)], CAT)
    assert len(parsed.dead) == 1 and reason in parsed.dead[0][1]


def test_an_event_on_another_users_partition_is_dead_lettered() -> None:
    """A producer keying by something other than the user would spread one user's cap over partitions."""
    home = partition_of("1", 4)
    other = (home + 1) % 4
    ok = parse_batch([_event(0, "1", "7", 1.0)], CAT, partition=home, partitions=4)
    bad = parse_batch([_event(0, "1", "7", 1.0)], CAT, partition=other, partitions=4)
    assert not ok.dead and len(ok.users) == 1
    assert len(bad.dead) == 1 and not bad.users
    assert f"belongs to partition {home}" in bad.dead[0][1] and f"arrived on {other}" in bad.dead[0][1]


def test_partition_of_is_kafkas_default_partitioner_on_the_user_key() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    part = DefaultPartitioner()
    for user in ["0", "1", "42", "user-ß", "x" * 100]:
        assert partition_of(user, 4) == part(user.encode(), [0, 1, 2, 3], [0, 1, 2, 3])


def test_the_user_level_fold_of_neighbours_differs_only_in_b_and_never_beyond_the_calibrated_difference() -> None:
    """Through the worker's per-user accumulation (the real code), two neighbouring ticks of one user: the Gram is
    the same, and after clipping b differs by at most 2 b_clip (the sensitivity the release is calibrated to)."""
    from pipeline.ingestion.ingest import UserIngestProcessor

    proc = object.__new__(UserIngestProcessor)
    proc.listen_weight, proc.n_items = 1.0, 30
    # contexts of both signs: rewards (1, 0) against (0, 1) on two items pointing opposite ways
    cat = SyntheticCatalog(n_users=2, d=2, n_arms=2, seed=0)
    cat._features = np.array([[1.0, 0.0], [-1.0, 0.0]])  # noqa: SLF001 - a worst case of the public catalog
    shown = ["0", "1"]
    a = parse_batch([_event(0, "1", "0", 1.0, shown=shown), _event(1, "1", "1", 0.0, shown=shown)], cat)
    b = parse_batch([_event(0, "1", "0", 0.0, shown=shown), _event(1, "1", "1", 1.0, shown=shown)], cat)
    ca: dict[str, Contribution] = {}
    cb: dict[str, Contribution] = {}
    proc._fold_users(ca, a, 2)
    proc._fold_users(cb, b, 2)
    np.testing.assert_array_equal(ca["1"].gram, cb["1"].gram)
    ba = clip_scale(float(np.linalg.norm(ca["1"].b)), B_CLIP) * ca["1"].b
    bb = clip_scale(float(np.linalg.norm(cb["1"].b)), B_CLIP) * cb["1"].b
    assert np.linalg.norm(ba - bb) == pytest.approx(2 * B_CLIP)  # the worst case is reached ...
    assert np.linalg.norm(ba - bb) <= replace_sensitivity(B_CLIP, signed=True) + 1e-12  # ... and covered


def test_nonnegative_item_vectors_differ_by_at_most_sqrt2_times_the_clip() -> None:
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(2000):
        u, v = rng.random(5) * rng.integers(0, 2, 5), rng.random(5) * rng.integers(0, 2, 5)
        u *= clip_scale(float(np.linalg.norm(u)), ITEM_CLIP)
        v *= clip_scale(float(np.linalg.norm(v)), ITEM_CLIP)
        worst = max(worst, float(np.linalg.norm(u - v)))
    assert worst <= replace_sensitivity(ITEM_CLIP, signed=False) + 1e-12
    e1, e2 = np.eye(2) * ITEM_CLIP  # disjoint items at the clip: the bound is attained
    assert np.linalg.norm(e1 - e2) == pytest.approx(replace_sensitivity(ITEM_CLIP, signed=False))


@pytest.mark.parametrize("unit", ["user", "event"])
def test_the_statement_names_each_statistic_its_clip_and_its_replace_sensitivity(unit: str) -> None:
    s = Settings(catalog="synthetic", item_weight=1.0, privacy_unit=unit, epsilon=2.0)
    b_mech = make_mechanism(s.mechanism, dim=4, sensitivity=2.0, epsilon=s.epsilons()[0], delta=s.delta,
                            horizon=s.tree_ticks, seed=0, mixing=np.eye(1), block_dim=4)
    i_mech = make_mechanism("blt-exact", dim=5, sensitivity=math.sqrt(2), epsilon=s.epsilons()[1], delta=s.delta,
                            horizon=s.tree_ticks, seed=0, stream=7)
    st = privacy_statement(s, b_mech, None, i_mech)
    if unit == "user":
        st = user_level_statement(s, st, lambda k: k / s.user_cap, b_mech, i_mech)
    stats = {x["name"]: x for x in st["statistics"]}
    assert stats["b"]["clip"] == B_CLIP and stats["b"]["sensitivity_per_tick"] == 2 * B_CLIP
    assert stats["items"]["sensitivity_per_tick"] == pytest.approx(math.sqrt(2) * ITEM_CLIP)
    assert "exactly" in stats["gram"]["released"] and "never on the choice" in stats["gram"]["released"]
    assert "replace" in st["neighbours"] and "choice" in st["neighbours"]
    assert any("which of the shown items" in p for p in st["protected"])
    assert any("Gram" in p for p in st["public"])
    # the two statistics compose to the stated total: mu**2 adds up
    mu = math.hypot(stats["b"]["mu"], stats["items"]["mu"])
    from models.accounting import gdp_mu
    assert mu == pytest.approx(gdp_mu(st["epsilon"], st["delta"]), rel=1e-6)
