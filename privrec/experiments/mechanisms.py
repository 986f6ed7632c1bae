"""Continual-release mechanisms side by side: the papers' tree, the other papers' LinUCBs, and better estimators.

One run = one seeded synthetic environment (the collaborative paper's setting:
d = 25, N = 10 users, 1,000 arms, 10 shown, lambda = 0.1, alpha = 0.3,
rewards clipped to [0, 1]) shared by every row, so differences are paired.
Rows (:data:`ROWS`):

* the papers' Laplace binary tree (``paper``, tick 1) — the reference;
* single improvements: exact Gaussian-DP accounting, Honaker's estimator,
  the smooth binary mechanism, the BLT square-root factorization,
  user-space noise ``(V ⊗ I) xi``;
* combinations with a release tick (fewer leaves): the tick of every
  ``+tick`` row is **tuned on separate seeds** (``tune_seed + r``, disjoint
  from the reported seeds ``seed + r``) over fractions of the horizon, for
  each algorithm, by the mean regret over ``tune_epsilons``;
* the other papers' LinUCB variants (DP-LinUCB only: the papers define no
  CoLin version): Shariff & Sheffet (Gaussian paper/tight, Wishart; their
  width, plus the tight Gaussian with the common alpha = 0.3) and DGS
  (Laplace, Gaussian; lambda_0 = lambda_min of the public arm pool's second
  moment).

Reported per row, algorithm and epsilon: regret, added regret (private −
non-private, the non-private twin at tick 1), the share of the learning gain
privacy costs ((private − non-private) / (random − non-private)), the ratio
of added regret to the ``paper`` row's, and the guarantee the row's
mechanism really gives at that epsilon. Outputs: ``mechanisms.json``,
``mechanisms.md``, ``mechanisms.png``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.accounting import describe
from models.policies.baselines import BASELINES
from models.ground.environment import SyntheticEnvironment
from models.mechanisms import MECHANISMS
from models.policies import make_policy

from .plots import epsilon_axis, pyplot, save
from .runner import Job, JobResult, machine_info, run_jobs, summarize

__all__ = ["ROWS", "Row", "MechanismsConfig", "run_mechanisms", "DEFAULT_ROW"]

EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0)
ALGORITHMS = ("DP-LinUCB", "DP-CoLin")
TWIN = {"DP-LinUCB": "LinUCB", "DP-CoLin": "CoLin"}
TUNED = "tuned"


@dataclass(frozen=True)
class Row:
    """One mechanism configuration (a row of the report).

    ``mechanism``: a :data:`~models.mechanisms.MECHANISMS` name for DP-LinUCB
    and DP-CoLin; or ``baseline``: a :data:`~models.policies.baselines.BASELINES` name
    (DP-LinUCB only). ``tick``: interactions per release, or ``"tuned"``.
    """

    name: str
    about: str
    mechanism: str | None = None
    baseline: str | None = None
    tick: int | str = 1
    alpha: float | str | None = None  # None: the common alpha (baselines: their default)
    options: dict[str, Any] = field(default_factory=dict)
    #: KroneckerUCB's noise-scaled ridge kappa, or "tuned" (then the tick is the one tuned for ``tick_from``)
    noise_ridge: float | str = 0.0
    tick_from: str | None = None

    @property
    def algorithms(self) -> tuple[str, ...]:
        return ("DP-LinUCB",) if self.baseline else ALGORITHMS

    def privacy_unit(self) -> str:
        if self.baseline and self.baseline.startswith("SS-"):
            return "joint DP, event-level, replace-one (context, reward) with ||x|| <= 1, reward in [0, 1]"
        return "DP, event-level, replace-one reward in [0, 1] (contexts public), ||x|| <= 1"


ROWS: tuple[Row, ...] = (
    Row("paper", "the papers' binary tree, Laplace scaled to the L2 sensitivity (reference)", mechanism="paper"),
    Row("paper+tick", "the papers' tree with a tuned release tick", mechanism="paper", tick=TUNED),
    Row("gaussian-exact", "binary tree, Gaussian noise, exact Gaussian-DP accounting", mechanism="gaussian-exact"),
    Row("honaker-paper", "the papers' noise, Honaker's online estimator", mechanism="honaker-paper"),
    Row("honaker-exact", "Honaker's estimator, Gaussian, exact accounting", mechanism="honaker-exact"),
    Row("smooth-exact", "smooth binary mechanism, Gaussian, exact accounting", mechanism="smooth-exact"),
    Row("blt-exact", "BLT square-root factorization, Gaussian, exact accounting", mechanism="blt-exact"),
    Row("blt-exact+tick", "BLT factorization, exact accounting, tuned tick", mechanism="blt-exact", tick=TUNED),
    Row("user-blt-exact", "BLT on the users' own statistics, mixed by V (user-space noise)",
        mechanism="user-blt-exact"),
    Row("user-blt-exact+tick", "user-space BLT, exact accounting, tuned tick", mechanism="user-blt-exact",
        tick=TUNED),
    Row("user-blt-exact+tick+ridge", "user-space BLT, exact accounting, tuned tick, noise-scaled ridge "
        "lambda + kappa * (release noise std), kappa tuned", mechanism="user-blt-exact", tick=TUNED,
        noise_ridge=TUNED, tick_from="user-blt-exact+tick"),
    Row("SS-Gaussian", "Shariff & Sheffet, Gaussian, paper calibration, their width", baseline="SS-LinUCB-Gaussian"),
    Row("SS-Gaussian-tight", "Shariff & Sheffet, Gaussian, exact calibration (ERRATA §6), their width",
        baseline="SS-LinUCB-Gaussian-tight"),
    Row("SS-Wishart", "Shariff & Sheffet, shifted Wishart with D.3 padding, run at eps/2, their width",
        baseline="SS-LinUCB-Wishart"),
    Row("SS-Gaussian-tight-a0.3", "Shariff & Sheffet, Gaussian, exact calibration, constant alpha = 0.3",
        baseline="SS-LinUCB-Gaussian-tight", alpha=0.3),
    Row("DGS-Laplace", "dynamic global sensitivity, Laplace on theta (paper scale), alpha = 0.3",
        baseline="DGS-LinUCB-Laplace"),
    Row("DGS-Gaussian", "dynamic global sensitivity, Gaussian on theta (zCDP), alpha = 0.3",
        baseline="DGS-LinUCB-Gaussian"),
)

#: The recommended default (a row name); its mechanism is ``user-blt-exact``.
DEFAULT_ROW = "user-blt-exact+tick+ridge"
REFERENCE_ROW = "paper"


@dataclass(frozen=True)
class MechanismsConfig:
    """Every setting of one run of the experiment (all written to ``mechanisms.json``)."""

    runs: int = 5
    horizon: int = 100_000
    seed: int = 0
    epsilons: tuple[float, ...] = EPSILONS
    delta: float = 1e-5
    lambda_: float = 0.1
    alpha: float = 0.3
    d: int = 25
    n_users: int = 10
    n_arms: int = 1000
    n_shown: int = 10
    reward_std: float = 0.1
    w_quantile: float = 0.5
    jobs: int | None = None
    tune: bool = True
    tune_runs: int = 2
    tune_seed: int = 1000
    tune_epsilons: tuple[float, ...] = (2.0, 5.0, 10.0)
    tick_fractions: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1)  # capped at 10 %: at least 10 releases
    fixed_tick: int | None = None  # the "+tick" rows' tick when not tuning (default: 5 % of the horizon)
    rows: tuple[str, ...] = tuple(r.name for r in ROWS)
    ridges: tuple[float, ...] = (10.0, 30.0, 100.0, 300.0)  # kappa candidates of the "+ridge" rows

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"`--runs` must be at least 1, got {self.runs}.")
        if self.horizon < 1:
            raise ValueError(f"`--horizon` must be positive, got {self.horizon}.")
        if self.tune_runs < 1:
            raise ValueError(f"`--tune-runs` must be at least 1, got {self.tune_runs}.")
        if not 0 < self.delta < 1:
            raise ValueError(f"`--delta` must be in (0, 1), got {self.delta}.")
        for e in (*self.epsilons, *self.tune_epsilons):
            if not e > 0:
                raise ValueError(f"every epsilon must be positive, got {e}.")
        if self.fixed_tick is not None and self.fixed_tick < 1:
            raise ValueError(f"`--tick` must be a positive number of interactions, got {self.fixed_tick}.")
        known = {r.name for r in ROWS}
        unknown = [r for r in self.rows if r not in known]
        if unknown:
            raise ValueError(f"`--rows` must be among {sorted(known)}, got {unknown}.")
        if REFERENCE_ROW not in self.rows:
            raise ValueError(f"`--rows` must include the reference row {REFERENCE_ROW!r}.")
        report = set(range(self.seed, self.seed + self.runs))
        tuning = set(range(self.tune_seed, self.tune_seed + self.tune_runs))
        if self.tune and report & tuning:
            raise ValueError(f"tuning seeds {sorted(tuning)} must not overlap the reported seeds {sorted(report)}.")

    @property
    def ticks(self) -> list[int]:
        """The candidate ticks: ``tick_fractions`` of the horizon (at least 1 interaction)."""
        return sorted({max(1, round(f * self.horizon)) for f in self.tick_fractions})

    def env_spec(self, seed: int) -> dict[str, Any]:
        return {"n_users": self.n_users, "d": self.d, "n_arms": self.n_arms, "n_shown": self.n_shown,
                "reward_std": self.reward_std, "w_quantile": self.w_quantile, "horizon": self.horizon,
                "seed": seed, "clip_rewards": True}

    def selected_rows(self) -> list[Row]:
        return [r for r in ROWS if r.name in self.rows]


def pool_lambda_0(cfg: MechanismsConfig, seed: int) -> float:
    """``lambda_min(E[x x^T])`` over the public arm pool of run ``seed`` (DGS's lambda_0; spec D.9 option 2)."""
    env = SyntheticEnvironment(**{**cfg.env_spec(seed), "horizon": 1})
    arms = env.arms
    return float(np.linalg.eigvalsh(arms.T @ arms / len(arms))[0])


def _policy_spec(cfg: MechanismsConfig, row: Row, algorithm: str, tick: int, seed: int,
                 kappa: float = 0.0) -> tuple[str, dict[str, Any]]:
    """``(make_policy name, keyword arguments)`` for one cell."""
    spec: dict[str, Any] = {"lambda_": cfg.lambda_, "delta": cfg.delta, "tick": tick}
    if kappa:
        spec["noise_ridge"] = kappa
    if row.baseline:
        options = dict(row.options)
        if row.baseline.startswith("DGS-"):
            options.setdefault("lambda_0", pool_lambda_0(cfg, seed))
        spec["options"] = options
        spec["alpha"] = row.alpha if row.alpha is not None else ("theory" if row.baseline.startswith("SS-")
                                                                  else cfg.alpha)
        return row.baseline, spec
    spec["alpha"] = cfg.alpha if row.alpha is None else row.alpha
    spec["mechanism"] = row.mechanism
    return algorithm, spec


# --------------------------------------------------------------------------- tuning


def _tick_tuned_rows(cfg: MechanismsConfig) -> list[Row]:
    """Rows whose own tick is tuned: the selected ones, and those a selected row takes its tick from.

    ``user-blt-exact+tick+ridge`` reuses ``user-blt-exact+tick``'s tick, so that tick is tuned even
    when only the ``+ridge`` row is selected (any subset of rows must run).
    """
    selected = cfg.selected_rows()
    wanted = {r.name for r in selected if r.tick == TUNED and not r.tick_from}
    wanted |= {r.tick_from for r in selected if r.tick_from}
    return [r for r in ROWS if r.name in wanted]


def build_tuning_jobs(cfg: MechanismsConfig) -> list[Job]:
    jobs: list[Job] = []
    for r in range(cfg.tune_runs):
        env = cfg.env_spec(cfg.tune_seed + r)
        for row in _tick_tuned_rows(cfg):
            for alg in row.algorithms:
                for tick in cfg.ticks:
                    name, spec = _policy_spec(cfg, row, alg, tick, env["seed"])
                    for eps in cfg.tune_epsilons:
                        jobs.append(Job(r, name, eps, env, spec, label=f"{row.name}@{tick}", checkpoints=1))
    return jobs


def choose_ticks(cfg: MechanismsConfig, results: list[JobResult]) -> dict[str, Any]:
    """Per tuned row and algorithm: the tick with the lowest scale-free score on the tuning seeds.

    The score of a tick is the mean over (epsilon, tuning run) of its regret
    divided by the best candidate's regret in that cell, so that every
    epsilon weighs the same (raw regret would let the noisiest epsilon decide).
    """
    table: dict[str, dict[str, dict[str, float]]] = {}
    scores: dict[str, dict[str, dict[str, float]]] = {}
    chosen: dict[str, dict[str, int]] = {}
    for row in _tick_tuned_rows(cfg):
        for alg in row.algorithms:
            name = row.baseline or alg
            cell: dict[tuple[float, int], dict[int, float]] = {}
            for x in results:
                if x.job.algorithm == name and x.job.label.startswith(f"{row.name}@"):
                    tick = int(x.job.label.rsplit("@", 1)[1])
                    cell.setdefault((x.job.epsilon, x.job.run), {})[tick] = x.regret
            means = {str(t): float(np.mean([c[t] for c in cell.values()])) for t in cfg.ticks}
            score = {str(t): float(np.mean([c[t] / min(c.values()) for c in cell.values()])) for t in cfg.ticks}
            table.setdefault(row.name, {})[alg] = means
            scores.setdefault(row.name, {})[alg] = score
            chosen.setdefault(row.name, {})[alg] = int(min(score, key=lambda k: score[k]))
    for row in cfg.selected_rows():  # rows that reuse another row's tick
        if row.tick_from:
            chosen[row.name] = dict(chosen.get(row.tick_from, {}))
    return {"mean_regret": table, "score": scores, "chosen": chosen,
            "rule": "argmin over ticks of mean_{eps, run} regret / best regret of that (eps, run)"}


def build_ridge_tuning_jobs(cfg: MechanismsConfig, ticks: dict[str, dict[str, int]]) -> list[Job]:
    """Stage 2 of the tuning: kappa of the "+ridge" rows, at their (already tuned) tick, on the tuning seeds."""
    jobs: list[Job] = []
    for r in range(cfg.tune_runs):
        env = cfg.env_spec(cfg.tune_seed + r)
        for row in cfg.selected_rows():
            if row.noise_ridge != TUNED:
                continue
            for alg in row.algorithms:
                for kappa in cfg.ridges:
                    name, spec = _policy_spec(cfg, row, alg, _tick(row, alg, ticks), env["seed"], kappa)
                    for eps in cfg.tune_epsilons:
                        jobs.append(Job(r, name, eps, env, spec, label=f"{row.name}@k{kappa:g}", checkpoints=1))
    return jobs


def choose_ridges(cfg: MechanismsConfig, results: list[JobResult]) -> dict[str, Any]:
    """Per "+ridge" row and algorithm: the kappa with the lowest scale-free score (same rule as the ticks)."""
    scores: dict[str, dict[str, dict[str, float]]] = {}
    chosen: dict[str, dict[str, float]] = {}
    for row in cfg.selected_rows():
        if row.noise_ridge != TUNED:
            continue
        for alg in row.algorithms:
            cell: dict[tuple[float, int], dict[float, float]] = {}
            for x in results:
                if x.job.algorithm == alg and x.job.label.startswith(f"{row.name}@k"):
                    kappa = float(x.job.label.rsplit("@k", 1)[1])
                    cell.setdefault((x.job.epsilon, x.job.run), {})[kappa] = x.regret
            score = {f"{k:g}": float(np.mean([c[k] / min(c.values()) for c in cell.values()])) for k in cfg.ridges}
            scores.setdefault(row.name, {})[alg] = score
            chosen.setdefault(row.name, {})[alg] = float(min(score, key=lambda k: score[k]))
    return {"score": scores, "chosen": chosen, "candidates": list(cfg.ridges)}


def _tick(row: Row, alg: str, ticks: dict[str, dict[str, int]]) -> int:
    return ticks[row.name][alg] if row.tick == TUNED else int(row.tick)


def _kappa(row: Row, alg: str, ridges: dict[str, dict[str, float]]) -> float:
    return ridges[row.name][alg] if row.noise_ridge == TUNED else float(row.noise_ridge)


# --------------------------------------------------------------------------- main grid


def build_jobs(cfg: MechanismsConfig, ticks: dict[str, dict[str, int]],
               ridges: dict[str, dict[str, float]] | None = None) -> list[Job]:
    jobs: list[Job] = []
    for r in range(cfg.runs):
        env = cfg.env_spec(cfg.seed + r)
        jobs.append(Job(r, "random", math.inf, env))
        for alg in ALGORITHMS:
            jobs.append(Job(r, TWIN[alg], math.inf, env, {"lambda_": cfg.lambda_, "alpha": cfg.alpha, "tick": 1}))
        for row in cfg.selected_rows():
            for alg in row.algorithms:
                name, spec = _policy_spec(cfg, row, alg, _tick(row, alg, ticks), env["seed"],
                                          _kappa(row, alg, ridges or {}))
                for eps in cfg.epsilons:
                    jobs.append(Job(r, name, eps, env, spec, label=row.name))
    return jobs


def guarantees(cfg: MechanismsConfig, ticks: dict[str, dict[str, int]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """What each row's mechanism really guarantees at each epsilon (from its event, independent of the run)."""
    env = SyntheticEnvironment(**{**cfg.env_spec(cfg.seed), "horizon": 1})
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in cfg.selected_rows():
        for alg in row.algorithms:
            tick = ticks[row.name][alg] if row.tick == TUNED else int(row.tick)
            name, spec = _policy_spec(cfg, row, alg, tick, cfg.seed)
            cells = []
            for eps in cfg.epsilons:
                pol = make_policy(name, d=cfg.d, W=env.W, epsilon=eps, horizon=cfg.horizon, seed=0, **spec)
                event = getattr(pol, "mechanism", None)
                event = event.event if event is not None else pol.event  # type: ignore[attr-defined]
                g = describe(event, cfg.delta)
                cells.append({"epsilon": g.epsilon, "delta": g.delta, "valid": g.valid, "note": g.note,
                              "event": repr(event)})
            out.setdefault(row.name, {})[alg] = cells
    return out


def _per_run(results: list[JobResult], *, label: str | None = None, algorithm: str, eps: float | None) -> list[float]:
    rs = [r for r in results if r.job.algorithm == algorithm and (label is None or r.job.label == label)
          and (eps is None or r.job.epsilon == eps)]
    return [r.regret for r in sorted(rs, key=lambda r: r.job.run)]


def assemble(cfg: MechanismsConfig, results: list[JobResult], tuning: dict[str, Any],
             ticks: dict[str, dict[str, int]], timings: dict[str, float],
             ridges: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    ridges = ridges or {}
    eps = list(cfg.epsilons)
    random = np.asarray(_per_run(results, algorithm="random", eps=None))
    nonprivate = {alg: np.asarray(_per_run(results, algorithm=TWIN[alg], eps=None)) for alg in ALGORITHMS}
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    per_run: dict[str, dict[str, list[list[float]]]] = {}
    seconds: dict[str, float] = {}
    for row in cfg.selected_rows():
        rs = [r for r in results if r.job.label == row.name]
        seconds[row.name] = float(np.mean([r.seconds for r in rs])) if rs else math.nan
        for alg in row.algorithms:
            name = row.baseline or alg
            vals = [np.asarray(_per_run(results, label=row.name, algorithm=name, eps=e)) for e in eps]
            added = [v - nonprivate[alg] for v in vals]
            gain = random - nonprivate[alg]
            rows.setdefault(row.name, {})[alg] = {
                "regret": [float(v.mean()) for v in vals],
                "std": [summarize(v)[1] for v in vals],
                "added_regret": [float(a.mean()) for a in added],
                "added_std": [summarize(a)[1] for a in added],
                "share_of_gain": [float(a.mean() / gain.mean()) for a in added],
                "tick": ticks[row.name][alg] if row.tick == TUNED else int(row.tick),
                "noise_ridge": _kappa(row, alg, ridges),
            }
            per_run.setdefault(row.name, {})[alg] = [v.tolist() for v in vals]
    for row_name, by_alg in rows.items():
        for alg, cell in by_alg.items():
            ref = rows[REFERENCE_ROW][alg]["added_regret"]
            cell["ratio_to_paper"] = [a / p if p > 0 else math.nan for a, p in zip(cell["added_regret"], ref)]
    target = {}
    if DEFAULT_ROW in rows:
        for alg, cell in rows[DEFAULT_ROW].items():
            target[alg] = {str(e): cell["ratio_to_paper"][i] for i, e in enumerate(eps) if e in (2.0, 5.0, 10.0)}
    met = bool(target) and all(v <= 0.5 for by in target.values() for v in by.values())
    guar = guarantees(cfg, ticks)
    default_alg_ticks = rows.get(DEFAULT_ROW, {})
    return {
        "epsilons": eps,
        "default": DEFAULT_ROW,
        "default_mechanism": {
            "name": "user-blt-exact",
            "about": MECHANISMS["user-blt-exact"],
            "tick": {alg: c["tick"] for alg, c in default_alg_ticks.items()},
            "noise_ridge": {alg: c["noise_ridge"] for alg, c in default_alg_ticks.items()},
            "guarantee": guar.get(DEFAULT_ROW, {}),
        },
        "rows": rows,
        "row_about": {r.name: {"about": r.about, "mechanism": r.mechanism, "baseline": r.baseline,
                               "tick": r.tick, "privacy_unit": r.privacy_unit()} for r in cfg.selected_rows()},
        "guarantees": guar,
        "nonprivate": {alg: {"name": TWIN[alg], "regret": float(v.mean()), "std": summarize(v)[1]}
                       for alg, v in nonprivate.items()},
        "random": {"regret": float(random.mean()), "std": summarize(random)[1]},
        "target": {"criterion": f"{DEFAULT_ROW} added regret <= 0.5 x paper's at eps in {{2, 5, 10}}",
                   "ratio": target, "met": met},
        "tuning": {**tuning, "seeds": [cfg.tune_seed + r for r in range(cfg.tune_runs)],
                   "epsilons": list(cfg.tune_epsilons), "candidates": cfg.ticks, "enabled": cfg.tune},
        "per_run": per_run,
        "settings": {**{k: v for k, v in asdict(cfg).items() if k not in ("rows",)},
                     "rows": list(cfg.rows), "seeds": [cfg.seed + r for r in range(cfg.runs)],
                     "horizon_counts": "interactions (round-robin users)",
                     "environment": "collaborative paper's synthetic setting (models.ground.environment); rewards "
                                    "x^T Theta W[:,u] + N(0, reward_std^2) clipped to [0, 1]",
                     "nonprivate_twin": "LinUCB / CoLin at tick 1 with the same lambda and alpha",
                     "share_of_gain": "(private - non-private) / (random - non-private)",
                     "ratio_to_paper": "added regret / added regret of the 'paper' row, same algorithm"},
        "timings": {**timings, "seconds_per_run": seconds},
        "machine": machine_info(),
    }


def run_mechanisms(cfg: MechanismsConfig, out: Path, *, progress: bool = True) -> dict[str, Any]:
    """Tune the ticks (held-out seeds), run the grid, write every output into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tuning: dict[str, Any] = {"mean_regret": {}, "score": {}, "chosen": {}}
    if cfg.tune:
        tune_results = run_jobs(build_tuning_jobs(cfg), n_jobs=cfg.jobs, desc="mechanisms[tune ticks]",
                                progress=progress)
        tuning = choose_ticks(cfg, tune_results)
        ticks = tuning["chosen"]
    else:
        fixed = cfg.fixed_tick or max(1, round(0.05 * cfg.horizon))
        ticks = {r.name: {a: fixed for a in r.algorithms} for r in cfg.selected_rows() if r.tick == TUNED}
    ridge_tuning: dict[str, Any] = {"score": {}, "chosen": {}, "candidates": list(cfg.ridges)}
    if cfg.tune:
        ridge_jobs = build_ridge_tuning_jobs(cfg, ticks)
        if ridge_jobs:
            ridge_tuning = choose_ridges(cfg, run_jobs(ridge_jobs, n_jobs=cfg.jobs, desc="mechanisms[tune kappa]",
                                                       progress=progress))
        ridges = ridge_tuning["chosen"]
    else:
        ridges = {r.name: {a: cfg.ridges[len(cfg.ridges) // 2] for a in r.algorithms}
                  for r in cfg.selected_rows() if r.noise_ridge == TUNED}
    tuning["ridge"] = ridge_tuning
    t1 = time.perf_counter()
    results = run_jobs(build_jobs(cfg, ticks, ridges), n_jobs=cfg.jobs, desc="mechanisms", progress=progress)
    t2 = time.perf_counter()
    doc = assemble(cfg, results, tuning, ticks, {"tuning_seconds": t1 - t0, "grid_seconds": t2 - t1,
                                                 "total_seconds": t2 - t0}, ridges)
    write_outputs(doc, out)
    return doc


# --------------------------------------------------------------------------- outputs


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(repr(o))


def _finite(o: Any) -> Any:
    """NaN (an undefined ratio) becomes ``null``: strict JSON has no NaN."""
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def write_outputs(doc: dict[str, Any], out: Path) -> None:
    """``mechanisms.json`` (machine-readable), ``mechanisms.md`` and ``mechanisms.png``."""
    (out / "mechanisms.json").write_text(json.dumps(_finite(doc), indent=2, default=_json_default,
                                                    allow_nan=False) + "\n")
    (out / "mechanisms.md").write_text(render_markdown(doc))
    plot(doc, out / "mechanisms.png")


def _g(cell: dict[str, Any]) -> str:
    eps = cell["epsilon"]
    e = "∞" if math.isinf(eps) else f"{eps:.3g}"
    return f"({e}, {cell['delta']:.0e})" + ("" if cell["valid"] else " ✗")


def _tick_cell(cell: dict[str, Any]) -> str:
    k = cell.get("noise_ridge") or 0
    return f"{cell['tick']}" + (f", κ={k:g}" if k else "")


def render_markdown(doc: dict[str, Any]) -> str:
    eps, st, rows = doc["epsilons"], doc["settings"], doc["rows"]
    head = "| row | tick | " + " | ".join(f"ε={e:g}" for e in eps) + " |"
    sep = "|---|---|" + "---|" * len(eps)
    tuned = (f"Release ticks of the `+tick` rows were tuned on seeds {doc['tuning']['seeds']} (never reported) "
             f"over {doc['tuning']['candidates']} interactions at ε ∈ {doc['tuning']['epsilons']}."
             if doc["tuning"]["enabled"] else "Release ticks of the `+tick` rows were fixed (no tuning).")
    lines = [
        "# Continual-release mechanisms side by side",
        "",
        f"Synthetic setting of the collaborative paper: d = {st['d']}, N = {st['n_users']}, {st['n_arms']} arms, "
        f"{st['n_shown']} shown, λ = {st['lambda_']}, α = {st['alpha']}, reward noise {st['reward_std']}, "
        f"W quantile {st['w_quantile']}; T = {st['horizon']:,} interactions; {st['runs']} runs (seeds "
        f"{st['seeds']}); δ = {st['delta']:g} for Gaussian mechanisms. {tuned}",
        "",
        f"Random play: {doc['random']['regret']:.0f} ± {doc['random']['std']:.0f}; non-private: "
        + ", ".join(f"{v['name']} {v['regret']:.0f} ± {v['std']:.0f}" for v in doc["nonprivate"].values())
        + f". Wall time {doc['timings']['total_seconds']:.0f} s (tuning {doc['timings']['tuning_seconds']:.0f} s).",
        "",
        f"**Default: `{doc['default']}`** (mechanism `{doc['default_mechanism']['name']}`, tick "
        + ", ".join(f"{a} {t}" for a, t in doc["default_mechanism"]["tick"].items())
        + f"). Target ({doc['target']['criterion']}): "
        + ("**met**" if doc["target"]["met"] else "**not met**") + " — ratios "
        + "; ".join(f"{a}: " + ", ".join(f"ε={e} {v:.2f}" for e, v in r.items())
                    for a, r in doc["target"]["ratio"].items()) + ".",
        "",
    ]
    for alg in ALGORITHMS:
        npr = doc["nonprivate"][alg]["regret"]
        lines += [f"## {alg} (non-private twin {doc['nonprivate'][alg]['name']}: {npr:.0f})", "",
                  "Cumulative regret (mean ± std over runs):", "", head, sep]
        for name, by_alg in rows.items():
            if alg in by_alg:
                c = by_alg[alg]
                lines.append(f"| `{name}` | {_tick_cell(c)} | "
                             + " | ".join(f"{m:.0f} ± {s:.0f}" for m, s in zip(c["regret"], c["std"])) + " |")
        for key, title, fmt in (("added_regret", "Added regret (private − non-private)", "{:.0f}"),
                                ("share_of_gain", "Share of the learning gain privacy costs", "{:.2f}"),
                                ("ratio_to_paper", "Added regret / the paper mechanism's", "{:.2f}")):
            lines += ["", f"{title}:", "", head, sep]
            for name, by_alg in rows.items():
                if alg in by_alg:
                    c = by_alg[alg]
                    lines.append(f"| `{name}` | {_tick_cell(c)} | " + " | ".join(fmt.format(v) for v in c[key]) + " |")
        lines.append("")
    lines += ["## Guarantees", "",
              "What each row's mechanism really gives at each target ε — (ε, δ) from its privacy event with the "
              "tightest accountant (exact Gaussian DP for Gaussian events); ✗ = not a valid DP proof.", "",
              "| row | unit | " + " | ".join(f"ε={e:g}" for e in eps) + " |", "|---|---|" + "---|" * len(eps)]
    for name, by_alg in doc["guarantees"].items():
        cells = by_alg.get("DP-CoLin", by_alg.get("DP-LinUCB"))
        assert cells is not None
        lines.append(f"| `{name}` | {doc['row_about'][name]['privacy_unit']} | "
                     + " | ".join(_g(c) for c in cells) + " |")
    lines += ["", "## Rows", ""]
    for name, about in doc["row_about"].items():
        lines.append(f"- `{name}`: {about['about']}.")
    if doc["tuning"]["enabled"]:
        lines += ["", "## Tick tuning (held-out seeds)", "",
                  "Mean regret over the tuning ε and runs, and in brackets the score (mean regret relative to the "
                  "best tick of each (ε, run); lowest wins).", "",
                  "| row | algorithm | " + " | ".join(f"tick {t}" for t in doc["tuning"]["candidates"])
                  + " | chosen |", "|---|---|" + "---|" * (len(doc["tuning"]["candidates"]) + 1)]
        for name, by_alg in doc["tuning"]["mean_regret"].items():
            for alg, means in by_alg.items():
                sc = doc["tuning"]["score"][name][alg]
                lines.append(f"| `{name}` | {alg} | " + " | ".join(f"{means[str(t)]:.0f} ({sc[str(t)]:.3f})"
                                                                    for t in doc["tuning"]["candidates"])
                             + f" | {doc['tuning']['chosen'][name][alg]} |")
    lines += ["", "## Notes", "", NOTES, ""]
    return "\n".join(lines) + "\n"


NOTES = """\
- `paper` and `honaker-paper` calibrate Laplace noise to the L2 sensitivity: that is not an ε-DP guarantee (ERRATA §1);
  they are the reference for reproduction only. Every Gaussian row is valid (ε, δ)-DP with exact accounting.
- `user-*` rows privatise each user's own statistic b_u (sensitivity ||x|| ≤ 1) and publish (V ⊗ I)(b + ξ): for
  DP-LinUCB (V = I) they coincide with the base mechanism; for DP-CoLin the noise is shaped like the signal.
- Shariff & Sheffet protect the context as well as the reward, and give joint DP (the action shown to user t uses t's
  context in the clear). Their regularizer (the noise shift, ≈ 2Υ) replaces λ; their width is Proposition 4's.
- DGS's (ε, δ) is the paper's claim, not a proof (spec tree-dp B.5-1): a reward changes every later tree leaf.
  λ₀ = λ_min of the public arm pool's second moment, so the sensitivity stays at its maximum L/λ over this horizon.
- A release tick B means the served model is refreshed every B interactions (B/N per user, round-robin)."""


def plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    eps = doc["epsilons"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=False)
    for ax, alg in zip(axes, ALGORITHMS):
        for name, by_alg in doc["rows"].items():
            if alg not in by_alg:
                continue
            c = by_alg[alg]
            style = {"linewidth": 3, "color": "black"} if name == REFERENCE_ROW else (
                {"linewidth": 3, "color": "tab:red"} if name == doc["default"] else {"linewidth": 1})
            ls = "--" if name.startswith(("SS-", "DGS-")) else "-"
            ax.plot(eps, c["added_regret"], ls, marker="o", markersize=3, label=f"{name} (tick {c['tick']})",
                    **style)
        ax.axhline(doc["random"]["regret"] - doc["nonprivate"][alg]["regret"], color="grey", linestyle=":",
                   label="random play")
        epsilon_axis(ax, eps)
        ax.set_ylabel(f"added regret at T = {doc['settings']['horizon']:,}")
        ax.set_title(f"{alg}: private − non-private regret")
        ax.legend(fontsize=6, ncol=2)
    save(fig, path)
