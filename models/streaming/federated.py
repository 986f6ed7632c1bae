"""Federated mode's math: sites release their own statistics; a coordinator sums them, or neighbours mix them.

The federated paper (Li, Song & Fragouli; spec ``federated-and-local-dp.md`` part A)
treats multi-armed bandits: each site keeps a private running sum per arm (a
continual-release mechanism over its own rewards) and shares only private values.
privrec's models are contextual, so a site shares what the global mode releases —
the public Grams and counts of its own units and its noisy ``b_tilde = (V ⊗ I) b``
(:class:`~models.streaming.release.ReleasedStats`) — and the two protocols become:

* **star** (DP-Master-worker): the coordinator sums the sites' latest releases
  (:func:`sum_releases`) and solves one serving model for everyone. The paper's master
  averages UCB *indices* (spec D-10 "paper" mode); summing the statistics is its
  "pooled" variant, which the paper does not analyse — but it is what makes the
  noise-off aggregate equal the global mode's exact statistics.
* **decentralized** (DP-Decentralized UCB): site ``i`` keeps a view ``y_i`` of the
  network *average* and, at every sync, runs consensus on the increments of the
  sites' releases, ``y <- P (y + delta)`` (spec D-4, :mod:`models.ground.consensus`);
  it serves its own users from ``M y_i``. The views converge to the average at the
  rate ``lambda_star(P)**tau`` after ``tau`` syncs with no new data.

Privacy: each site runs its own mechanism over its own users' data with its own
secret seed, so one interaction at site ``s`` touches only site ``s``'s release
(parallel composition over sites); everything the coordinator or the other sites
compute is post-processing of those releases. Each site's guarantee is its
mechanism's (event level, replace-one), stated per site. With user-space noise
(``user-*`` mechanisms) a site's noise sits on its own users' blocks only; when the
sites partition the units, the sum of the sites' noises has the *same distribution*
as the global mode's noise (one draw per user block), so federation costs no extra
noise — only staleness. With another mechanism each site's noise covers all ``dN``
coordinates and the sum has ``M`` times the variance.

Where the paper's analysis stops covering this: its regret bounds (Thm 2, Thm 4)
are for ``K``-armed bandits with the hybrid pure-DP counter and index averaging;
nothing here inherits them — contextual statistics, summed (pooled) aggregation,
Gaussian mechanisms with (epsilon, delta) accounting, consensus on matrices (Gram
views) and the doubling schedule applied to release ticks rather than to arm
switches are this project's extensions, measured (``privrec experiment modes``),
not proved.

Examples
--------
Noise off, the star aggregate of three sites is the global statistic:

>>> import numpy as np
>>> from models.streaming import Releaser, UnitStats
>>> sim = FederatedUCB(d=2, V=np.eye(3), site_of=np.array([0, 1, 2]), topology="star", tick=2, seed=0)
>>> for u, x, r in [(0, [1.0, 0.0], 1.0), (1, [0.0, 1.0], 1.0), (2, [1.0, 0.0], 0.0), (0, [0.0, 1.0], 1.0)]:
...     sim.update(u, np.array(x), r)
>>> sim.views[0].b_tilde.tolist()
[1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
>>> [int(c) for c in sim.views[0].count]
[2, 1, 1]
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from models.accounting import NoNoiseEvent
from models.ground.consensus import mixing_matrix, topology_adjacency
from models.ground.graphs import sensitivities
from models.ground.linalg import check_interaction, ucb_scores_blas
from models.mechanisms import Mechanism, TreeState, make_mechanism, noise_std

from .release import ReleasedStats, Releaser
from .solve import solve
from .stats import UnitStats

__all__ = ["SCHEDULES", "FederatedUCB", "sum_releases", "mix_views", "is_sync_tick", "site_seed",
           "release_payload_bytes", "assign_sites", "block_noise_std", "combined_noise_std"]

FloatArray = NDArray[np.float64]
Schedule = Literal["tick", "doubling"]
#: When sites share their releases: every release tick, or the paper's doubling schedule (ticks 1, 2, 4, 8, ...).
SCHEDULES: tuple[str, ...] = ("tick", "doubling")


def assign_sites(n_units: int, sites: int) -> NDArray[np.int64]:
    """The public, stable site of each unit: ``unit mod sites`` (units, not users: a unit's statistic is one site's).

    >>> assign_sites(5, 2).tolist()
    [0, 1, 0, 1, 0]
    """
    if int(sites) < 1 or int(n_units) < 1:
        raise ValueError(f"`sites` and `n_units` must be positive, got {sites} and {n_units}.")
    return (np.arange(int(n_units)) % int(sites)).astype(np.int64)


def site_seed(seed: int, site: int) -> int:
    """A site's own noise key, derived from the deployment's secret ``seed`` (each site keeps its own).

    >>> site_seed(7, 0) != site_seed(7, 1)
    True
    """
    return int(zlib.crc32(f"{int(seed)}/site/{int(site)}".encode()) ^ (int(seed) & 0x7FFFFFFF)) & 0x7FFFFFFFFFFF


def is_sync_tick(tick: int, schedule: str) -> bool:
    """Whether release tick ``tick`` (from 1) is shared: every tick, or when ``tick`` is a power of two.

    >>> [t for t in range(1, 20) if is_sync_tick(t, "doubling")]
    [1, 2, 4, 8, 16]
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"`schedule` must be one of {list(SCHEDULES)}, got {schedule!r}.")
    if tick < 1:
        return False
    return schedule == "tick" or (tick & (tick - 1)) == 0


