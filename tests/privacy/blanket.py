"""The blanket audit's engine: a black-box ``(epsilon, delta)`` audit of the codeword blanket (local mode, live).

The codeword blanket (:class:`models.local.items.ItemBlanket`, Balcer & Cheu's shuffled histogram) is not a
linear-Gaussian release, so the Gaussian-DP distinguisher of :mod:`tests.privacy.audit` does not apply. This module
audits it as a black box, the standard recipe (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021): run the real
randomizer on two neighbouring batches over many seeded trials, count how often a test statistic falls in a
rejection region under each, and turn Clopper–Pearson bounds on the two rates into a lower bound on ``epsilon`` at
the claimed ``delta``.

**Trials** (:func:`run_trials`). One trial is a user's ``cap`` batches of an epoch (one report per batch, the
device's cap; ``cap = 1``: one batch). In each batch, ``users - 1`` other users listen to codeword ``c`` (their
reports are the same in both neighbours) and the audited device reports its listen: through the device's own path
(:func:`models.local.client.codeword_messages`, keyed exactly as :meth:`LocalClient.report` keys it: the device's
seed, ``ITEM_STREAM``, the report's version), its codeword ``u`` in one neighbour and ``v`` in the other. The
other users' reports come from the same randomizer (:meth:`ItemBlanket.randomize` with the dummy, which
``codeword_messages`` is), drawn from one generator per trial and batch. The analyzer sees the multiset of the
batch's messages — the dummy ``K`` included (it drops it only after seeing it) — i.e. the histogram over
``K + 1`` values; :func:`verify_batch` checks, with real :class:`LocalClient` devices and the real
:class:`Shuffler` and :class:`ShuffledBatch` parser, that this is what the analyzer receives and that nothing else
of the batch differs between the neighbours.

**Statistic.** Under the move neighbours (one message at ``u`` vs at ``v``, the others fixed) the likelihood ratio
of the histogram is a function of ``(h_u, h_v)`` only (every other count has the same law): with ``X, Y ~ Bin(n,
p)`` the fakes, ``P = (X + 1, Y)`` and ``Q = (X, Y + 1)``, ``log P/Q = g(h_u) - g(h_v)`` with ``g(h) = log(h / (n -
h + 1))`` — the ``p`` cancels, so the most powerful test needs only the public batch size ``n``. Over ``cap``
batches the log-ratios add: ``T = sum_batches g(h_u - s_u) - g(h_v - s_v)`` (``s``: the other users' own messages
at the two values, known to an adversary who knows everyone else's data; zero here). ``T = +inf`` when ``h_v = s_v``
in a batch: an outcome the second neighbour cannot produce.

**Bound** (:func:`epsilon_lower_bound`). For each threshold ``t`` of a grid fixed in advance (:data:`THRESHOLDS`,
``m`` of them), the region ``T >= t``: ``TPR_lo`` (Clopper–Pearson lower bound of its rate under the first
neighbour) and ``FPR_hi`` (upper bound under the second), each at level ``alpha / (2 m)`` (Bonferroni over the
grid and the two rates), and ``epsilon_lb = max_t log((TPR_lo - delta) / FPR_hi)``. A mechanism that is
``(epsilon, delta)``-DP has ``TPR <= e^epsilon FPR + delta`` for every region, so ``epsilon_lb > epsilon`` with
probability at most ``alpha`` over the seeds (the seeds are fixed: a run is deterministic).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest

from models.local import LocalClient, LocalConfig, MemoryStorage
from models.local.client import codeword_messages
from models.local.items import ITEM_STREAM
from models.local.shuffle import POPULATION, ShuffledBatch, Shuffler

__all__ = ["THRESHOLDS", "Trials", "Bound", "statistic", "run_trials", "epsilon_lower_bound", "verify_batch",
           "device_seed", "device_messages"]

#: Thresholds of the rejection regions ``T >= t`` (nats of the log-likelihood ratio), fixed before any trial: the
#: region where the claim's privacy loss sits (``epsilon`` 1–3 at ``delta`` 1e-5), the tails, and ``+inf`` (outcomes
#: the second neighbour cannot produce).
THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, math.inf)
#: Generator keys of the other users' reports (per trial and batch) and of the audited device's secret seed.
_OTHERS, _DEVICE = 7_001, 7_002


def device_seed(trial: int) -> int:
    """The audited device's secret seed in trial ``trial`` (the same in both neighbours: a coupling)."""
    return int(np.random.SeedSequence([_DEVICE, trial]).generate_state(1, dtype=np.uint64)[0] >> 1)


def device_messages(config: LocalConfig, trial: int, version: int, code: int, reward: float) -> tuple[int, ...]:
    """The audited device's messages of its report ``version`` in trial ``trial``: the device's own function
    (:func:`codeword_messages`), keyed as :meth:`LocalClient.report` keys it (seed, ``ITEM_STREAM``, version)."""
    rng = np.random.default_rng([device_seed(trial), ITEM_STREAM, version])
    return codeword_messages(config, code, reward, rng)


@dataclass(frozen=True)
class Trials:
    """Per listen of the audited device, the analyzer's histograms in every trial (``trials x batches x (K + 1)``)."""

    hists: tuple[np.ndarray, ...]
    users: int


