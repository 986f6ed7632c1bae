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
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from models.ground.items import popularity_feature
from models.ground.linalg import ucb_scores, ucb_scores_blas
from models.policies.popularity import argmax_random
from models.streaming import ReleasedStats, solve
from models.streaming.hierarchy import ReleasedHierarchy, item_floor, prior_direction, solve_hierarchy

from .aggregate import clip_context
from .analyzer import Analyzer, AnalyzerState, Batches, DeadLetter, Reports, merge, released_stats
from .client import LocalClient, MemoryStorage, ReportRefused
from .config import LocalConfig
from .shuffle import POPULATION, ShuffledBatch, Shuffler

__all__ = ["LocalUCB", "LocalItemUCB", "LocalPopularity"]

FloatArray = NDArray[np.float64]

#: :class:`LocalItemUCB`'s item term, the global mode's rule (``pipeline.release.stages``): released item sums within
#: this many noise stds of zero count as zero, and the term's weight is ``1 / (1 + (std / ITEM_NOISE_SCALE)**2)``.
ITEM_THRESHOLD_STDS = 2.0
ITEM_NOISE_SCALE = 2.0


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
    item: their choice, protected). The device is the real :class:`~models.local.LocalClient`: with ``codewords``
    (a public codebook, :func:`~models.local.items.codebook`, or the catalog itself) it reports the listen as the
    codeword of ``x_a`` among a blanket of fake messages (:func:`~models.local.client.codeword_messages`, the
    default variant ``shuffled-items``); without, as the round report ``x_a + Laplace`` (pure ``epsilon0``-LDP).
    With ``share > 0`` (Laplace listens only) the item ``a`` one-hot also travels through
    :class:`~models.local.items.ItemBlanket` (the item term). A batch holds ``batch`` *distinct* users of the
    whole population (no unit label: every statistic is population-wide), so batches fill at the pace of the
    whole stream; a user's next report waits for the next batch. Each closed batch is folded by the worker's
    analyzer (:meth:`models.local.analyzer.Analyzer.step`, the same code as the live worker's ingest), so what
    the server holds is :attr:`state`. A device reports at most ``cap`` times (one epoch: the user-level cap).
    The Gram takes the recommended item's public context (the twin's own public sum, at every interaction).

    Privacy (user level, against everyone who sees only the shuffled batches): codewords, ``share`` 0: a user's
    ``cap`` batches are ``(epsilon, delta)``-DP (the exact blanket analysis, as the live default). Laplace
    listens: the item messages of a user's ``cap`` batches are ``(share * epsilon, delta / 2)``-DP (exact
    blanket analysis) and the round reports, each batch ``((1 - share) epsilon / cap, delta / (2 cap))``-DP
    (Feldman, McMillan & Talwar), compose over ``cap`` batches to ``((1 - share) epsilon, delta / 2)``; together
    ``(epsilon, delta)`` by basic composition (``share`` 0: the listens get the whole ``(epsilon, delta)``).
    Score: ``x theta + alpha ||x||_M + w pop_a`` with the global mode's item term
    (:func:`~models.ground.items.popularity_feature`, threshold ``2`` noise stds, ``w`` fading with the noise).

    ``private=False`` is the non-private twin of the same model (exact listens and counts, no batch, no cap);
    ``prior`` with ``prior_strength`` is the serving solve's public prior mean (:func:`models.streaming.solve.solve`:
    ``theta = (G + (lambda + s) I)^-1 (b + s prior)``). ``codes_are_items``: the codebook is the catalog itself
    (the live ``shuffled-items`` default up to ``MAX_CATALOG_CODEBOOK`` items): the codes' histogram estimate is
    also the item sums (the same estimate: no extra cost).

    ``hierarchy=True`` (with the catalog's ``features``) serves the global mode's hierarchical model instead of
    LinUCB plus the item term: each solve is :func:`~models.streaming.hierarchy.solve_hierarchy` of what the server
    has released (:meth:`released_hierarchy`: the pool block from the listens' sum ``b`` and the count of reports in
    closed batches, the items block from the item sums, each with its public noise std; no unit block), so
    a candidate ``a`` scores ``x_a . theta + alpha ||x_a||_M + item_scores[a]`` as
    :class:`models.policies.hierarchy.HierarchicalUCB` does. Private, a solve follows each batch's close, as the live
    worker releases within ``RELEASE_POLL_S`` (:mod:`pipeline.modes.local.localmode`) of a batch's fold (the devices
    added the noise: a release spends nothing); without privacy (a batch per report) the content levels every
    ``tick`` interactions when a batch has closed since the last one, and the item level at every report: without
    noise it keeps each count whole (``lambda_a = max(count_a, FLOOR m_a)``, ``m_a`` the content model's
    prediction), so a report moves its item's term alone (the normaliser shifts every item's term alike), exactly as a
    solve with the content levels of the last tick would. Before any batch, the public prior's ranking. The default
    (``False``) is unchanged.

    >>> import numpy as np
    >>> pol = LocalItemUCB(d=2, n_items=4, epsilon=2.0, batch=200, cap=1, seed=0, share=0.5)
    >>> X = np.eye(2)[[0, 1, 0, 1]]
    >>> for u in range(200):
    ...     pol.update(0, X[pol.select(0, X, items=np.arange(4))], 0.0, user=str(u), item=2, x_item=X[2])
    >>> pol.batches, pol.item_reports, int(np.argmax(pol.sums))   # 200 listens of item 2 stand out
    (1, 200, 2)

    The hierarchical serving over the same releases (``hierarchy=True``), the catalog as the codebook: after the
    first batch closes, the next solve ranks item 2 first by its released count, and the pool block counts the
    batch's 200 reports:

    >>> F = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]])
    >>> pol = LocalItemUCB(d=2, n_items=4, epsilon=4.0, batch=200, cap=1, seed=0, share=0.0, hierarchy=True,
    ...                    features=F, codewords=F, codes_are_items=True)
    >>> for u in range(300):
    ...     pol.update(0, F[0], 0.0, user=str(u), item=2, x_item=F[2])
    >>> pol.batches, round(pol.released_hierarchy().count), int(np.argmax(pol.item_scores))
    (1, 200, 2)
    """

    per_user = True
    with_items = True

    def __init__(self, *, d: int, n_items: int, epsilon: float, batch: int, cap: int, seed: int,
                 delta: float = 1e-5, share: float = 0.5, lambda_: float = 1.0, alpha: float = 0.3,
                 noise_ridge: float = 0.0, tick: int = 100, private: bool = True, codewords: FloatArray | None = None,
                 prior: FloatArray | None = None, prior_strength: float = 0.0, hierarchy: bool = False,
                 features: FloatArray | None = None, codes_are_items: bool = False) -> None:
        from .items import ItemBlanket

        if hierarchy and (features is None or np.shape(features) != (n_items, d)):
            raise ValueError(f"`hierarchy` needs the catalog's `features` of shape ({n_items}, {d}), got "
                             f"{None if features is None else np.shape(features)}.")
        if not private:  # the non-private twin of the same model: exact listens and counts, no batch, no cap
            epsilon, batch, cap = math.inf, 1, 1 << 62
        elif not 0.0 <= share < 1.0:
            raise ValueError(f"`share` must be in [0, 1): the listens' channel is what the model learns from (items "
                             f"alone are private popularity, models.policies.PrivatePopularity), got {share!r}.")
        elif share and codewords is not None:
            raise ValueError(f"`codewords` carry the whole budget (`share` 0: a report's messages are the listen's "
                             f"codeword, no item one-hot), got share {share!r}.")
        self.d, self.n_items, self.batch, self.cap, self.tick = d, n_items, batch, cap, tick
        self.lambda_, self.alpha, self.noise_ridge = lambda_, alpha, noise_ridge
        self.private = private
        self.codewords = None if codewords is None else np.asarray(codewords, dtype=np.float64)
        self.codes_are_items = bool(codes_are_items)
        if self.codes_are_items and (self.codewords is None or len(self.codewords) != n_items):
            raise ValueError("`codes_are_items` needs `codewords` with one row per item (the catalog).")
        listens_delta = delta if share == 0 else delta / 2
        #: The listens' public calibration (the devices'), and the item reports' (``share`` > 0)
        self.config: LocalConfig | None = None
        self.items: ItemBlanket | None = None
        self.analyzer: Analyzer | None = None
        if private:
            if self.codewords is not None:
                self.config = LocalConfig(algorithm="round", d=d, epsilon=epsilon, delta=listens_delta,
                                          shuffle_batch=batch, unit="user", cap=cap, codewords=len(self.codewords))
            else:
                self.config = LocalConfig(algorithm="round", d=d, epsilon=(1.0 - share) * epsilon / cap,
                                          delta=listens_delta / cap, shuffle_batch=batch)
            if share > 0:
                self.items = ItemBlanket(n_items=n_items, batch=batch, epsilon=share * epsilon, delta=delta / 2,
                                         cap=cap)
            self.analyzer = Analyzer(self.config, 1, _no_contexts(d), self.codewords, self.items,
                                     item_term=self.codes_are_items)
        #: The server's sums (private: the analyzer's fold of the closed batches)
        self.state = AnalyzerState.zeros(1, d)
        self._rng = np.random.default_rng(seed)
        self._clients: dict[str, LocalClient] = {}
        self._open: dict[str, tuple[int, FloatArray]] = {}
        self._waiting: list[tuple[str, int, FloatArray]] = []
        self._counts: dict[str, int] = {}
        self.gram = np.zeros((1, d, d))
        self.b = np.zeros((1, d))
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
        self.theta = np.zeros((1, d))
        self.M: FloatArray = (np.eye(d) / lambda_)[None].copy()
        self.hierarchy = bool(hierarchy)
        self.features = None if features is None else np.asarray(features, dtype=np.float64)
        self.item_scores = np.zeros(n_items)
        self.info: dict[str, float] = {}
        self._solved_batches = -1
        #: non-private hierarchy: ``FLOOR m_a`` of the last solve with data (the item level's floor), else ``None``
        self._item_floor: FloatArray | None = None
        if self.hierarchy:
            assert self.features is not None
            self._u0 = prior_direction(self.features)
            self._solve()  # no report yet: the public prior's ranking
        elif prior_strength:  # before any data: the prior alone (as the pipeline's first solve)
            self._solve()

    @property
    def item_weight(self) -> float:
        """``1 / (1 + (std / 2)**2)`` with the public noise std of the released sums (the global mode's rule,
        :func:`pipeline.release.stages.item_term`)."""
        return 1.0 / (1.0 + self.variance / ITEM_NOISE_SCALE**2)

    def select(self, unit: int, X: FloatArray, user: str | None = None, items: NDArray[np.int64] | None = None) -> int:
        if self.hierarchy:
            mean, bonus = ucb_scores(self.theta[0], self.M[0], np.asarray(X, dtype=np.float64), self.alpha)
            score = mean + bonus
            if items is not None:
                score = score + self.item_scores[np.asarray(items)]
            return argmax_random(score, self._rng)
        mean, bonus = ucb_scores_blas(self.theta[0], self.M[0], X, self.alpha)
        score = mean + bonus
        if items is not None and (self.items is not None or not self.private):
            score = score + self.item_weight * self._pop[np.asarray(items)]
        best = np.flatnonzero(score >= score.max() - 1e-12)
        return int(best[0] if len(best) == 1 else self._rng.choice(best))

    def update(self, unit: int, x: FloatArray, reward: float, user: str | None = None, item: int | None = None,
               x_item: FloatArray | None = None) -> None:
        """One interaction of ``user``: ``x`` was shown (public: the Gram); they listened to ``item`` (context
        ``x_item``), which their device reports (``reward`` is the bandit feedback; the listen carries it)."""
        self.gram[0] += np.outer(clip_context(x), clip_context(x))
        self.events += 1
        if self.events % self.tick == 0:
            self._solve()
        name = str(unit) if user is None else str(user)
        used = self._counts.get(name, 0)
        if used >= self.cap or item is None:
            return
        self._counts[name] = used + 1
        self.reports += 1
        x_a = clip_context(np.asarray(x_item))
        if self.config is None:  # non-private: the exact listen
            vec = x_a
        else:
            dev = self._clients.get(name)
            if dev is None:
                dev = self._clients[name] = LocalClient(name, self.config, MemoryStorage(),
                                                        seed=int(self._rng.integers(2**62)), clock=_RUN_CLOCK,
                                                        codebook=self.codewords)
            rep = dev.report(rec_id="listen", x=x_a, reward=1.0)
            dev.acknowledge(rep.version)
            vec = np.asarray(rep.messages, dtype=np.float64) if self.codewords is not None else rep.vector
        if name in self._open:
            self._waiting.append((name, int(item), vec))
            return
        self._open[name] = (int(item), vec)
        while len(self._open) >= self.batch:
            self._close()

    def _close(self) -> None:
        n = len(self._open)
        opened = list(self._open.values())
        if self.analyzer is None:  # non-private: exact sums
            for item, vec in opened:
                self.b[0] += vec
                if self._item_floor is not None:  # the item level of the last solve, this count moved
                    floor = self._item_floor[item]
                    self.item_scores[item] += math.log(max(self.sums[item] + 1.0, floor) / max(self.sums[item], floor))
                self.sums[item] += 1.0
            if not self.hierarchy:  # the flat path's item term (the hierarchy serves item_scores)
                self._pop = popularity_feature(self.sums, total=self.item_reports + n)
            self.item_reports += n
            self.batches += 1
        elif self.codewords is not None:  # the devices' messages (codewords, dummies); m carries nothing
            self.fold_batch(ShuffledBatch(POPULATION, self.batches + 1, [], [[0.0] * self.d] * n, 0.0, 0.0,
                                          messages=[int(m) for _, v in opened for m in v]))
        else:  # the devices' Laplace vectors, and (share > 0) the item reports' messages
            messages = [] if self.items is None else [
                int(m) for item, _ in opened for m in self.items.randomize(item, reward=1.0, rng=self._rng)]
            self.fold_batch(ShuffledBatch(POPULATION, self.batches + 1, [], [v.tolist() for _, v in opened], 0.0,
                                          0.0, messages=messages))
        self._open = {}
        pending, self._waiting = self._waiting, []
        for name, item, vec in pending:
            if name in self._open:
                self._waiting.append((name, item, vec))
            else:
                self._open[name] = (item, vec)
        if self.hierarchy and (self.private or self._item_floor is None):  # as the live worker: a release within
            self._solve()  # a poll of the batch's fold (non-private: the first, then the item level at each report)

    def fold_batch(self, batch: ShuffledBatch) -> None:
        """The server's step (private): one shuffled batch (opened) folded into :attr:`state` by the worker's
        analyzer, as the live worker folds it. The twin keeps its own Gram, so the batch's shown items are not
        folded; a refused batch is an error (the twin's devices are honest)."""
        assert self.analyzer is not None, "the non-private twin has no analyzer"
        self.state, dead = self.analyzer.step(self.state, Batches([(batch.seq, dataclasses.replace(batch, items=[]))]))
        if dead:
            raise RuntimeError(f"the analyzer refused a batch of the twin: {dead[0].reason}")
        self.b, self.b_var = self.state.b, float(self.state.var[0])
        if self.state.items is not None:
            self.sums, self.variance = self.state.items, self.state.items_var
        if self.items is not None and not self.hierarchy:
            self._pop = popularity_feature(self.sums, total=self.item_reports + batch.n,
                                           threshold=ITEM_THRESHOLD_STDS * float(np.sqrt(self.variance)))
        self.item_reports += batch.n
        self.batches += 1

    def released_hierarchy(self) -> ReleasedHierarchy:
        """What the server has released, as the hierarchy's blocks (``hierarchy=True``; post-processing only).

        Pool: ``[b, n] / sqrt(2)`` with ``b`` the sum of the listens' reports and ``n`` the reports in closed batches
        (public: a batch's size is); its noise std ``sqrt(b_var) / sqrt(2)`` (``b_var``: the per-coordinate noise
        variance of ``b``; the count has none). Items: the item sums (the codes' estimate, or the blanket's), std
        ``sqrt(variance)``. Without privacy both stds are 0.
        """
        return ReleasedHierarchy.from_sums(self.b[0].copy(), float(self.item_reports), math.sqrt(self.b_var),
                                           self.sums.copy(), math.sqrt(self.variance), self.batches)

    def _solve(self) -> None:
        if self.hierarchy:
            if self.batches == self._solved_batches:  # nothing new released since the last solve
                return
            assert self.features is not None
            released = self.released_hierarchy()
            model = solve_hierarchy(released, self.features, n_units=1, u0=self._u0)
            self.theta, self.M, self.item_scores, self.info = model.theta, model.M, model.item_scores, model.info
            self._solved_batches = self.batches
            if not self.private and released.count > 0:
                self._item_floor = item_floor(self.features, self.theta[0], released.count)
            return
        ridge = self.lambda_ + self.noise_ridge * float(np.sqrt(self.b_var)) + self.prior_strength
        G = self.gram + ridge * np.eye(self.d)
        self.M = np.asarray(np.linalg.inv(G), dtype=np.float64)
        self.theta = np.einsum("uij,uj->ui", self.M, self.b + self.prior_strength * self.prior)


class LocalPopularity:
    """Private popularity under the local trust model: a :class:`LocalItemUCB` served by its items block alone.

    ``twin`` runs exactly as when it serves: at every interaction it still picks (:meth:`LocalItemUCB.select`; its
    pick is shown to nobody), and its :meth:`~LocalItemUCB.update` gets its own pick's context, so its generator
    (its devices' seeds and its ties), its Gram, devices, codewords among the blanket of fakes, batches and
    analyzer fold are the served twin's, and with the same seed the server releases the same blocks, bit for bit.
    What this policy recommends is another pick: each candidate ``a`` scores its estimated count ``twin.sums[a]``,
    the items block the twin's server releases (:meth:`LocalItemUCB.released_hierarchy`; the debiased histogram of
    the closed batches' codewords), and nothing else (no pool block, no prior, no Gram); ties (every count is 0
    until the first batch closes) are broken by this policy's own generator, keyed by ``seed``. That needs a
    per-item estimate: the catalog as the codebook (``codes_are_items``); with k-means codewords there is none and
    the baseline is not defined.

    Privacy: post-processing of the twin's releases; the twin's guarantee, nothing spent.

    >>> import numpy as np
    >>> F = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]])
    >>> twin = LocalItemUCB(d=2, n_items=4, epsilon=4.0, batch=200, cap=1, seed=0, share=0.0, hierarchy=True,
    ...                     features=F, codewords=F, codes_are_items=True)
    >>> pop = LocalPopularity(twin, seed=0)
    >>> for u in range(300):
    ...     pop.update(0, F[0], 0.0, user=str(u), item=2, x_item=F[2])
    >>> twin.batches, pop.select(0, F, items=np.arange(4))   # one batch of 200 listens of item 2
    (1, 2)
    """

    per_user = True
    with_items = True

    def __init__(self, twin: LocalItemUCB, *, seed: int) -> None:
        if twin.private and not twin.codes_are_items:
            codes = 0 if twin.codewords is None else len(twin.codewords)
            raise ValueError(f"`twin` must release a per-item estimate (`codes_are_items`: the catalog as the "
                             f"codebook), got {codes} codewords for {twin.n_items} items: k-means codewords or "
                             f"Laplace listens estimate no item's count.")
        self.twin = twin
        self.seed = seed
        self._rng = np.random.default_rng((seed, 1))  # its own ties: the twin's generator moves as when it serves
        self._twin_shown: FloatArray | None = None
        #: The twin's own pick in the last :meth:`select`'s candidates: what the served twin recommends there (one
        #: run measures both, paired: the same devices, releases and seed).
        self.twin_pick: int | None = None

    def select(self, unit: int, X: FloatArray, user: str | None = None, items: NDArray[np.int64] | None = None) -> int:
        if items is None:
            raise ValueError("`items` must name the candidates: they are ranked by their estimated counts.")
        X = np.asarray(X, dtype=np.float64)
        self.twin_pick = self.twin.select(unit, X, user=user, items=items)  # the twin serves as it would
        self._twin_shown = X[self.twin_pick]
        return argmax_random(self.twin.sums[np.asarray(items)], self._rng)

    def update(self, unit: int, x: FloatArray, reward: float, user: str | None = None, item: int | None = None,
               x_item: FloatArray | None = None) -> None:
        """The twin's interaction (:meth:`LocalItemUCB.update`): the device reports the listen of ``item``; the
        twin's Gram takes the twin's own pick of the last :meth:`select` (``x`` if none came before)."""
        shown, self._twin_shown = (x if self._twin_shown is None else self._twin_shown), None
        self.twin.update(unit, shown, reward, user=user, item=item, x_item=x_item)


def _no_contexts(d: int) -> Callable[[Sequence[str]], FloatArray]:
    """The twin's batches name no shown item (its Gram is its own public sum): an empty block of contexts."""
    def contexts(items: Sequence[str]) -> FloatArray:
        if items:
            raise KeyError(f"the twin's batches name no item, got {len(items)}")
        return np.zeros((0, d))
    return contexts
