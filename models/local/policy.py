"""The local mode's offline twin: every user runs :class:`~models.local.LocalClient`, the server sums.

:class:`LocalUCB` is what ``privrec experiment modes`` runs for the local rows: a device per user
(their own exact statistic and noise; the real client code), the server's :class:`LocalAggregate`
(or, with shuffling, the :class:`Shuffler` in front of it), and LinUCB per model unit solved from the
released sums every ``tick`` reports, with the ridge ``lambda + kappa * noise_std`` of the sums (the
pipeline's :func:`models.streaming.solve`, post-processing of public values). Shuffled reports count
only once their batch is complete. At user level a device refuses interactions past its cap or budget
(:class:`~models.local.client.ReportRefused`, counted in ``refused``); a run is one epoch.

>>> import numpy as np
>>> from models.local import LocalConfig
>>> pol = LocalUCB(d=2, n_units=1, config=LocalConfig(algorithm="round", d=2, epsilon=5.0), tick=2, seed=0)
>>> X = np.eye(2)
>>> k = pol.select(0, X)
>>> pol.update(0, X[k], 1.0, user="a"); pol.update(0, X[k], 1.0, user="b")
>>> int(pol.aggregate.count.sum()), pol.solves
(2, 1)
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import NDArray

from models.accounting import NoNoiseEvent
from models.ground.linalg import ucb_scores
from models.streaming import ReleasedStats, solve

from .aggregate import LocalAggregate, clip_context
from .client import LocalClient, MemoryStorage, ReportRefused
from .config import LocalConfig
from .shuffle import Shuffler

__all__ = ["LocalUCB"]

FloatArray = NDArray[np.float64]


def _RUN_CLOCK() -> float:
    """A run is one user-level epoch (the replays last minutes; an epoch, hours): the same for every seed."""
    return 0.0


class LocalUCB:
    """LinUCB per unit over the sums of the users' local reports (see the module docstring).

    ``select(unit, X)`` / ``update(unit, x, r, user=...)`` like the other policies; ``user``
    (default: the unit) names the device. Seeds of the devices derive from ``seed``.
    """

    per_user = True

    def __init__(self, *, d: int, n_units: int, config: LocalConfig, tick: int, seed: int, lambda_: float = 1.0,
                 alpha: float = 0.3, noise_ridge: float = 0.0) -> None:
        if config.d != d:
            raise ValueError(f"`config.d` ({config.d}) must equal `d` ({d}).")
        if tick < 1:
            raise ValueError(f"`tick` must be a positive number of reports, got {tick}.")
        self.d, self.n_units, self.config, self.tick = d, n_units, config, tick
        self.lambda_, self.alpha, self.noise_ridge = lambda_, alpha, noise_ridge
        self.aggregate = LocalAggregate(config, n_units=n_units)
        self.shuffler = Shuffler(config) if config.shuffled else None
        self._rng = np.random.default_rng(seed)
        self._clients: dict[str, LocalClient] = {}
        self._contexts: list[FloatArray] = []  # shuffled batches name items by index into this list
        self.reports = 0
        #: Interactions a device did not report (user level: past its cap per epoch or its lifetime budget).
        self.refused = 0
        self.solves = 0
        self.theta = np.zeros((n_units, d))
        self.M = np.broadcast_to(np.eye(d) / lambda_, (n_units, d, d)).copy()

    def select(self, unit: int, X: FloatArray) -> int:
        mean, bonus = ucb_scores(self.theta[unit], self.M[unit], X, self.alpha)
        score = mean + bonus
        best = np.flatnonzero(score >= score.max() - 1e-12)
        return int(best[0] if len(best) == 1 else self._rng.choice(best))

    def update(self, unit: int, x: FloatArray, reward: float, user: str | None = None) -> None:
        name = str(unit) if user is None else str(user)
        dev = self._clients.get(name)
        if dev is None:
            dev = self._clients[name] = LocalClient(name, self.config, MemoryStorage(),
                                                    seed=int(self._rng.integers(2**62)), clock=_RUN_CLOCK)
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
                self.aggregate.apply(rep, unit=unit, X=x)
            else:
                for batch in self.shuffler.add(rep, unit=unit):
                    self.aggregate.apply_batch(batch, np.stack([self._contexts[int(i)] for i in batch.items]))
            self.reports += 1
        if (self.reports + self.refused) % self.tick == 0:
            self._solve()

    def _solve(self) -> None:
        a = self.aggregate
        released = ReleasedStats("linucb", np.eye(self.n_units), a.gram.copy(), a.b.reshape(-1).copy(),
                                 a.count.copy(), self.solves + 1, NoNoiseEvent(), a.noise_std())
        self.theta, self.M = solve(released, lambda_=self.lambda_, noise_ridge=self.noise_ridge)
        self.solves += 1
