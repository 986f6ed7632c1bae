"""Popularity: the obvious baseline, its private release, and bandits that use it.

A recommender that learns only from the 25-d tag features of the artists cannot know which artist
is popular, and on LastFM a plain counter of positives beats every such model. This module gives

* :class:`OnlinePopularity` — the counter (non-private): recommend the candidate with the most
  positives seen so far, over all users or per unit (cluster); ties at random;
* :class:`PrivatePopularity` — private popularity at user level: each user's positives of a release tick become
  their item shares (L1 norm ``<= 1``), at most ``cap`` ticks per user and epoch, the ``K`` item sums released
  through one mechanism with the whole budget; candidates rank by the released sums (the floor a private model
  must clear, ``privrec experiment frontier``);
* :class:`PopularityUCB` — a bandit of :mod:`models.policies` plus an *item term*: every candidate
  ``a`` scores ``x_a^T theta_u + alpha ||x_a||_{C_u} + weight * pop_a``, where ``pop_a`` is
  :func:`models.ground.items.popularity_feature` of the item's **released** reward sum. The sums are
  released through a continual-release mechanism every ``item_tick`` interactions; with
  ``base=None`` it is the *privately released popularity* baseline (the item term alone).

Information: every interaction gives the recommended item's reward to the bandit (bandit feedback)
and to the item sums; :meth:`observe` adds an *organic* positive — a logged listen of an item that
was not recommended — to the item sums (the same information the counter uses) and, with weight
``listen_weight``, to the bandit as a positive example of the listener's unit.

The item term's weight shrinks with the noise of the released sums, ``weight / (1 + (std / noise_scale)**2)``
(``std`` is public: a function of the calibration and the tick count): noisy item sums would only
mislead, so under strong privacy the model leans on the bandit.

Privacy (event level, replace-one): one interaction changes one item's sum by at most 1 (L2
sensitivity 1 for the ``K``-vector) and the bandit statistic by its own sensitivity. The two releases
are Gaussian with exact Gaussian-DP accounting and compose to ``sqrt(mu_b**2 + mu_s**2)``-GDP;
:func:`make_popularity_policy` splits the ``(epsilon, delta)`` budget with
:func:`models.accounting.split_epsilon` so that the pair is exactly ``(epsilon, delta)``-DP.

Examples
--------
>>> import numpy as np
>>> pop = OnlinePopularity(n_items=3, seed=0)
>>> pop.observe(0, 2); pop.observe(1, 2); pop.observe(0, 1)
>>> pop.select(0, np.zeros((3, 1)), np.array([0, 1, 2]))
2
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from models.accounting import split_epsilon
from models.ground.items import popularity_feature
from models.mechanisms import Mechanism, TreeState, make_mechanism, noise_std
from models.mechanisms.participation import B_CLIP, ITEM_CLIP, participation_factor, replace_sensitivity
from models.streaming.hierarchy import item_shares

from .kronecker import KroneckerUCB

__all__ = ["OnlinePopularity", "PrivatePopularity", "argmax_random", "capped_ticks", "PopularityUCB", "make_popularity_policy", "EXACT_MECHANISMS", "LISTEN_WEIGHT"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Default weight of an organic positive in the bandit, by privacy (chosen on held-out LastFM events).
LISTEN_WEIGHT = {"none": 0.2, "private": 1.0}

#: Mechanisms with exact Gaussian-DP accounting: their releases compose by ``sqrt(sum mu**2)``.
EXACT_MECHANISMS = ("gaussian-exact", "honaker-exact", "smooth-exact", "blt-exact", "user-gaussian-exact",
                    "user-honaker-exact", "user-blt-exact")


def argmax_random(scores: FloatArray, rng: np.random.Generator) -> int:
    """The index of the largest score (within 1e-12), ties broken at random by ``rng`` (the policies' rule)."""
    best = np.flatnonzero(scores >= scores.max() - 1e-12)
    return int(best[0] if len(best) == 1 else rng.choice(best))


def capped_ticks(buffer: list[tuple[int, int, int, float]], participations: dict[tuple[int, int], int], epoch: int,
                 cap: int) -> tuple[list[tuple[int, dict[int, float]]], int]:
    """A release tick's positives ``(user, unit, item, reward)`` as one ``(unit, {item: summed reward})`` per user
    (in order of first appearance), each user's tick kept while they are under ``cap`` ticks in ``epoch``
    (``participations`` counts them, updated in place); also the number of users dropped at the cap.

    >>> seen = {}
    >>> capped_ticks([(1, 0, 5, 1.0), (2, 3, 6, 1.0), (1, 0, 5, 0.5)], seen, 0, 1)
    ([(0, {5: 1.5}), (3, {6: 1.0})], 0)
    >>> capped_ticks([(1, 0, 7, 1.0)], seen, 0, 1)
    ([], 1)
    """
    by_user: dict[int, tuple[int, dict[int, float]]] = {}
    for user, unit, item, r in buffer:
        items = by_user.setdefault(user, (unit, {}))[1]
        items[item] = items.get(item, 0.0) + r
    kept, dropped = [], 0
    for user, tick in by_user.items():
        key = (user, epoch)
        if participations.get(key, 0) >= cap:
            dropped += 1
            continue
        participations[key] = participations.get(key, 0) + 1
        kept.append(tick)
    return kept, dropped


class OnlinePopularity:
    """Recommend the candidate with the most positives seen so far (no model, no privacy).

    Parameters
    ----------
    n_items
        Catalog size ``K`` (items are ``0..K-1``).
    n_units
        Units (e.g. clusters) when ``per_unit``; ignored otherwise.
    per_unit
        Count each unit's positives apart (popularity per cluster).
    seed
        Seed of the random tie-breaking.
    """

    def __init__(self, n_items: int, *, n_units: int = 1, per_unit: bool = False, seed: int = 0) -> None:
        if int(n_items) < 1:
            raise ValueError(f"`n_items` must be positive, got {n_items}.")
        self.per_unit = bool(per_unit)
        self.counts = np.zeros((int(n_units) if per_unit else 1, int(n_items)))
        self.rng = np.random.default_rng(seed)

    def _row(self, user: int) -> int:
        return int(user) if self.per_unit else 0

    def select(self, user: int, contexts: FloatArray, items: IntArray) -> int:
        return argmax_random(self.counts[self._row(user), np.asarray(items)], self.rng)

    def update(self, user: int, context: FloatArray, reward: float, item: int) -> None:
        self.counts[self._row(user), int(item)] += float(reward)

    def observe(self, user: int, item: int, reward: float = 1.0) -> None:
        self.counts[self._row(user), int(item)] += float(reward)


class PrivatePopularity:
    """Private popularity at user level: released item sums of the users' per-tick item shares, ranked.

    Every ``tick`` interactions, each user's positives of the tick (bandit rewards and organic listens) become one
    contribution, their shares of the items ``min(1, total) w_a / total`` (L1 and L2 norm ``<= 1``; the items block of
    :func:`models.streaming.hierarchy.contribution`); a user contributes to at most ``cap`` ticks per epoch of
    ``capacity`` ticks (later ticks of theirs are dropped, counted in ``dropped``). The ``K`` sums are released through
    ``mechanism`` after every tick with the whole budget, and a candidate's score is its released sum (ties at random).
    ``epsilon = inf``: no noise, no cap (online popularity over the same shares).

    Privacy: replace neighbours (one user's whole history against another's). One tick's contribution has L2
    sensitivity ``sqrt(2)`` (two nonnegative vectors of L2 norm ``<= 1``); ``cap`` ticks per user and epoch enter
    through :func:`models.mechanisms.participation.participation_factor` (the mechanism's exact multi-participation
    sensitivity), so a capped user's epoch is ``(epsilon, delta)``-DP, the calibration of
    :class:`models.policies.hierarchy.HierarchicalUCB`'s items block with all of the budget.

    ``sites > 1``: private popularity under the federated trust model, as
    :class:`~models.policies.hierarchy.HierarchicalUCB` splits users (unit ``u`` belongs to site ``u mod sites``):
    each site releases its own users' sums with its own mechanism (its own noise, the same calibration), and the
    score is the sum of the sites' releases. A user belongs to one site, so the guarantee is each site's.

    Parameters
    ----------
    n_items
        Catalog size ``K``.
    epsilon, delta
        A capped user's guarantee per epoch (``epsilon = inf``: no noise, no cap).
    cap
        Ticks per epoch one user contributes to.
    tick
        Interactions (calls of :meth:`update`) per release.
    capacity
        Ticks per epoch (the mechanism's horizon).
    mechanism
        A mechanism of :data:`models.mechanisms.MECHANISMS` (default ``blt-exact``).
    seed
        Seed of the noise keys and of the random tie-breaking.

    Examples
    --------
    >>> import numpy as np
    >>> pop = PrivatePopularity(3, epsilon=float("inf"), tick=2)
    >>> pop.begin_event("a"); pop.update(0, np.zeros(1), 0.0, 0); pop.observe(0, 2)
    >>> pop.begin_event("b"); pop.update(0, np.zeros(1), 1.0, 2)
    >>> pop.released.tolist(), pop.select(0, np.zeros((3, 1)), np.array([0, 1, 2]))
    ([0.0, 0.0, 2.0], 2)
    >>> noisy = PrivatePopularity(3, epsilon=1.0, seed=0)
    >>> round(noisy.sensitivity, 4)   # sqrt(2) per tick, one tick per user and epoch
    1.4142
    """

    def __init__(self, n_items: int, *, epsilon: float, delta: float = 1e-5, cap: int = 1, tick: int = 100,
                 capacity: int = (1 << 14) - 1, mechanism: str = "blt-exact", seed: int = 0,
                 sites: int = 1) -> None:
        if int(n_items) < 1:
            raise ValueError(f"`n_items` must be positive, got {n_items}.")
        if not epsilon > 0:
            raise ValueError(f"`epsilon` must be positive, got {epsilon}.")
        if int(cap) < 1:
            raise ValueError(f"`cap` must be a positive number of ticks, got {cap}.")
        if int(tick) < 1:
            raise ValueError(f"`tick` must be a positive number of interactions, got {tick}.")
        if int(sites) < 1:
            raise ValueError(f"`sites` must be a positive number of sites, got {sites}.")
        self.n_items, self.epsilon, self.delta, self.sites = int(n_items), float(epsilon), float(delta), int(sites)
        self.private = not math.isinf(epsilon)
        self.cap = int(cap) if self.private else 1 << 62
        self.tick, self.capacity, self.seed = int(tick), int(capacity), int(seed)
        self.mechanism: Mechanism | None = None
        self.sensitivity = 0.0
        if self.private:
            tick_sensitivity = replace_sensitivity(ITEM_CLIP, signed=False)
            one = make_mechanism(mechanism, dim=self.n_items, sensitivity=tick_sensitivity, epsilon=epsilon,
                                 delta=delta, horizon=self.capacity, seed=seed, stream=5)
            self.sensitivity = tick_sensitivity * participation_factor(one, self.cap)
            self.mechanisms = [make_mechanism(mechanism, dim=self.n_items, sensitivity=self.sensitivity,
                                              epsilon=epsilon, delta=delta, horizon=self.capacity, seed=seed,
                                              stream=5 if site == 0 else 200 + site)
                               for site in range(self.sites)]
            self.mechanism = self.mechanisms[0]
            self.states = [m.init_state() for m in self.mechanisms]
        self.rng = np.random.default_rng(seed)
        self.site_exact = np.zeros((self.sites, self.n_items))  # each site's own users' sums
        self.exact = np.zeros(self.n_items)
        self.released = np.zeros(self.n_items)
        self.released_std = 0.0
        self.user = 0
        self.buffer: list[tuple[int, int, int, float]] = []  # (user, unit, item, reward)
        self.participations: dict[tuple[int, int], int] = {}
        self.seen = self.ticks = self.dropped = 0

    def begin_event(self, user: int | str) -> None:
        """The next interaction's user (a user-level policy caps users, not events)."""
        self.user = hash(user) if isinstance(user, str) else int(user)

    def select(self, unit: int, contexts: FloatArray, items: IntArray) -> int:
        return argmax_random(self.released[np.asarray(items)], self.rng)

    def update(self, unit: int, context: FloatArray, reward: float, item: int) -> None:
        """Bandit feedback: the recommended ``item`` got ``reward`` (a positive counts)."""
        if reward > 0:
            self.buffer.append((self.user, int(unit), int(item), float(reward)))
        self.seen += 1
        if self.seen % self.tick == 0:
            self.fold()

    def observe(self, unit: int, item: int, reward: float = 1.0) -> None:
        """An organic positive (a logged listen of an item that was not recommended)."""
        if reward > 0:
            self.buffer.append((self.user, int(unit), int(item), float(reward)))

    def fold(self) -> None:
        """One release tick: every user's shares of the tick, capped, then the release."""
        kept, dropped = capped_ticks(self.buffer, self.participations, self.ticks // self.capacity, self.cap)
        self.buffer = []
        self.dropped += dropped
        for unit, w in kept:
            for item, share in item_shares(w).items():
                self.site_exact[unit % self.sites, item] += share
                self.exact[item] += share
        if self.mechanism is None:
            self.released = self.exact.copy()
        else:
            released = np.zeros(self.n_items)
            for site, mech in enumerate(self.mechanisms):
                y, self.states[site], _ = mech.step_to(self.states[site], self.site_exact[site].copy())
                released += y
            self.released = released
            self.released_std = noise_std(self.mechanism, self.states[0]) * math.sqrt(self.sites)
        self.ticks += 1


class PopularityUCB:
    """A bandit plus an item term from privately released item reward sums (see the module docstring).

    Parameters
    ----------
    base
        The bandit (``KroneckerUCB``: LinUCB, CoLin, GOB.Lin, private or not), or ``None`` for the
        item term alone (private popularity).
    n_items
        Catalog size ``K``.
    weight
        Weight of the item term (the bandit's scores are rewards in ``[0, 1]`` plus a bonus).
    item_mechanism
        Mechanism over the ``K`` item sums (sensitivity 1), or ``None`` for no noise.
    item_tick
        Interactions (calls of :meth:`update`) per release of the item sums.
    threshold_stds
        ``tau`` of the feature in units of the release's noise std (public): released sums within
        ``tau`` of zero count as zero.
    listen_weight
        Weight (in ``[0, 1]``) of an organic positive in the bandit: it updates the listener's unit
        with ``sqrt(w) x`` and reward ``sqrt(w)`` (a weighted ridge sample; the sensitivity stays ``Lx``).
    noise_scale
        The item term's weight is ``weight / (1 + (std / noise_scale)**2)``.
    seed
        Seed of the random tie-breaking.
    """

    def __init__(self, base: KroneckerUCB | None, n_items: int, *, weight: float = 1.0,
                 item_mechanism: Mechanism | None = None, item_tick: int = 100, threshold_stds: float = 1.0,
                 listen_weight: float = 0.0, noise_scale: float = 2.0, features: FloatArray | None = None,
                 seed: int = 0) -> None:
        if int(n_items) < 1:
            raise ValueError(f"`n_items` must be positive, got {n_items}.")
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"`weight` must be a non-negative number, got {weight}.")
        if int(item_tick) < 1:
            raise ValueError(f"`item_tick` must be a positive number of interactions, got {item_tick}.")
        if item_mechanism is not None and item_mechanism.dim != int(n_items):
            raise ValueError(f"`item_mechanism` must release {n_items} values, got dim {item_mechanism.dim}.")
        if not (threshold_stds >= 0 and math.isfinite(threshold_stds)):
            raise ValueError(f"`threshold_stds` must be non-negative, got {threshold_stds}.")
        if not 0.0 <= listen_weight <= 1.0:
            raise ValueError(f"`listen_weight` must be in [0, 1], got {listen_weight}.")
        if not noise_scale > 0:
            raise ValueError(f"`noise_scale` must be positive, got {noise_scale}.")
        if listen_weight > 0 and (base is None or features is None):
            raise ValueError("`listen_weight` > 0 needs a `base` bandit and the items' `features`.")
        self.listen_weight, self.noise_scale = float(listen_weight), float(noise_scale)
        self.features = None if features is None else np.asarray(features, dtype=np.float64)
        self.base, self.n_items, self.weight = base, int(n_items), float(weight)
        self.item_mechanism, self.item_tick, self.threshold_stds = item_mechanism, int(item_tick), float(threshold_stds)
        self.rng = np.random.default_rng(seed)
        self.sums = np.zeros(self.n_items)
        self.released = np.zeros(self.n_items)
        self.released_total = 0
        self.released_std = 0.0
        self.item_state: TreeState | None = None if item_mechanism is None else item_mechanism.init_state()
        self.t = 0
        self._pop = np.zeros(self.n_items)

    @property
    def item_weight(self) -> float:
        """The item term's weight now: ``weight / (1 + (std / noise_scale)**2)`` (public)."""
        return self.weight / (1.0 + (self.released_std / self.noise_scale) ** 2)

    def scores(self, user: int, contexts: FloatArray, items: IntArray) -> FloatArray:
        """``mean + bonus + item_weight * pop`` per candidate (just the item term without a base)."""
        item_term = self.item_weight * self._pop[np.asarray(items)]
        if self.base is None:
            return item_term
        mean, bonus = self.base.scores(user, contexts)
        out: FloatArray = mean + bonus + item_term
        return out

    def select(self, user: int, contexts: FloatArray, items: IntArray) -> int:
        return argmax_random(self.scores(user, contexts, items), self.rng)

    def update(self, user: int, context: FloatArray, reward: float, item: int) -> None:
        """Bandit feedback: the recommended ``item`` got ``reward``."""
        if self.base is not None:
            self.base.update(user, context, reward)
        self.sums[int(item)] += float(reward)
        self.t += 1
        if self.t % self.item_tick == 0:
            self.release_items()

    def observe(self, user: int, item: int, reward: float = 1.0) -> None:
        """An organic positive (a logged listen of an item that was not recommended).

        It adds to the item sums, and to the bandit with weight ``listen_weight``.
        """
        self.sums[int(item)] += float(reward)
        if self.listen_weight > 0:  # the user's own choice: b only, never the public Gram matrix (DESIGN §2)
            assert self.base is not None and self.features is not None
            self.base.update(user, self.features[int(item)], self.listen_weight * float(reward), gram=False)

    def release_items(self) -> None:
        """One release of the item sums (noisy prefix sums; the noise is never redrawn)."""
        if self.item_mechanism is None:
            self.released = self.sums.copy()
            self.released_std = 0.0
        else:
            assert self.item_state is not None
            self.released, self.item_state, _ = self.item_mechanism.step_to(self.item_state, self.sums.copy())
            self.released_std = noise_std(self.item_mechanism, self.item_state)
        self.released_total = self.t
        self._pop = popularity_feature(self.released, total=self.released_total,
                                       threshold=self.threshold_stds * self.released_std)


def make_popularity_policy(base: str | None, *, d: int, W: FloatArray, n_items: int, epsilon: float = math.inf,
                           delta: float = 1e-5, share: float = 0.5, mechanism: str = "user-blt-exact",
                           item_mechanism: str = "blt-exact", weight: float = 1.0, item_tick: int = 100,
                           threshold_stds: float = 2.0, horizon: int = 10_000, item_horizon: int | None = None,
                           listen_weight: float | None = None, noise_scale: float = 2.0,
                           features: FloatArray | None = None, item_sensitivity_scale: float | None = None,
                           seed: int = 0, **base_kw: Any) -> PopularityUCB:
    """A :class:`PopularityUCB` whose two releases together are ``(epsilon, delta)``-DP.

    ``base`` is a name of :data:`models.policies.ALGORITHMS` (its private twin is used when
    ``epsilon`` is finite: ``"LinUCB"`` → ``"DP-LinUCB"``), or ``None`` for private popularity alone
    (the whole budget goes to the items). ``share`` is the bandit's part of ``mu**2``
    (:func:`models.accounting.split_epsilon`). ``item_horizon`` is the item releases per epoch
    (default ``horizon // item_tick``). Both mechanisms must have exact Gaussian-DP accounting
    (:data:`EXACT_MECHANISMS`): that is what makes the composition exact.

    ``listen_weight`` ``None`` chooses by privacy (:data:`LISTEN_WEIGHT`): noisy statistics need every
    positive; without noise the item term carries popularity and listens mostly bias the content term.
    """
    from .registry import make_policy

    # event level, neighbours replace one interaction (its reward and the user's choice): sensitivities 2 (b) and
    # sqrt(2) (the nonnegative item sums), as the pipeline calibrates them; a caller (the user-level twin) may
    # pass its own scales
    if item_sensitivity_scale is None:
        item_sensitivity_scale = replace_sensitivity(ITEM_CLIP, signed=False)
    if base is not None and base_kw.get("sensitivity_scale") is None:
        base_kw["sensitivity_scale"] = replace_sensitivity(B_CLIP, signed=True)
    private = not math.isinf(epsilon)
    if private and (mechanism not in EXACT_MECHANISMS or item_mechanism not in EXACT_MECHANISMS):
        raise ValueError(f"`mechanism` and `item_mechanism` must be among {EXACT_MECHANISMS} (exact Gaussian-DP "
                         f"accounting composes them exactly), got {mechanism!r} and {item_mechanism!r}.")
    if base is None:
        eps_base, eps_items = math.inf, epsilon
    elif weight == 0:  # no item term: nothing to release for it, the bandit keeps the whole budget
        eps_base, eps_items = epsilon, math.inf
    else:
        eps_base, eps_items = split_epsilon(epsilon, delta, share) if private else (math.inf, math.inf)
    policy: KroneckerUCB | None = None
    if base is not None:
        name = base if not private or base.startswith(("DP-", "LDP-")) else f"DP-{base}"
        policy = make_policy(name, d=d, W=W, epsilon=eps_base, delta=delta, mechanism=mechanism, horizon=horizon,
                             seed=seed, **base_kw)
    items: Mechanism | None = None
    if private and not math.isinf(eps_items):
        ticks = item_horizon or max(1, -(-horizon // item_tick))
        items = make_mechanism(item_mechanism, dim=n_items, sensitivity=item_sensitivity_scale, epsilon=eps_items,
                               delta=delta, horizon=ticks, seed=seed, stream=7)
    if listen_weight is None:
        listen_weight = 0.0 if base is None or features is None else LISTEN_WEIGHT["private" if private else "none"]
    return PopularityUCB(policy, n_items, weight=weight, item_mechanism=items, item_tick=item_tick,
                         threshold_stds=threshold_stds, listen_weight=listen_weight, noise_scale=noise_scale,
                         features=features, seed=seed)