def block_noise_std(mechanism: Mechanism | None, state: TreeState | None, n_units: int) -> FloatArray:
    """``(N,)``: the largest noise std in each unit block of a site's ``b_tilde`` (public: calibration and ticks only).

    With user-space noise ``(V_s ⊗ I) xi`` (``V_s``: ``V`` restricted to the site's units), block
    ``j`` has std ``||V_s[j, :]|| * std(xi)``; with any other mechanism every block has the
    mechanism's :func:`~models.mechanisms.noise_std`.
    """
    if mechanism is None or state is None:
        return np.zeros(n_units)
    inner = getattr(mechanism, "inner", None)
    if inner is not None:
        mixing = np.asarray(getattr(mechanism, "mixing"))
        out: FloatArray = np.linalg.norm(mixing, axis=1) * noise_std(inner, state)
        return out
    return np.full(n_units, noise_std(mechanism, state))


def combined_noise_std(block_stds: Sequence[FloatArray]) -> float:
    """The largest per-coordinate std of a sum of independent site noises: ``sqrt(max_j sum_s std_s[j]**2)``.

    >>> combined_noise_std([np.array([1.0, 0.0]), np.array([0.0, 1.0])])  # disjoint blocks: as one site
    1.0
    """
    if not block_stds:
        return 0.0
    return float(np.sqrt(np.max(np.sum(np.square(np.stack(block_stds)), axis=0))))


def sum_releases(releases: Sequence[ReleasedStats], noise_std: float | None = None) -> ReleasedStats:
    """The star coordinator's aggregate: Grams, ``b_tilde`` and counts summed over the sites' latest releases.

    ``noise_std`` of the aggregate: the given value (:func:`combined_noise_std` of the sites'
    :func:`block_noise_std`), else ``sqrt(sum of the sites' noise_std**2)`` — an upper bound.
    """
    if not releases:
        raise ValueError("`releases` must name at least one site release.")
    first = releases[0]
    for r in releases[1:]:
        if r.structure != first.structure or r.b_tilde.shape != first.b_tilde.shape:
            raise ValueError("site releases must share the structure and the shape of `b_tilde`.")
    return ReleasedStats(
        first.structure, first.V,
        np.sum([r.gram for r in releases], axis=0),
        np.sum([r.b_tilde for r in releases], axis=0),
        np.sum([r.count for r in releases], axis=0).astype(np.int64),
        max(r.version for r in releases), first.event,
        math.sqrt(sum(r.noise_std**2 for r in releases)) if noise_std is None else float(noise_std))


