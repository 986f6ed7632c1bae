"""The population axis of ``privrec experiment modes``: how much of the learning gain local mode keeps as users grow.

A synthetic world shaped like the LastFM replay (:class:`SyntheticPopulation`): ``n_users`` users clustered into
units of skewed sizes (as the friend-graph clusters), a catalog of ``n_items`` items with unit-norm ``d``-dim
features and a Zipf popularity, each unit a taste vector. Every event is one user listening to an item drawn from
``softmax(beta * x_a . theta_unit + log popularity_a)``; the policy ranks a pool of 25 items (the listened one and 24
random others, the replay's protocol) and earns 1 iff its top item is the listened one.

Each mode runs on the same events; its **gain** is ``(reward - random) / (non-private - random)`` with random play's
expected reward (``events / pool``) and the non-private twin of the same model (exact listens and counts, no batch,
no cap). Modes: ``local-shuffled-items`` (a population-wide variant of it, :class:`models.local.policy.LocalItemUCB`: population-wide shuffled batches of
one-hot item reports with a blanket of fake messages, and listens as Laplace vectors — the synthetic features are
random, so a codebook of them quantizes away the direction the LastFM row's codewords keep —, user level with the
device's cap) at central
``epsilon`` (default 2).

>>> pop = SyntheticPopulation(n_users=50, n_units=5, n_items=40, events_per_user=2, seed=0)
>>> pop.users.shape, pop.pools.shape, bool((pop.pools[np.arange(pop.n), pop.correct] == pop.listened).all())
((100,), (100, 25), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.local.items import ItemBlanket, blanket_reaches, codebook, smallest_batch
from models.local.policy import LocalItemUCB

__all__ = ["SyntheticPopulation", "PopulationConfig", "population_gain", "inverse_cdf", "uncalibrated"]


@dataclass
class SyntheticPopulation:
    """Users in units, items with features and popularity, and the event stream (see the module docstring)."""

    n_users: int
    n_units: int = 100
    n_items: int = 1_000
    d: int = 25
    events_per_user: int = 3
    pool: int = 25
    beta: float = 3.0
    zipf: float = 1.0
    seed: int = 0
    features: np.ndarray = field(init=False, repr=False)
    users: np.ndarray = field(init=False, repr=False)
    units: np.ndarray = field(init=False, repr=False)
    listened: np.ndarray = field(init=False, repr=False)
    pools: np.ndarray = field(init=False, repr=False)
    correct: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        F = rng.normal(size=(self.n_items, self.d))
        self.features = F / np.linalg.norm(F, axis=1, keepdims=True)
        # unit sizes skewed like the friend-graph clusters: Zipf weights over units
        w_units = 1.0 / np.arange(1, self.n_units + 1)
        unit_of_user = rng.choice(self.n_units, size=self.n_users, p=w_units / w_units.sum())
        tastes = rng.normal(size=(self.n_units, self.d))
        tastes /= np.linalg.norm(tastes, axis=1, keepdims=True)
        log_pop = -self.zipf * np.log(np.arange(1, self.n_items + 1))
        rng.shuffle(log_pop)
        logits = self.beta * tastes @ self.features.T + log_pop  # (units, items)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        users = np.repeat(np.arange(self.n_users), self.events_per_user)
        rng.shuffle(users)
        self.users, self.units = users, unit_of_user[users]
        cdf = np.cumsum(probs, axis=1)
        u = rng.random(len(users))
        self.listened = inverse_cdf(cdf, self.units, u)
        # the pool: the listened item and pool - 1 others, drawn independently among the other items (an item may
        # repeat among the others: vectorized, and harmless — the listened item is in the pool once)
        others = rng.integers(0, self.n_items - 1, size=(len(users), self.pool - 1))
        others[others >= self.listened[:, None]] += 1  # every item but the listened one
        self.correct = rng.integers(0, self.pool, size=len(users))
        pools = np.empty((len(users), self.pool), dtype=np.int64)
        rows = np.arange(len(users))
        mask = np.ones((len(users), self.pool), dtype=bool)
        mask[rows, self.correct] = False
        pools[mask] = others.ravel()
        pools[rows, self.correct] = self.listened
        self.pools = pools

    @property
    def n(self) -> int:
        """Events in the stream."""
        return len(self.users)


def inverse_cdf(cdf: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws: for each event ``i``, the first item ``a`` with ``cdf[rows[i], a] >= u[i]`` (the last item
    if rounding left ``cdf[rows[i], -1] < u[i]``).

    The count of entries of ``cdf[rows[i]]`` below ``u[i]``, so bit for bit the draw of the dense
    ``(cdf[rows] < u[:, None]).sum(axis=1)`` (each row of a cumulative sum of non-negative numbers is
    non-decreasing), in ``O(events + rows x items)`` memory instead of ``events x items``: the events are
    grouped by row and each group is one ``np.searchsorted`` of its row.

    >>> cdf = np.array([[0.25, 0.5, 1.0], [0.0, 1.0, 1.0]])
    >>> inverse_cdf(cdf, np.array([0, 1, 0, 1]), np.array([0.1, 0.5, 0.5, 0.0]))
    array([0, 1, 1, 0])
    """
    if len(rows) and not (0 <= rows.min() and rows.max() < len(cdf)):
        raise ValueError(f"`rows` must index the {len(cdf)} rows of `cdf`, got values in [{rows.min()}, {rows.max()}].")
    out = np.empty(len(u), dtype=np.int64)
    order = np.argsort(rows, kind="stable")
    starts = np.searchsorted(rows[order], np.arange(len(cdf) + 1))
    for r in range(len(cdf)):
        idx = order[starts[r]:starts[r + 1]]
        if len(idx):
            out[idx] = np.searchsorted(cdf[r], u[idx], side="left")
    return np.minimum(out, cdf.shape[1] - 1, out=out)


