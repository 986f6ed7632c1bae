"""Private popularity under the local trust model (models.local.policy.LocalPopularity): the local twin's releases,
ranked by its items block alone — post-processing of exactly what the served twin's server releases."""

from __future__ import annotations

import numpy as np
import pytest

from models.local.items import codebook
from models.local.policy import LocalItemUCB, LocalPopularity

#: Eight items on the unit circle, symmetric about the prior's direction: pairs of them score alike, so the served
#: twin breaks ties (draws from its generator, which also seeds its devices): the case the baseline keeps in step.
F = np.stack([np.cos(np.arange(8) * 0.7), np.sin(np.arange(8) * 0.7)], axis=1)
#: Listens per item in the one batch of 400 distinct users: item 5 most, then 2, 7, 0; the rest never.
LISTENS = {5: 160, 2: 120, 7: 80, 0: 40}


def _twin(seed: int = 3) -> LocalItemUCB:
    """The local default's shape: the catalog as the codebook, served by the hierarchy, one batch of 400."""
    return LocalItemUCB(d=2, n_items=8, epsilon=4.0, batch=400, cap=1, seed=seed, share=0.0, hierarchy=True,
                        features=F, codewords=F, codes_are_items=True)


def _stream() -> list[tuple[str, int]]:
    """(user, listened item) for 400 distinct users, the items interleaved (a fixed order)."""
    items = [a for a, n in LISTENS.items() for _ in range(n)]
    order = np.random.default_rng(0).permutation(len(items))
    return [(f"u{i}", items[j]) for i, j in enumerate(order)]


def _run(policy: LocalItemUCB | LocalPopularity) -> list[int]:
    """Replay the stream (pools of four items, the listened one among them); the policy's picks."""
    picks = []
    for user, a in _stream():
        pool = np.array(sorted({a, (a + 1) % 8, (a + 3) % 8, (a + 6) % 8}))
        k = policy.select(0, F[pool], user=user, items=pool)
        picks.append(int(pool[k]))
        policy.update(0, F[pool[k]], float(pool[k] == a), user=user, item=a, x_item=F[a])
    return picks


def test_ranks_by_the_analyzers_item_estimate() -> None:
    """After the batch closes, every pool's pick is the item with the largest count the analyzer estimated
    (``state.items``, the items block), and at ε = 4 with 400 users that estimate orders the listened items as
    their true counts do."""
    twin = _twin()
    pop = LocalPopularity(twin, seed=3)
    _run(pop)
    assert twin.batches == 1 and twin.item_reports == 400
    estimate = twin.state.items
    assert estimate is not None
    np.testing.assert_array_equal(twin.sums, estimate)  # what it ranks by is the analyzer's release
    assert [int(a) for a in np.argsort(-estimate)[:4]] == [5, 2, 7, 0]
    for pool in ([0, 2, 5, 7], [1, 3, 4, 6], [0, 1, 2], [3, 7], [4, 5, 6]):
        pick = int(np.asarray(pool)[pop.select(0, F[pool], items=np.asarray(pool))])
        assert pick == pool[int(np.argmax(estimate[pool]))], pool


def test_no_estimate_yet_ties_are_broken_by_its_own_generator() -> None:
    """Before any batch every count is 0: the pick is a draw among the whole pool by the baseline's own generator
    (seeded: the same seed, the same pick; other seeds, other picks)."""
    picks = {LocalPopularity(_twin(), seed=s).select(0, F, items=np.arange(8)) for s in range(20)}
    assert len(picks) > 1
    assert len({LocalPopularity(_twin(), seed=1).select(0, F, items=np.arange(8)) for _ in range(5)}) == 1


def test_releases_exactly_what_the_served_twin_releases() -> None:
    """The same seed, the same stream: the twin behind the baseline releases the same items block and pool block,
    to the bit, as the twin that serves by the hierarchy (its devices, blanket and batches are the same), although
    the served twin breaks ties on the generator that seeds its devices and the baseline recommends otherwise."""
    served, behind = _twin(seed=5), _twin(seed=5)
    served_picks = _run(served)
    devices_only = np.random.default_rng(5)
    for _ in range(400):  # the 400 devices' seeds, and no tie
        devices_only.integers(2**62)
    assert served._rng.bit_generator.state != devices_only.bit_generator.state  # the served twin drew ties too
    assert _run(LocalPopularity(behind, seed=5)) != served_picks
    a, b = served.released_hierarchy(), behind.released_hierarchy()
    assert served.batches == behind.batches == 1
    assert served._rng.bit_generator.state == behind._rng.bit_generator.state  # the same devices' seeds drawn
    assert served.sums.tobytes() == behind.sums.tobytes() and served.b.tobytes() == behind.b.tobytes()
    assert (a.count, a.version) == (b.count, b.version)