def run_trials(config: LocalConfig, trials: Sequence[int], *, users: int, listens: Sequence[tuple[int, float]],
               others: int, batches: int) -> Trials:
    """The histograms the analyzer sees in each of ``trials``: ``batches`` batches of ``users`` distinct users.

    ``listens``: the audited device's listen in each neighbour, ``(codeword, reward)`` (reward 0: the listen is not
    sent, the dummy stands in); the other users' reports are the same under every listen (a coupling: each
    neighbour's trials are independent draws of its own law). ``others``: the codeword every other user listens to
    (reward 1).
    """
    blanket = config.blanket
    width = config.codewords + 1  # the codewords and the dummy: every value the analyzer sees
    out = [np.zeros((len(trials), batches, width), np.int64) for _ in listens]
    for i, trial in enumerate(trials):
        for j in range(batches):
            rng = np.random.default_rng([_OTHERS, trial, j])
            rest = [blanket.randomize(others, reward=1.0, rng=rng, dummy=True) for _ in range(users - 1)]
            base = np.bincount(np.concatenate(rest), minlength=width) if rest else np.zeros(width, np.int64)
            for hist, (code, reward) in zip(out, listens):
                mine = device_messages(config, trial, j + 1, code, reward)
                hist[i, j] = base + np.bincount(np.asarray(mine, np.int64), minlength=width)
    return Trials(tuple(out), users)


def statistic(hist: np.ndarray, users: int, u: int, v: int) -> np.ndarray:
    """``T`` per trial (``hist``: ``trials x batches x values``): the log-likelihood ratio of one message at ``u``
    against one at ``v`` (module docstring), summed over the batches; ``+inf`` where a batch has ``h_v = 0``."""
    def g(h: np.ndarray) -> np.ndarray:
        x = h.astype(np.float64)
        with np.errstate(divide="ignore"):
            out: np.ndarray = np.log(x) - np.log(users - x + 1.0)
        return out

    per = g(hist[:, :, u]) - g(hist[:, :, v])
    total: np.ndarray = per.sum(axis=1)
    return total


@dataclass(frozen=True)
class Bound:
    """The audit's lower bound on ``epsilon`` at ``delta`` and the region that gave it."""

    epsilon: float        # -inf: no region has TPR_lo > delta
    threshold: float
    tpr: float            # observed rates of the region under each neighbour
    fpr: float
    tpr_lo: float
    fpr_hi: float
    n: int                # trials per neighbour


def epsilon_lower_bound(t_first: np.ndarray, t_second: np.ndarray, delta: float, alpha: float,
                        thresholds: Sequence[float] = THRESHOLDS) -> Bound:
    """``max_t log((TPR_lo - delta) / FPR_hi)`` over the regions ``T >= t`` (Clopper–Pearson, each rate at level
    ``alpha / (2 m)``): a lower bound on the ``epsilon`` of the mechanism at ``delta``, wrong with probability at
    most ``alpha``."""
    n1, n2 = len(t_first), len(t_second)
    level = 1.0 - alpha / (2 * len(thresholds))
    best = Bound(-math.inf, math.nan, 0.0, 0.0, 0.0, 1.0, n1)
    for t in thresholds:
        k1, k2 = int(np.sum(t_first >= t)), int(np.sum(t_second >= t))
        lo = binomtest(k1, n1, alternative="greater").proportion_ci(confidence_level=level).low
        hi = binomtest(k2, n2, alternative="less").proportion_ci(confidence_level=level).high
        if lo > delta:
            eps = math.log((lo - delta) / hi)
            if eps > best.epsilon:
                best = Bound(eps, t, k1 / n1, k2 / n2, lo, hi, n1)
    return best


def verify_batch(config: LocalConfig, trial: int, *, code: int, others: int, codebook: np.ndarray,
                 shown: tuple[str, ...]) -> tuple[ShuffledBatch, list[int]]:
    """One batch of ``config.shuffle_batch`` real devices through the real shuffler and the analyzer's parser.

    The audited device (seed :func:`device_seed` ``(trial)``) listens to ``code``, the others (their own seeds) to
    ``others``; every report is answered on the list ``shown`` (the server adds it). Returns the batch as the
    analyzer parses it and the audited device's messages; asserts that the batch's messages are exactly the
    multiset of its reports' messages (the analyzer's histogram is the sum of the reports' histograms).
    """
    shuffler = Shuffler(config)
    mine: list[int] = []
    every: Counter[int] = Counter()
    closed: list[ShuffledBatch] = []
    for k in range(config.shuffle_batch):
        user = "audited" if k == 0 else f"other{k}"
        seed = device_seed(trial) if k == 0 else 10_000 * trial + k
        dev = LocalClient(user, config, MemoryStorage(), seed=seed, clock=lambda: 0.0, codebook=codebook)
        rep = dev.report(rec_id=f"r{k}", x=codebook[code if k == 0 else others], reward=1.0)
        rep = dataclasses.replace(rep, shown=shown)  # what the server adds: the answered list (public)
        if k == 0:
            mine = list(rep.messages)
        every.update(rep.messages)
        closed += shuffler.add(rep, unit=POPULATION, messages=rep.messages)
    assert len(closed) == 1, len(closed)
    batch = ShuffledBatch.parse(closed[0].to_json(), d=config.d)
    assert Counter(batch.messages) == every, "the batch's messages are not its reports' messages"
    return batch, mine
