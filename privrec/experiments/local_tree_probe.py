"""Why the per-user tree at user level earns less than random play on LastFM, and what any LDP mechanism could.

``python -m privrec.experiments.local_tree_probe [--variants a,b] [--events 5000] [--seeds 11,12,13]`` replays the
first LastFM events as ``privrec experiment modes`` does (:func:`privrec.experiments.modes.lastfm_reward`: the
policy picks one item of each event's pool of 25; reward 1 iff it is the logged one; ratio = reward / (events /
25)) with the local mode's real devices (:class:`models.local.LocalUCB`, ``tree``, user level, epsilon 2, cap 8)
and variants of the server's model (:class:`ProbeUCB`), then prints one JSON line per variant. ``--floor`` prints
the back-of-the-envelope bounds of :func:`ldp_floor` instead. Findings: docs/local-measurements.md.

Variants (:data:`VARIANTS`): the exploration bonus (``alpha``), the noise ridge (``kappa``), the model's mean
dropped (``theta0``: the bonus alone), a public prior mean of theta (:func:`public_prior`: the catalog's mean
feature, which costs no privacy), positive-part James-Stein shrinkage of each noisy sum (its noise variance is
public), one population-wide model from the sums of every unit (``pooled``), and devices that report the item
their user listened to instead of the reward of the recommended one (``listens``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from models.ground.linalg import ucb_scores_blas
from models.local import LocalConfig, LocalUCB
from models.local.aggregate import clip_context
from models.local.analyzer import Reports
from models.local.client import ReportRefused

__all__ = ["ProbeUCB", "VARIANTS", "public_prior", "ldp_floor", "run_variant", "main"]

FloatArray = NDArray[np.float64]


def public_prior(features: FloatArray, pool_size: int) -> FloatArray:
    """The serving solve's public prior (:func:`models.streaming.solve.public_prior`) at the reward of random play
    in a pool of ``pool_size``: the average item scores ``1 / pool_size``.

    >>> public_prior(np.array([[1.0, 0.0], [0.0, 1.0]]), 2).tolist()
    [0.5, 0.5]
    """
    from models.streaming.solve import public_prior as prior

    return prior(features, 1.0 / pool_size)


class ProbeUCB(LocalUCB):
    """:class:`models.local.LocalUCB` with the server-side switches of the probe (the devices are unchanged).

    Parameters
    ----------
    mode
        ``"unit"`` (LinUCB per model unit, as the pipeline), ``"pooled"`` (one model from the sums of every unit,
        its noise variance the sum of theirs), ``"theta0"`` (the mean dropped: the bonus alone).
    prior
        Prior mean of theta (``None``: zero): ``theta = M (b + ridge * prior)``, the ridge's Bayesian reading.
    james_stein
        Shrink each noisy sum ``b`` by ``max(0, 1 - (d - 2) var / ||b||^2)`` (its noise is isotropic with the
        public variance ``var``) before the solve.
    listens
        The device reports the item its user listened to (``r = 1`` on its context) instead of the reward of the
        recommended item; the Gram still takes the recommended item (as the global mode's organic listens).
    """

    def __init__(self, *, mode: str = "unit", prior: FloatArray | None = None, james_stein: bool = False,
                 listens: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.mode, self.james_stein, self.listens = mode, james_stein, listens
        self.prior = np.zeros(self.d) if prior is None else np.asarray(prior, dtype=np.float64)
        self.with_items = listens  # lastfm_reward then passes the logged item's context

    def select(self, unit: int, X: FloatArray, user: str | None = None, items: Any = None) -> int:
        mean, bonus = ucb_scores_blas(self.theta[unit], self.M[unit], X, self.alpha)
        score = mean + bonus
        best = np.flatnonzero(score >= score.max() - 1e-12)
        return int(best[0] if len(best) == 1 else self._rng.choice(best))

    def update(self, unit: int, x: FloatArray, reward: float, user: str | None = None, item: int | None = None,
               x_item: FloatArray | None = None) -> None:
        if not self.listens:
            super().update(unit, x, reward, user=user)
            return
        dev = self._device(str(unit) if user is None else str(user))
        x = clip_context(x)
        shown = str(len(self._contexts))
        self._contexts.append(x)
        try:
            assert x_item is not None
            rep = dev.report(rec_id=shown, x=clip_context(x_item), reward=1.0)
        except ReportRefused:
            self.refused += 1
        else:
            dev.acknowledge(rep.version)
            self.fold(Reports([(self.reports, dataclasses.replace(rep, shown=(shown,)), unit)]))
            self.reports += 1
        if (self.reports + self.refused) % self.tick == 0:
            self._solve()

    def _solve(self) -> None:
        a, d = self.state, self.d
        var = a.var
        B = a.b.copy()
        if self.james_stein:
            B = np.stack([_james_stein(B[u], float(var[u])) for u in range(self.n_units)])
        ridge = self.lambda_ + self.noise_ridge * float(np.sqrt(var.max(initial=0.0)))
        if self.mode == "pooled":
            bp = _james_stein(a.b.sum(0), float(var.sum())) if self.james_stein else a.b.sum(0)
            rp = self.lambda_ + self.noise_ridge * float(np.sqrt(var.sum()))
            Mp = np.linalg.inv(a.gram.sum(0) + rp * np.eye(d))
            self.theta = np.broadcast_to(Mp @ (bp + rp * self.prior), (self.n_units, d)).copy()
            self.M = np.broadcast_to(Mp, (self.n_units, d, d)).copy()
        else:
            self.M = np.linalg.inv(a.gram + ridge * np.eye(d))
            self.theta = np.einsum("uab,ub->ua", self.M, B + ridge * self.prior)
            if self.mode == "theta0":
                self.theta[:] = 0.0
        self.solves += 1


def _james_stein(b: FloatArray, var: float) -> FloatArray:
    nb = float(b @ b)
    return b * max(0.0, 1.0 - (len(b) - 2) * var / nb) if nb > 0 else b


#: name -> ProbeUCB options (``"prior": True`` becomes :func:`public_prior`); ``epsilon`` overrides 2.
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "alpha0": {"alpha": 0.0},
    "theta0": {"mode": "theta0"},
    "kappa0": {"kappa": 0.0},
    "kappa1000": {"kappa": 1000.0},
    "james_stein": {"james_stein": True, "alpha": 0.0},
    "pooled": {"mode": "pooled"},
    "pooled_a0": {"mode": "pooled", "alpha": 0.0},
    "prior": {"prior": True},
    "prior_a0": {"prior": True, "alpha": 0.0},
    "prior_kappa0": {"prior": True, "kappa": 0.0},
    "prior_kappa10": {"prior": True, "kappa": 10.0},
    "listens": {"listens": True},
    "listens_pooled_a0": {"listens": True, "mode": "pooled", "alpha": 0.0},
    "prior_listens": {"prior": True, "listens": True},
    "prior_listens_pooled": {"prior": True, "listens": True, "mode": "pooled", "alpha": 0.0},
    "prior_listens_pooled_kappa10": {"prior": True, "listens": True, "mode": "pooled", "alpha": 0.0, "kappa": 10.0},
    "nonprivate": {"epsilon": 1e6},
    "prior_nonprivate": {"prior": True, "epsilon": 1e6},
}


def run_variant(name: str, lf: dict[str, Any], seed: int) -> dict[str, float]:
    """One replay of variant ``name`` on the LastFM arrays ``lf`` (:func:`privrec.experiments.modes._lastfm_arrays`)."""
    from .modes import lastfm_reward

    opts = dict(VARIANTS[name])
    epsilon = float(opts.pop("epsilon", 2.0))
    alpha, kappa = float(opts.pop("alpha", 0.3)), float(opts.pop("kappa", 100.0))
    if opts.pop("prior", False):
        opts["prior"] = public_prior(lf["features"], lf["pool_size"])
    config = LocalConfig(algorithm="tree", d=lf["d"], epsilon=epsilon, delta=1e-5, unit="user", cap=8,
                         user_budget=10.0 if epsilon <= 10 else math.inf)
    pol = ProbeUCB(d=lf["d"], n_units=lf["n_units"], config=config, tick=100, seed=seed, lambda_=1.0, alpha=alpha,
                   noise_ridge=kappa, **opts)
    t0 = time.perf_counter()
    reward = lastfm_reward(pol, lf["units"], lf["pools"], lf["features"], lf["correct"], lf["users"])
    return {"ratio": reward / (len(lf["units"]) / lf["pool_size"]), "seconds": time.perf_counter() - t0,
            "refused": pol.refused / max(1, pol.reports + pol.refused), "noise_std_max": pol.state.noise_std()}


def ldp_floor(lf: dict[str, Any], epsilon: float = 2.0, delta: float = 1e-5, seeds: int = 100) -> dict[str, Any]:
    """Back-of-the-envelope: what any user-level epsilon-LDP mechanism without a shuffler can learn from ``lf``.

    * Item counts: a user's whole history is one record, so estimating one item's count (how many users listened
      to it) is at least as hard as summing one private bit per user; randomized response is optimal for a bit,
      with variance ``e^eps / (e^eps - 1)^2`` per user, so no mechanism estimates even *one* item's count with a
      std below ``sqrt(n_users e^eps / (e^eps - 1)^2)`` (all items at once: worse).
    * A population-wide linear model from every listen (full information, which the bandit replay does not
      give): the signal is ``s_u = sum over u's listens of (x_a - mean of its pool)``; a device clipping its
      ``s_u`` to norm ``C`` and releasing it with the Gaussian mechanism (sensitivity ``2C``) adds noise of std
      ``2C sqrt(2 ln(1.25/delta)) / eps`` per coordinate and user.
    * The replay ratio of in-sample oracles scored with that much noise (optimistic: they know the whole stream
      up front), and of the public prior (:func:`public_prior`) alone.
    """
    users, pools, correct, F = lf["users"], lf["pools"], lf["correct"], np.asarray(lf["features"])
    n, P = len(users), lf["pool_size"]
    X = F / np.maximum(1.0, np.linalg.norm(F, axis=1))[:, None]
    logged = pools[np.arange(n), correct]
    names, inv, m = np.unique(users, return_inverse=True, return_counts=True)
    rr = math.exp(epsilon) / (math.exp(epsilon) - 1.0) ** 2
    n_users = len(names)

    def ratio(scores: FloatArray) -> float:
        return float((scores[pools].argmax(axis=1) == correct).mean() * P)

    pop = np.zeros(len(F))
    np.add.at(pop, logged, 1.0)
    sd_item = math.sqrt(rr * n_users)
    rng = np.random.default_rng(0)
    S = X[logged] - X[pools].mean(axis=1)
    su = np.zeros((n_users, X.shape[1]))
    np.add.at(su, inv, S)
    norms = np.linalg.norm(su, axis=1)
    linear = {}
    for C in (1.0, 2.0, 6.3):
        sig = (su * np.minimum(1.0, C / np.maximum(norms, 1e-12))[:, None]).sum(axis=0)
        sd = 2 * C * math.sqrt(2 * math.log(1.25 / delta)) / epsilon * math.sqrt(n_users)
        rs = [ratio(X @ (sig + rng.normal(0.0, sd, X.shape[1]))) for _ in range(seeds)]
        linear[str(C)] = {"noise_std": sd, "signal_rms": float(np.linalg.norm(sig) / math.sqrt(X.shape[1])),
                          "ratio": float(np.mean(rs)), "ratio_sd": float(np.std(rs))}
    prior = X @ public_prior(F, P)
    return {"events": n, "users": n_users, "listens_per_user_mean": float(m.mean()),
            "listens_per_user_median": float(np.median(m)), "listens_per_user_max": int(m.max()),
            "distinct_items": int(len(np.unique(logged))), "top_item_listens": np.sort(pop)[::-1][:5].tolist(),
            "items_with_10_or_more": int((pop >= 10).sum()), "items_with_5_or_more": int((pop >= 5).sum()),
            "one_bit_count_std": sd_item,
            "popularity_in_sample_exact": ratio(pop + 1e-9 * rng.random(len(F))),
            "popularity_in_sample_at_one_bit_noise": float(np.mean(
                [ratio(pop + rng.normal(0.0, sd_item, len(F))) for _ in range(seeds)])),
            "linear_listens_in_sample_exact": ratio(X @ su.sum(axis=0)), "linear_gaussian_clipped": linear,
            "random_direction": float(np.mean([ratio(X @ rng.normal(size=X.shape[1])) for _ in range(seeds)])),
            "public_prior": ratio(prior)}


def main(argv: list[str] | None = None) -> None:
    """Run the probe's variants (or ``--floor``) and print JSON lines."""
    from .modes import _lastfm_arrays

    p = argparse.ArgumentParser(prog="python -m privrec.experiments.local_tree_probe", description=__doc__.split("\n")[0])
    p.add_argument("--variants", default="base,theta0,prior")
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--seeds", default="11,12,13")
    p.add_argument("--floor", action="store_true")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(map(repr, unknown))}; known: {', '.join(VARIANTS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds: a comma-separated list of integers, got {args.seeds!r}")
    lf = _lastfm_arrays(args.events, args.data_dir)
    if args.floor:
        print(json.dumps(ldp_floor(lf)), flush=True)
        return
    for name in args.variants.split(","):
        runs = [run_variant(name, lf, s) for s in seeds]
        rs = [r["ratio"] for r in runs]
        print(json.dumps({"variant": name, "ratio_mean": round(float(np.mean(rs)), 3),
                          "ratio_sd": round(float(np.std(rs, ddof=1)), 3) if len(rs) > 1 else 0.0,
                          "ratios": [round(x, 3) for x in rs], "refused": round(runs[0]["refused"], 3),
                          "noise_std_max": round(runs[0]["noise_std_max"], 1),
                          "seconds": round(sum(r["seconds"] for r in runs), 1), "events": args.events}), flush=True)


if __name__ == "__main__":
    main()