@dataclass(frozen=True)
class PopulationConfig:
    """Settings of the population axis (``--quick``: 1,000 users only)."""

    sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    epsilon: float = 2.0
    delta: float = 1e-5
    cap: int = 2
    events_per_user: int = 3
    n_items: int = 1_000
    n_units: int = 100
    runs: int = 1
    batch_fraction: float = 0.2     # a batch holds this share of the population (distinct users)
    min_batch: int = 400
    share: float = 0.5              # the item reports' part of epsilon
    codewords: int = 0              # listens as codewords of a public codebook (k-means of the features); 0: Laplace
    seed: int = 0


def uncalibrated(policy: Any) -> str | None:
    """Calibrate ``policy``'s blankets now; ``None`` if they are (or it has none), else why one cannot be.

    A local policy's blankets of fake messages (:class:`models.local.items.ItemBlanket`: the item reports, the
    codewords) are calibrated when its first shuffled batch closes — or never, in a run too short to fill one.
    With too few distinct users per batch for the target ``(epsilon, delta)`` over ``cap`` batches no fake
    probability reaches it, and the calibration raises a plain ``ValueError``; only that one is caught here, as
    its own test (:func:`models.local.items.blanket_reaches`) confirms: any other error stays an error. The
    reason is the calibration's message and the smallest batch that would do
    (:func:`models.local.items.smallest_batch`). The experiments ask before a cell runs, so a cell is
    uncalibrated whether or not its run would have filled a batch.

    >>> from models.local.policy import LocalItemUCB
    >>> print(uncalibrated(LocalItemUCB(d=2, n_items=4, epsilon=1.0, batch=150, cap=2, seed=0, share=0.5)))
    no blanket reaches (0.5, 5e-06) with n = 150 users per batch and 2 batch(es) per user: make the batch larger
    (the smallest that reaches it holds 867 users).
    >>> uncalibrated(LocalItemUCB(d=2, n_items=4, epsilon=4.0, batch=150, cap=2, seed=0, share=0.5)) is None
    True
    """
    blankets = [getattr(policy, "items", None)]
    config = getattr(policy, "config", None)
    if getattr(config, "codewords", 0):
        blankets.append(config.blanket)  # LocalConfig with codewords: a blanket over the codes
    for b in blankets:
        if not isinstance(b, ItemBlanket):
            continue
        try:
            b.p  # the model's own calibration (cached): the one its first batch would do
        except ValueError as exc:
            if blanket_reaches(b.epsilon, b.delta, b.batch, compositions=b.cap):
                raise  # not the calibration's failure
            try:
                smallest = f"the smallest that reaches it holds {smallest_batch(b.epsilon, b.delta, b.cap)} users"
            except ValueError:  # not even smallest_batch's limit of users reaches it
                smallest = "no batch of up to a million users reaches it"
            return f"{str(exc).rstrip('.')} ({smallest})."
    return None


def _reward(policy: Any, pop: SyntheticPopulation) -> float:
    total = 0.0
    for i in range(pop.n):
        pool = pop.pools[i]
        X = pop.features[pool]
        user = str(int(pop.users[i]))
        k = policy.select(int(pop.units[i]), X, user=user, items=pool)
        r = 1.0 if k == int(pop.correct[i]) else 0.0
        a = int(pop.listened[i])
        policy.update(int(pop.units[i]), X[k], r, user=user, item=a, x_item=pop.features[a])
        total += r
    return total


def population_gain(n_users: int, cfg: PopulationConfig, run: int = 0) -> dict[str, Any]:
    """One population: rewards of random play, the non-private twin and ``local-shuffled-items``, and the gain kept.

    When the batch of this size is too small for the item reports' blanket at ``cfg``'s epsilon, delta and cap,
    ``local-shuffled-items`` cannot run: ``"uncalibrated"`` then holds the calibration's reason and every figure of the
    private run (its reward, the gain, what reached the model) is ``None``; otherwise ``"uncalibrated"`` is
    ``None``."""
    pop = SyntheticPopulation(n_users=n_users, n_units=cfg.n_units, n_items=cfg.n_items,
                              events_per_user=cfg.events_per_user, seed=cfg.seed + run)
    batch = max(cfg.min_batch, int(cfg.batch_fraction * n_users))
    cw = codebook(pop.features, cfg.codewords, seed=cfg.seed) if cfg.codewords else None
    common: dict[str, Any] = {"d": pop.d, "n_items": pop.n_items, "epsilon": cfg.epsilon, "delta": cfg.delta,
                              "batch": batch, "cap": cfg.cap, "share": cfg.share, "lambda_": 1.0,
                              "noise_ridge": 0.0 if cfg.codewords else 100.0, "seed": 1_000 + run, "codewords": cw}
    nonprivate = _reward(LocalItemUCB(**{**common, "private": False}), pop)
    local = LocalItemUCB(**common)
    random = pop.n / pop.pool
    base = {"n_users": n_users, "events": pop.n, "random": random, "nonprivate": nonprivate, "batch": batch}
    why = uncalibrated(local)
    if why is not None:  # the private run cannot start: nothing of it is measured
        return {**base, "local_shuffle": None, "gain": None, "batches": None, "reached": None, "reported": None,
                "item_noise_std": None, "messages_per_report": None, "uncalibrated": why}
    reward = _reward(local, pop)
    denom = nonprivate - random
    return {**base, "local_shuffle": reward, "gain": (reward - random) / denom if denom > 0 else None,
            "batches": local.batches, "reached": local.item_reports / pop.n,
            "reported": local.reports / pop.n, "item_noise_std": math.sqrt(local.variance),
            "messages_per_report": None if local.items is None else local.items.messages_per_report,
            "uncalibrated": None}