def test_the_twins_own_picks_are_the_served_twins() -> None:
    """``twin_pick`` is what the served twin recommends in the same candidates: one run measures the local row and
    its local floor, paired (the frontier's single local job)."""
    served, behind = _twin(seed=5), _twin(seed=5)
    served_picks = _run(served)
    pop, twin_picks = LocalPopularity(behind, seed=5), []
    for user, a in _stream():
        pool = np.array(sorted({a, (a + 1) % 8, (a + 3) % 8, (a + 6) % 8}))
        k = pop.select(0, F[pool], user=user, items=pool)
        assert pop.twin_pick is not None
        twin_picks.append(int(pool[pop.twin_pick]))
        pop.update(0, F[pool[k]], float(pool[k] == a), user=user, item=a, x_item=F[a])
    assert twin_picks == served_picks


def test_needs_a_per_item_estimate() -> None:
    """k-means codewords estimate no item's count: the baseline is refused, not served from the clusters."""
    codes = codebook(F, 3, seed=0)
    twin = LocalItemUCB(d=2, n_items=8, epsilon=4.0, batch=400, cap=1, seed=0, share=0.0, hierarchy=True,
                        features=F, codewords=codes)
    with pytest.raises(ValueError, match="`twin` must release a per-item estimate .* got 3 codewords for 8 items"):
        LocalPopularity(twin, seed=0)
    with pytest.raises(ValueError, match="`items` must name the candidates"):
        LocalPopularity(_twin(), seed=0).select(0, F)


def test_the_served_twin_solves_as_its_batch_closes() -> None:
    """The served twin serves a batch's release from the batch's close, as the live worker (which releases within a
    poll of the fold), not a release tick later: with ``tick`` far beyond the stream, the model after the 400th
    report has solved the one batch (its count, its item term ranking the most listened item first)."""
    twin = LocalItemUCB(d=2, n_items=8, epsilon=4.0, batch=400, cap=1, seed=3, share=0.0, hierarchy=True,
                        features=F, codewords=F, codes_are_items=True, tick=10**9)
    before = twin.item_scores.copy()
    _run(twin)
    assert twin.batches == 1
    assert twin.info["count"] == pytest.approx(400.0)  # the solve saw the closed batch
    assert int(np.argmax(twin.item_scores)) == 5
    assert not np.array_equal(twin.item_scores, before)


def test_the_non_private_twin_moves_an_items_term_at_each_report() -> None:
    """Without privacy each report is its own batch: the twin solves the first and then moves the reported item's
    term at every report (``log((c + 1) / c)`` above the item level's floor), every other item's term unchanged,
    between the content levels' solves every ``tick``. So a count ranks as soon as it is made: with ``tick`` beyond
    the stream, the most listened item tops a pool of all eight after the stream, whose content ranks it otherwise,
    and the terms agree with a full solve of the same exact release up to the pooled tilt it refits."""
    twin = LocalItemUCB(d=2, n_items=8, epsilon=4.0, batch=400, cap=1, seed=3, share=0.0, hierarchy=True,
                        features=F, private=False, tick=10**9)
    prior_pick = twin.select(0, F, items=np.arange(8))
    _run(twin)
    assert twin.info["count"] == pytest.approx(1.0)  # the one solve: the first report's
    assert twin.sums.tolist() == [float(LISTENS.get(a, 0)) for a in range(8)]
    assert prior_pick != 5 and twin.select(0, F, items=np.arange(8)) == 5
    # one more report of item 2: its term alone moves, by log((c + 1) / c)
    before, c = twin.item_scores.copy(), twin.sums[2]
    twin.update(0, F[2], 1.0, user="new", item=2, x_item=F[2])
    moved = twin.item_scores - before
    assert moved[2] == pytest.approx(np.log((c + 1.0) / c))
    assert np.count_nonzero(moved) == 1
    # against a full solve of the exact counts: each listened item's log rate (``x_a . theta + term_a``: its count's
    # log above the floor) differs from the full solve's by one constant (the normalisers), the tilt refitted or not
    full = LocalItemUCB(d=2, n_items=8, epsilon=4.0, batch=400, cap=1, seed=3, share=0.0, hierarchy=True,
                        features=F, private=False, tick=10**9)
    full.sums, full.b, full.item_reports, full.batches = twin.sums.copy(), twin.b.copy(), twin.item_reports, 2
    full._solve()
    listened = sorted(LISTENS)
    log_rate = (F @ twin.theta[0] + twin.item_scores)[listened]
    assert np.ptp(log_rate - (F @ full.theta[0] + full.item_scores)[listened]) < 1e-9