def mix_views(P: FloatArray, views: Sequence[ReleasedStats], deltas: Sequence[ReleasedStats | None]
              ) -> list[ReleasedStats]:
    """One running-consensus step ``y <- P (y + delta)`` on Grams, ``b_tilde`` and counts (spec D-4).

    ``views[i]`` estimates the network *average* (scale by ``M`` to serve); ``deltas[i]``
    is what site ``i`` adds this sync (the increment of its own release), or ``None``.
    Counts are mixed as floats (a view's ``count`` estimates the average count per site).
    """
    m = len(views)
    if P.shape != (m, m) or len(deltas) != m:
        raise ValueError(f"`P` must be {m} x {m} and `deltas` must have {m} entries.")
    grams = np.stack([v.gram + (0 if dl is None else dl.gram) for v, dl in zip(views, deltas)])
    bs = np.stack([v.b_tilde + (0 if dl is None else dl.b_tilde) for v, dl in zip(views, deltas)])
    counts = np.stack([v.count.astype(np.float64) + (0 if dl is None else dl.count) for v, dl in zip(views, deltas)])
    grams = np.tensordot(P, grams, axes=(1, 0))
    bs = P @ bs
    counts = P @ counts
    return [replace(v, gram=grams[i], b_tilde=bs[i], count=counts[i]) for i, v in enumerate(views)]


def release_payload_bytes(release: ReleasedStats, units: NDArray[np.int64]) -> int:
    """Bytes of one site message: its own units' Grams and counts, and ``b_tilde`` (float64, no headers).

    A user-space site release could send only its own units' noisy ``b_u`` (``V`` is public);
    this counts what :class:`FederatedUCB` and the pipeline send: the whole ``b_tilde``.
    """
    d = release.gram.shape[1]
    return int(8 * (len(units) * (d * d + 1) + release.b_tilde.size))


