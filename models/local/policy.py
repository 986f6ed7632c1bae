"""The local mode's offline twin: every user runs :class:`~models.local.LocalClient`, the server sums.

:class:`LocalUCB` is what ``privrec experiment modes`` runs for the local rows: a device per user
(their own exact statistic and noise; the real client code), the server's analyzer — the fold the worker
runs, :class:`~models.local.analyzer.Analyzer` (with shuffling, the :class:`Shuffler` in front of it) — and
LinUCB per model unit solved from the released sums (:func:`~models.local.analyzer.released_stats`, as the
worker's release) every ``tick`` reports, with the ridge ``lambda + kappa * noise_std`` of the sums (the
pipeline's :func:`models.streaming.solve`, post-processing of public values). Shuffled reports count
only once their batch is complete. At user level a device refuses interactions past its cap or budget
(:class:`~models.local.client.ReportRefused`, counted in ``refused``); a run is one epoch.

>>> import numpy as np
>>> from models.local import LocalConfig
>>> pol = LocalUCB(d=2, n_units=1, config=LocalConfig(algorithm="round", d=2, epsilon=5.0), tick=2, seed=0)
>>> X = np.eye(2)
>>> k = pol.select(0, X)
>>> pol.update(0, X[k], 1.0, user="a"); pol.update(0, X[k], 1.0, user="b")
>>> int(pol.state.count.sum()), pol.solves
(2, 1)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from models.ground.items import popularity_feature
from models.ground.linalg import ucb_scores, ucb_scores_blas
from models.policies.popularity import argmax_random
from models.streaming import ReleasedStats, solve
from models.streaming.hierarchy import ReleasedHierarchy, prior_direction, solve_hierarchy

from .aggregate import clip_context
from .analyzer import Analyzer, AnalyzerState, Batches, DeadLetter, Reports, merge, released_stats
from .client import LocalClient, MemoryStorage, ReportRefused
from .config import LocalConfig
from .shuffle import POPULATION, ShuffledBatch, Shuffler

__all__ = ["LocalUCB", "LocalItemUCB"]

FloatArray = NDArray[np.float64]


def _RUN_CLOCK() -> float:
    """A run is one user-level epoch (the replays last minutes; an epoch, hours): the same for every seed."""
    return 0.0


class LocalUCB:
    """LinUCB per unit over the sums of the users' local reports (see the module docstring).

    ``select(unit, X)`` / ``update(unit, x, r, user=...)`` like the other policies; ``user``
    (default: the unit) names the device. Seeds of the devices derive from ``seed``. ``codebook`` (with
    ``config.codewords``): the public codebook; devices report listens as codewords, batched population-wide.
    """

    per_user = True

    def __init__(self, *, d: int, n_units: int, config: LocalConfig, tick: int, seed: int, lambda_: float = 1.0,
                 alpha: float = 0.3, noise_ridge: float = 0.0, prior: FloatArray | None = None,
                 prior_strength: float = 0.0, codebook: FloatArray | None = None) -> None:
        if config.d != d:
            raise ValueError(f"`config.d` ({config.d}) must equal `d` ({d}).")
        if tick < 1:
            raise ValueError(f"`tick` must be a positive number of reports, got {tick}.")
        self.d, self.n_units, self.config, self.tick = d, n_units, config, tick
        self.lambda_, self.alpha, self.noise_ridge = lambda_, alpha, noise_ridge
        self.prior, self.prior_strength = prior, prior_strength  # the serving solve's public prior (as the pipeline's)
        self._contexts: list[FloatArray] = []  # reports and shuffled batches name items by index into this list
        self.codebook = codebook  # config.codewords: the public codebook (devices report listens as codewords)
        self.analyzer = Analyzer(config, n_units, self._lookup, codebook)
        #: The server's sums (:class:`~models.local.analyzer.AnalyzerState`, one partition).
        self.state: AnalyzerState = self.analyzer.init_state()
        #: What the analyzer refused (the devices here are honest: a refusal is a twin that disagrees with the server).
        self.dead_letters: list[DeadLetter] = []
        self.shuffler = Shuffler(config) if config.shuffled else None
        self._rng = np.random.default_rng(seed)
        self._clients: dict[str, LocalClient] = {}
        self.reports = 0
        #: Interactions a device did not report (user level: past its cap per epoch or its lifetime budget).
        self.refused = 0
        self.solves = 0
        self.theta = np.zeros((n_units, d))
        self.M = np.broadcast_to(np.eye(d) / lambda_, (n_units, d, d)).copy()

    def select(self, unit: int, X: FloatArray) -> int:
        mean, bonus = ucb_scores_blas(self.theta[unit], self.M[unit], X, self.alpha)
        score = mean + bonus
        best = np.flatnonzero(score >= score.max() - 1e-12)
        return int(best[0] if len(best) == 1 else self._rng.choice(best))

    def update(self, unit: int, x: FloatArray, reward: float, user: str | None = None) -> None:
        dev = self._device(str(unit) if user is None else str(user))
        x = clip_context(x)
        item = str(len(self._contexts))
        self._contexts.append(x)
        try:
            rep = dev.report(rec_id=item, x=x, reward=float(min(1.0, max(0.0, reward))))
        except ReportRefused:  # user level: past the device's cap or budget, nothing leaves the device
            self.refused += 1
        else:
            dev.acknowledge(rep.version)
            rep = dataclasses.replace(rep, shown=(item,))  # the server adds the list it showed (one item here)
            if self.shuffler is None:
                self.fold(Reports([(self.reports, rep, unit)], now=_RUN_CLOCK()))
            else:
                label = POPULATION if self.config.codewords else unit  # codewords: population-wide batches
                self.fold(Batches([(b.seq, b) for b in self.shuffler.add(rep, unit=label, messages=rep.messages)]))
            self.reports += 1
        if (self.reports + self.refused) % self.tick == 0:
            self._solve()

    def _device(self, name: str) -> LocalClient:
        """The device of user ``name`` (made at its first interaction, its seed drawn from the policy's)."""
        dev = self._clients.get(name)
        if dev is None:
            dev = self._clients[name] = LocalClient(name, self.config, MemoryStorage(),
                                                    seed=int(self._rng.integers(2**62)), clock=_RUN_CLOCK,
                                                    codebook=self.codebook)
        return dev

    def _lookup(self, items: Sequence[str]) -> FloatArray:
        """The analyzer's view of the twin's catalog: the contexts the reports' items name, clipped."""
        return np.stack([clip_context(self._contexts[int(i)]) for i in items])

    def fold(self, batch: Reports | Batches) -> None:
        """The server's step: ``batch`` folded into :attr:`state` by the worker's analyzer (refusals kept)."""
        self.state, dead = self.analyzer.step(self.state, batch)
        self.dead_letters += dead

    def fold_batch(self, batch: ShuffledBatch, contexts: FloatArray) -> None:
        """Fold one shuffled batch (opened) whose shown items have ``contexts`` (one row each; public): the items
        the batch names are registered with the twin under fresh indices, so a sealed batch the live worker also
        reads folds here exactly as there."""
        first = len(self._contexts)
        self._contexts += [np.asarray(x, dtype=np.float64) for x in contexts]
        renamed = dataclasses.replace(batch, items=[str(first + i) for i in range(len(contexts))])
        self.fold(Batches([(batch.seq, renamed)]))

    def released(self, version: int | None = None) -> ReleasedStats:
        """What the server releases from :attr:`state`: the worker's release (one partition, ``linucb``)."""
        total = merge([self.state], n_units=self.n_units, d=self.d, population=bool(self.config.codewords))
        return released_stats(total, "linucb", np.eye(self.n_units), self.solves + 1 if version is None else version)

    def _solve(self) -> None:
        released = self.released()
        self.theta, self.M = solve(released, lambda_=self.lambda_, noise_ridge=self.noise_ridge, prior=self.prior,
                                   prior_strength=self.prior_strength)
        self.solves += 1


class LocalItemUCB:
    """Local mode with shuffling, population-wide: a shared LinUCB learnt from listens, and the item term.

    Every interaction is one report of the user's device about the item the user listened to (the logged
    item: their choice, protected): the round report ``x_a + Laplace`` (pure ``epsilon0``-LDP, the real
    :class:`~models.local.LocalClient`), which trains one LinUCB shared by everyone (as the global mode's
    organic listens train ``b``, never the Gram), and — with ``share > 0`` — the item ``a`` one-hot through
    :class:`~models.local.items.ItemBlanket` (the item term). The Gram takes the recommended item's public
    context. A batch holds ``batch`` *distinct* users of the whole population (no unit label: both
    statistics are population-wide), so batches fill at the pace of the whole stream; a user's next report
    waits for the next batch. A device reports at most ``cap`` times (one epoch: the user-level cap).

    Privacy (user level, against everyone who sees only the shuffled batches): the item messages of a
    user's ``cap`` batches are ``(share * epsilon, delta / 2)``-DP (exact blanket analysis); the round
    reports, each batch ``((1 - share) epsilon / cap, delta / (2 cap))``-DP (Feldman, McMillan & Talwar),
    compose over ``cap`` batches to ``((1 - share) epsilon, delta / 2)``; together ``(epsilon, delta)``
    by basic composition. Score: ``x theta + alpha ||x||_M + w pop_a`` with the global mode's item term
    (:func:`~models.ground.items.popularity_feature`, threshold ``2`` noise stds, ``w`` fading with the noise).

    Options: ``codewords`` (a public codebook, :func:`~models.local.items.codebook`) reports a listen as the
    codeword of ``x_a`` through a blanket over the codes instead of a Laplace vector (the ``(1 - share) epsilon``
    part is then an exact blanket guarantee too); ``n_units`` with ``groups`` (unit -> model group, public) keeps
    one LinUCB per group, the messages labelled by group (the blanket covers every group's codes; ``pool_weight``
    adds that share of the population's sums to each group's); ``private=False`` is the non-private twin of the
    same model (exact listens and counts, no batch, no cap); ``prior`` with ``prior_strength`` is the serving
    solve's public prior mean (:func:`models.streaming.solve.solve`: ``theta = (G + (lambda + s) I)^-1 (b + s prior)``).

    ``hierarchy=True`` (with the catalog's ``features``) serves the global mode's hierarchical model instead of
    LinUCB plus the item term: each solve is :func:`~models.streaming.hierarchy.solve_hierarchy` of what the server
    has released (:meth:`released_hierarchy`: the pool block from the listens' sum ``b`` and the count of reports in
    closed batches, the items block from the blanket's item sums, each with its public noise std; no unit block), so
    a candidate ``a`` scores ``x_a . theta + alpha ||x_a||_M + item_scores[a]`` as
    :class:`models.policies.hierarchy.HierarchicalUCB` does. It needs the listens' channel (``share < 1``); the Gram
    of shown contexts is not used. A solve happens every ``tick`` interactions when a batch has closed since the
    last one (before any, the public prior's ranking). The default (``False``) is unchanged.

    >>> import numpy as np
    >>> pol = LocalItemUCB(d=2, n_items=4, epsilon=2.0, batch=200, cap=1, seed=0, share=0.5)
    >>> X = np.eye(2)[[0, 1, 0, 1]]
    >>> for u in range(200):
    ...     pol.update(0, X[pol.select(0, X, items=np.arange(4))], 0.0, user=str(u), item=2, x_item=X[2])
    >>> pol.batches, pol.item_reports, int(np.argmax(pol.sums))   # 200 listens of item 2 stand out
    (1, 200, 2)

    The hierarchical serving over the same releases (``hierarchy=True``): after the first batch closes, the next
    solve ranks item 2 first by its released count, and the pool block counts the batch's 200 reports:

    >>> F = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]])
    >>> pol = LocalItemUCB(d=2, n_items=4, epsilon=4.0, batch=200, cap=1, seed=0, hierarchy=True, features=F)
    >>> for u in range(300):
    ...     pol.update(0, F[0], 0.0, user=str(u), item=2, x_item=F[2])
    >>> pol.batches, round(pol.released_hierarchy().count), int(np.argmax(pol.item_scores))
    (1, 200, 2)
    """

    per_user = True
    with_items = True

    def __init__(self, *, d: int, n_items: int, epsilon: float, batch: int, cap: int, seed: int,
                 delta: float = 1e-5, share: float = 0.5, weight: float = 1.0, noise_scale: float = 2.0,
                 threshold_stds: float = 2.0, lambda_: float = 1.0, alpha: float = 0.3, noise_ridge: float = 0.0,
                 tick: int = 100, private: bool = True, codewords: FloatArray | None = None, n_units: int = 1,
                 pool_weight: float = 0.0, groups: NDArray[np.int64] | None = None, prior: FloatArray | None = None,
                 prior_strength: float = 0.0, hierarchy: bool = False, features: FloatArray | None = None,
                 codes_are_items: bool = False) -> None:
        from .items import ItemBlanket

        if hierarchy:
            if features is None or np.shape(features) != (n_items, d):
                raise ValueError(f"`hierarchy` needs the catalog's `features` of shape ({n_items}, {d}), got "
                                 f"{None if features is None else np.shape(features)}.")
            if private and share >= 1.0:
                raise ValueError(f"`hierarchy` needs the listens' channel for its pool block (`share` < 1), got "
                                 f"{share!r}.")

        # groups: model unit -> the model (group) its users share (public; default: each unit its own, or one)
        self.group_of = (np.zeros(n_units, dtype=np.int64) if groups is None and n_units == 1 else
                         np.arange(n_units) if groups is None else np.asarray(groups, dtype=np.int64))
        n_units = int(self.group_of.max()) + 1 if len(self.group_of) else 1
        if not private:  # the non-private twin of the same model: exact listens and counts, no batch, no cap
            epsilon, batch, cap = math.inf, 1, 1 << 62
        elif not 0.0 <= share <= 1.0:
            raise ValueError(f"`share` must be in [0, 1], got {share!r}.")
        self.d, self.n_items, self.batch, self.cap, self.tick = d, n_items, batch, cap, tick
        self.weight, self.noise_scale, self.threshold_stds = weight, noise_scale, threshold_stds
        self.lambda_, self.alpha, self.noise_ridge = lambda_, alpha, noise_ridge
        self.private = private
        self.items = (ItemBlanket(n_items=n_items, batch=batch, epsilon=share * epsilon, delta=delta / 2, cap=cap)
                      if share > 0 and private else None)
        self.codewords = None if codewords is None else np.asarray(codewords, dtype=np.float64)
        self.codes: ItemBlanket | None = None
        self.config: LocalConfig | None = None
        if share < 1 and private and self.codewords is not None:  # listens as codewords, through a blanket
            self.codes = ItemBlanket(n_items=n_units * len(self.codewords), batch=batch, epsilon=(1.0 - share) * epsilon,
                                     delta=delta / 2, cap=cap)
        elif share < 1 and private:  # listens as Laplace vectors
            self.config = LocalConfig(algorithm="round", d=d, epsilon=(1.0 - share) * epsilon / cap,
                                      delta=delta / (2 * cap), shuffle_batch=batch)
        self._rng = np.random.default_rng(seed)
        self._clients: dict[str, LocalClient] = {}
        self._open: dict[str, tuple[int, FloatArray | None]] = {}
        self._waiting: list[tuple[str, int, FloatArray | None]] = []
        self._counts: dict[str, int] = {}
        self.n_units, self.pool_weight = n_units, pool_weight
        self.gram = np.zeros((n_units, d, d))
        self.b = np.zeros((n_units, d))
        self.b_var = 0.0
        self.sums = np.zeros(n_items)
        self.variance = 0.0
        self.item_reports = 0
        self.batches = 0
        self.reports = 0
        self.events = 0
        self._pop = np.zeros(n_items)
        self.prior_strength = prior_strength
        self.prior = np.zeros(d) if prior is None else np.asarray(prior, dtype=np.float64)
        if prior_strength and self.prior.shape != (d,):
            raise ValueError(f"`prior` must be a vector of length {d}, got shape {self.prior.shape}.")
        self.theta = np.zeros((n_units, d))
        self.M = np.broadcast_to(np.eye(d) / lambda_, (n_units, d, d)).copy()
        self.hierarchy = bool(hierarchy)
        # the codebook is the catalog itself (the live `--local-item-term 1`): a message names the item listened to,
        # and the codes' histogram estimate is also released as the item sums (the same estimate: no extra cost)
        self.codes_are_items = bool(codes_are_items)
        if self.codes_are_items and (self.codewords is None or len(self.codewords) != n_items or n_units != 1):
            raise ValueError("`codes_are_items` needs `codewords` with one row per item (the catalog) and one group.")
        self.features = None if features is None else np.asarray(features, dtype=np.float64)
        self.item_scores = np.zeros(n_items)
        self.info: dict[str, float] = {}
        self._solved_batches = -1
        if self.hierarchy:
            assert self.features is not None
            self._u0 = prior_direction(self.features)
            self._solve()  # no report yet: the public prior's ranking
        elif prior_strength:  # before any data: the prior alone (as the pipeline's first solve)
            self._solve()

    @property
    def item_weight(self) -> float:
        """``weight / (1 + (std / noise_scale)**2)`` with the public noise std of the released sums."""
        return self.weight / (1.0 + self.variance / self.noise_scale**2)

    def _group(self, unit: int) -> int:
        return int(self.group_of[unit]) if self.n_units > 1 else 0

    def select(self, unit: int, X: FloatArray, user: str | None = None, items: NDArray[np.int64] | None = None) -> int:
        g = self._group(unit)
        if self.hierarchy:
            mean, bonus = ucb_scores(self.theta[0], self.M[0], np.asarray(X, dtype=np.float64), self.alpha)
            score = mean + bonus
            if items is not None:
                score = score + self.item_scores[np.asarray(items)]
            return argmax_random(score, self._rng)
        mean, bonus = ucb_scores_blas(self.theta[g], self.M[g], X, self.alpha)
        score = mean + bonus
        if items is not None and (self.items is not None or not self.private):
            score = score + self.item_weight * self._pop[np.asarray(items)]
        best = np.flatnonzero(score >= score.max() - 1e-12)
        return int(best[0] if len(best) == 1 else self._rng.choice(best))

    def update(self, unit: int, x: FloatArray, reward: float, user: str | None = None, item: int | None = None,
               x_item: FloatArray | None = None) -> None:
        """One interaction of ``user``: ``x`` was shown (public: the Gram); they listened to ``item`` (context
        ``x_item``), which their device reports (``reward`` is the bandit feedback; the listen carries it)."""
        self.gram[self._group(unit)] += np.outer(clip_context(x), clip_context(x))
        self.events += 1
        if self.events % self.tick == 0:
            self._solve()
        name = str(unit) if user is None else str(user)
        used = self._counts.get(name, 0)
        if used >= self.cap or item is None:
            return
        self._counts[name] = used + 1
        self.reports += 1
        vec = None if self.private else np.concatenate([[self._group(unit)],
                                                        clip_context(np.asarray(x_item))])
        if self.codes is not None and self.codewords is not None:
            from .items import nearest_code

            code = int(item) if self.codes_are_items else \
                int(nearest_code(self.codewords, clip_context(np.asarray(x_item)))[0])
            vec = np.array([float((self._group(unit)) * len(self.codewords) + code)])  # the message
        if self.config is not None:
            dev = self._clients.get(name)
            if dev is None:
                dev = self._clients[name] = LocalClient(name, self.config, MemoryStorage(),
                                                        seed=int(self._rng.integers(2**62)))
            rep = dev.report(rec_id="listen", x=clip_context(np.asarray(x_item)), reward=1.0)
            dev.acknowledge(rep.version)
            vec = rep.vector
        if name in self._open:
            self._waiting.append((name, int(item), vec))
            return
        self._open[name] = (int(item), vec)
        while len(self._open) >= self.batch:
            self._close()

    def _close(self) -> None:
        n = len(self._open)
        vectors = [v for _, v in self._open.values() if v is not None]
        if self.codes is not None and self.codewords is not None:
            msgs = [self.codes.randomize(int(v[0]), reward=1.0, rng=self._rng) for v in vectors]
            est = self.codes.estimate(self.codes.histogram(np.concatenate(msgs)), n)
            self.b += est.reshape(self.n_units, -1) @ self.codewords
            self.b_var += self.codes.variance(n) * float((self.codewords**2).sum(axis=0).max())
            if self.codes_are_items:
                self.sums += est
                self.variance += self.codes.variance(n)
        elif vectors and not self.private:
            for v in vectors:
                self.b[int(v[0])] += v[1:]
        elif vectors:
            self.b[0] += np.sum(vectors, axis=0)
        if self.config is not None:
            self.b_var += len(vectors) * self.config.report_variance(1)
        if not self.private:
            for item, _ in self._open.values():
                self.sums[item] += 1.0
            self._pop = popularity_feature(self.sums, total=self.item_reports + n)
        elif self.items is not None:
            msgs = [self.items.randomize(item, reward=1.0, rng=self._rng) for item, _ in self._open.values()]
            hist = self.items.histogram(np.concatenate(msgs))
            self.sums += self.items.estimate(hist, n)
            self.variance += self.items.variance(n)
            self._pop = popularity_feature(self.sums, total=self.item_reports + n,
                                           threshold=self.threshold_stds * float(np.sqrt(self.variance)))
        self.item_reports += n
        self.batches += 1
        self._open = {}
        pending, self._waiting = self._waiting, []
        for name, item, vec in pending:
            if name in self._open:
                self._waiting.append((name, item, vec))
            else:
                self._open[name] = (item, vec)

    def released_hierarchy(self) -> ReleasedHierarchy:
        """What the server has released, as the hierarchy's blocks (``hierarchy=True``; post-processing only).

        Pool: ``[b, n] / sqrt(2)`` with ``b`` the sum of the listens' reports over every group and ``n`` the reports
        in closed batches (public: a batch's size is); its noise std ``sqrt(b_var) / sqrt(2)`` (``b_var``: the
        per-coordinate noise variance of ``b``; the count has none). Items: the blanket's unbiased item sums, std
        ``sqrt(variance)``. Without privacy both stds are 0.
        """
        return ReleasedHierarchy.from_sums(self.b.sum(axis=0), float(self.item_reports), math.sqrt(self.b_var),
                                           self.sums.copy(), math.sqrt(self.variance), self.batches)

    def _solve(self) -> None:
        if self.hierarchy:
            if self.batches == self._solved_batches:  # nothing new released since the last solve
                return
            assert self.features is not None
            model = solve_hierarchy(self.released_hierarchy(), self.features, n_units=1, u0=self._u0)
            self.theta, self.M, self.item_scores, self.info = model.theta, model.M, model.item_scores, model.info
            self._solved_batches = self.batches
            return
        ridge = self.lambda_ + self.noise_ridge * float(np.sqrt(self.b_var)) + self.prior_strength
        w = self.pool_weight
        G = self.gram + w * self.gram.sum(axis=0) + ridge * np.eye(self.d)
        self.M = np.linalg.inv(G)
        self.theta = np.einsum("uij,uj->ui", self.M, self.b + w * self.b.sum(axis=0) + self.prior_strength * self.prior)