class FederatedUCB:
    """UCB served from federated statistics: ``M`` sites, each releasing its own units' data.

    The offline twin of ``privrec up --mode federated``: the same release and solve
    code as the pipeline (:mod:`models.streaming`), one :class:`Releaser` and mechanism
    per site, a sync schedule, and either a coordinator (``topology="star"``) or
    consensus mixing between neighbours (any other topology, or an adjacency matrix).

    Parameters
    ----------
    d
        Context dimension.
    V
        ``N x N`` public mixing matrix over units (identity: LinUCB; ``W``: CoLin).
    site_of
        ``(N,)`` site of each unit (:func:`assign_sites`); sites are ``0..M-1``.
    topology
        ``"star"`` (coordinator sums), ``"ring"`` / ``"complete"`` (decentralized), or an
        ``M x M`` adjacency matrix (decentralized).
    lambda_, alpha, noise_ridge
        Ridge, exploration width, noise-scaled ridge ``kappa`` (as the pipeline's solve).
    mechanism, epsilon, delta
        Each site's continual-release mechanism and its (epsilon, delta); ``epsilon = inf``
        switches noise off.
    horizon
        Interactions the experiment expects; each site's tree covers ``ceil(horizon / tick)`` ticks.
    tick
        Interactions per release tick (all sites release at every tick).
    schedule
        ``"tick"`` (share every release) or ``"doubling"`` (share at ticks 1, 2, 4, ...).
    kappa
        Consensus step of ``P = I - (kappa / d_max) L`` (decentralized only).
    seed
        Deployment secret; site ``s`` keys its noise with :func:`site_seed` ``(seed, s)``.
    sensitivity_scale
        Multiplies every site's per-unit sensitivity: ``1`` for one reward changed by at most ``Lx``; the
        pipeline's sites calibrate to replace-one neighbours (``2 b_clip``,
        :func:`models.mechanisms.participation.replace_sensitivity`) and, at user level, to a capped user's
        ticks (times the mechanism's :func:`~models.mechanisms.participation.participation_factor`).

    Attributes
    ----------
    views
        One :class:`ReleasedStats` per serving model: one (the coordinator's) for a star,
        one per site otherwise (each an estimate of the network total).
    bytes_sent
        ``(M,)`` bytes each site has sent so far (star: to the coordinator; otherwise to
        each neighbour).
    """

    def __init__(self, *, d: int, V: FloatArray, site_of: NDArray[np.int64], topology: str | FloatArray = "star",
                 lambda_: float = 0.1, alpha: float = 0.3, noise_ridge: float = 0.0,
                 mechanism: str = "user-blt-exact", epsilon: float = math.inf, delta: float = 1e-5,
                 horizon: int = 10_000, tick: int = 1, schedule: str = "tick", kappa: float = 0.5,
                 seed: int = 0, context_bound: float = 1.0, sensitivity_scale: float = 1.0) -> None:
        V = np.asarray(V, dtype=np.float64)
        n = V.shape[0]
        site_of = np.asarray(site_of, dtype=np.int64)
        if site_of.shape != (n,) or site_of.min(initial=0) < 0:
            raise ValueError(f"`site_of` must give a site >= 0 for each of the {n} units, got shape {site_of.shape}.")
        if int(tick) < 1:
            raise ValueError(f"`tick` must be a positive number of interactions, got {tick}.")
        if not (sensitivity_scale > 0 and math.isfinite(sensitivity_scale)):
            raise ValueError(f"`sensitivity_scale` must be a positive number, got {sensitivity_scale}.")
        if schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {list(SCHEDULES)}, got {schedule!r}.")
        self.d, self.V, self.n_units = int(d), V, n
        self.site_of = site_of
        self.sites = int(site_of.max()) + 1
        self.structure = "linucb" if np.array_equal(V, np.eye(n)) else "kron"
        self.lambda_, self.alpha, self.noise_ridge = float(lambda_), float(alpha), float(noise_ridge)
        self.tick, self.schedule = int(tick), schedule
        self.star = isinstance(topology, str) and topology == "star"
        if self.star:
            self.P: FloatArray | None = None
            self.adjacency = topology_adjacency("star", self.sites)
        else:
            A = topology_adjacency(topology, self.sites) if isinstance(topology, str) else np.asarray(topology, float)
            self.adjacency = A
            self.P = mixing_matrix(A, kappa)
        ticks = -(-int(horizon) // self.tick)
        sens = sensitivity_scale * sensitivities(V, context_bound)
        self.units = [np.flatnonzero(site_of == s) for s in range(self.sites)]
        self.releasers: list[Releaser] = []
        self.mechanisms: list[Mechanism | None] = []
        for s, units in enumerate(self.units):
            mech: Mechanism | None = None
            if not math.isinf(epsilon) and units.size:
                mask = np.zeros(n)
                mask[units] = 1.0
                # a site's user-space noise sits on its own units' blocks only (mixing V restricted to them)
                mech = make_mechanism(mechanism, dim=n * self.d, sensitivity=float(sens[units].max()),
                                      epsilon=epsilon, delta=delta, horizon=ticks, seed=site_seed(seed, s),
                                      stream=0, mixing=V * mask[None, :], block_dim=self.d)
            self.mechanisms.append(mech)
            self.releasers.append(Releaser(structure=self.structure, V=V, d=self.d, mechanism=mech))
        self.stats = [UnitStats.zeros(n_units=n, d=self.d) for _ in range(self.sites)]
        self.states: list[TreeState | None] = [r.init_state() for r in self.releasers]
        empty = ReleasedStats(self.structure, V, np.zeros((n, self.d, self.d)), np.zeros(n * self.d),
                              np.zeros(n, dtype=np.int64), 0, NoNoiseEvent(), 0.0)
        self.shared: list[ReleasedStats] = [empty] * self.sites  # each site's last shared release
        self.views: list[ReleasedStats] = [empty] * (1 if self.star else self.sites)
        self.bytes_sent = np.zeros(self.sites, dtype=np.int64)
        self.syncs = 0
        self.t = 0
        self.ticks = 0
        self._models: list[tuple[FloatArray, FloatArray]] = [self._solve(v) for v in self.views]

    # ------------------------------------------------------------------ serving

    def _solve(self, view: ReleasedStats) -> tuple[FloatArray, FloatArray]:
        if not self.star:  # a view estimates the network average: M y_i estimates the total
            view = replace(view, gram=self.sites * view.gram, b_tilde=self.sites * view.b_tilde)
        return solve(view, lambda_=self.lambda_, noise_ridge=self.noise_ridge)

    def serving_model(self, user: int) -> tuple[FloatArray, FloatArray]:
        """``(theta_u, M_u)`` of ``user`` from the view that serves it (the coordinator's, or its site's)."""
        theta, M = self._models[0 if self.star else int(self.site_of[user])]
        return theta[user], M[user]

    def scores(self, user: int, contexts: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(mean, bonus)`` of each context for ``user`` (as :meth:`KroneckerUCB.scores`, for the wrappers)."""
        theta, M = self.serving_model(user)
        return ucb_scores_blas(theta, M, contexts, self.alpha)

    def select(self, user: int, contexts: FloatArray) -> int:
        mean, bonus = self.scores(user, contexts)
        return int(np.argmax(mean + bonus))

    # ------------------------------------------------------------------ learning

    def update(self, user: int, context: FloatArray, reward: float, *, gram: bool = True) -> None:
        """Record that ``user`` was shown ``context`` and gave ``reward`` at its site; ``gram=False``: an organic
        listen (``b`` and the count only: the user's own choice never enters the public Gram matrix)."""
        if not (isinstance(user, (int, np.integer)) and 0 <= user < self.n_units):
            raise ValueError(f"`user` must be an integer in [0, {self.n_units}), got {user!r}.")
        x, r = check_interaction(context, reward, self.d)
        s = int(self.site_of[user])
        if gram:
            self.stats[s].add(np.array([user]), x[None, :], np.array([r]))
        else:
            self.stats[s].add_parts(np.array([user]), x[None, :], np.array([r]), np.zeros(0, dtype=np.int64),
                                    np.zeros((0, self.d)))
        self.t += 1
        if self.t % self.tick == 0:
            self.release()

    def release(self) -> None:
        """One release tick at every site; share and aggregate if the schedule says so."""
        self.ticks += 1
        current: list[ReleasedStats] = []
        for s, rel in enumerate(self.releasers):
            out, self.states[s] = rel.release(self.stats[s], self.states[s], version=self.ticks)
            current.append(out)
        if not is_sync_tick(self.ticks, self.schedule):
            return
        self.syncs += 1
        payload = np.array([release_payload_bytes(c, u) for c, u in zip(current, self.units)], dtype=np.int64)
        std = combined_noise_std([block_noise_std(m, st, self.n_units) for m, st in zip(self.mechanisms, self.states)])
        if self.star:
            self.bytes_sent += payload
            self.views = [sum_releases(current, noise_std=std)]
        else:
            assert self.P is not None
            deltas = [_difference(c, p) for c, p in zip(current, self.shared)]
            self.bytes_sent += payload * self.adjacency.sum(axis=1).astype(np.int64)
            mixed = mix_views(self.P, self.views, deltas)
            # the served M * y_i carries (at consensus) the sum of the sites' independent noises
            self.views = [replace(v, version=self.ticks, noise_std=std) for v in mixed]
        self.shared = current
        self._models = [self._solve(v) for v in self.views]


def _difference(new: ReleasedStats, old: ReleasedStats) -> ReleasedStats:
    return replace(new, gram=new.gram - old.gram, b_tilde=new.b_tilde - old.b_tilde,
                   count=(new.count - old.count).astype(np.int64))
