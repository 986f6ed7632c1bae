"""``privrec experiment modes``: the trust modes side by side — regret against ε, LastFM reward, communication.

Every row is a *mode*: who perturbs the statistics and how the noisy parts are aggregated, with
the same bandit (LinUCB over the model units), the same mechanism and the same seeds:

* ``global`` — the trusted server releases ``b`` through the default mechanism (``user-blt-exact``
  with the noise-scaled ridge), as ``privrec up`` does;
* ``federated-star`` — ``M`` sites (units ``u mod M``), each releasing its own units' statistics
  with its own mechanism and seed; a coordinator sums them (:class:`models.streaming.federated.FederatedUCB`);
* ``federated-ring`` — the same sites on a ring, mixing by running consensus with ``P = I - (κ/d_max) L``;
  each site serves its own users from its own view.

Two measurements per row and ε ∈ {0.5, 1, 2, 5, 10}: cumulative pseudo-regret on the collaborative
paper's synthetic environment (mean over seeded runs; the added regret is against the non-private
twin of the same runs), and the reward ratio to random play on the first LastFM replay events
(offline: the replay's protocol — the pool's top item, reward 1 iff it is the logged artist — with
the same ``models`` code as the pipeline, one release every ``lastfm_tick`` events). Federated rows
also report the communication: bytes per site per release tick.

Rows come from :data:`ROWS`, a registry: a mode adds a :class:`Row` with a factory of its policy.

Writes ``modes.json`` (``{"epsilons": [...], "modes": {mode: {"regret": [...], "lastfm_ratio": [...],
...}}, ...}``), ``modes.md`` and ``modes.png``.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.ground.environment import SyntheticEnvironment
from models.local import LocalConfig, LocalUCB
from models.policies import make_policy
from models.streaming.federated import FederatedUCB, assign_sites

from .plots import epsilon_axis, pyplot, save
from .runner import derive_seed, machine_info, summarize

__all__ = ["ModesConfig", "Row", "ROWS", "run_modes", "register_row", "lastfm_reward"]

EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0)
MECHANISM = "user-blt-exact"


@dataclass(frozen=True)
class ModesConfig:
    """Settings of one run of the experiment (``--quick`` shrinks horizons and runs)."""

    epsilons: tuple[float, ...] = EPSILONS
    runs: int = 5
    horizon: int = 50_000
    tick: int = 2_000
    d: int = 25
    n_users: int = 10
    lambda_: float = 0.1
    alpha: float = 0.3
    noise_ridge: float = 30.0           # the mechanisms experiment's tuned kappa for LinUCB (synthetic)
    sites: int = 4
    lastfm_events: int = 5_000
    lastfm_runs: int = 3
    lastfm_tick: int = 100              # the live replay's ~100 events per one-second release tick
    lastfm_lambda: float = 1.0          # the pipeline's defaults
    lastfm_noise_ridge: float = 100.0
    tree_levels: int = 14               # the pipeline's tree: 2**14 - 1 release ticks per epoch
    kappa: float = 0.5
    shuffle_batch: int = 200            # local-shuffle: distinct users per batch of a unit (LastFM clusters)
    scaling_users: tuple[int, ...] = (10, 40, 160)  # local vs global added regret as N grows (epsilon = 2)
    delta: float = 1e-5
    seed: int = 0
    rows: tuple[str, ...] = ()
    data_dir: str | None = None
    lastfm: bool = True

    @classmethod
    def quick(cls, **kw: Any) -> ModesConfig:
        return cls(**{"runs": 2, "horizon": 10_000, "tick": 500, "lastfm_events": 2_000, "lastfm_runs": 1, **kw})


@dataclass(frozen=True)
class Row:
    """A mode: ``make(env_like, epsilon, seed, cfg, lastfm)`` builds its policy (``select``/``update``)."""

    name: str
    about: str
    make: Callable[..., Any]
    federated: bool = False


def _global(V: np.ndarray, d: int, epsilon: float, seed: int, cfg: ModesConfig, *, tick: int, lam: float,
            kappa: float, horizon: int) -> Any:
    W = np.eye(V.shape[0])  # LinUCB over the units: V = I
    name = "LinUCB" if math.isinf(epsilon) else "DP-LinUCB"
    return make_policy(name, d=d, W=W, epsilon=epsilon, delta=cfg.delta, mechanism=MECHANISM, horizon=horizon,
                       tick=tick, seed=seed, lambda_=lam, alpha=cfg.alpha, noise_ridge=kappa)


def _federated(topology: str) -> Callable[..., Any]:
    def make(V: np.ndarray, d: int, epsilon: float, seed: int, cfg: ModesConfig, *, tick: int, lam: float,
             kappa: float, horizon: int) -> Any:
        n = V.shape[0]
        return FederatedUCB(d=d, V=np.eye(n), site_of=assign_sites(n, cfg.sites), topology=topology,
                            lambda_=lam, alpha=cfg.alpha, noise_ridge=kappa, mechanism=MECHANISM, epsilon=epsilon,
                            delta=cfg.delta, horizon=horizon, tick=tick, kappa=cfg.kappa, seed=seed)
    return make


def _local(algorithm: str) -> Callable[..., Any]:
    """Local mode: a device per user (models.local.LocalClient) and the server's sums; epsilon = inf falls back
    to the non-private twin (a device never sends its exact statistic)."""
    def make(V: np.ndarray, d: int, epsilon: float, seed: int, cfg: ModesConfig, *, tick: int, lam: float,
             kappa: float, horizon: int) -> Any:
        if math.isinf(epsilon):
            return _global(V, d, epsilon, seed, cfg, tick=tick, lam=lam, kappa=kappa, horizon=horizon)
        shuffle = cfg.shuffle_batch if algorithm == "shuffle" else 0
        config = LocalConfig(algorithm="round" if algorithm == "shuffle" else algorithm, d=d, epsilon=epsilon,
                             delta=cfg.delta, shuffle_batch=shuffle)
        return LocalUCB(d=d, n_units=V.shape[0], config=config, tick=tick, seed=seed, lambda_=lam, alpha=cfg.alpha,
                        noise_ridge=kappa)
    return make


#: The modes, in report order.
ROWS: list[Row] = [
    Row("global", "trusted server, default mechanism (user-blt-exact + noise ridge)", _global),
    Row("federated-star", "M sites with their own mechanisms; a coordinator sums their releases",
        _federated("star"), federated=True),
    Row("federated-ring", "M sites on a ring, running consensus with P = I - (kappa/d_max) L",
        _federated("ring"), federated=True),
    Row("local-tree", "each device releases its own b_u through blt-exact (LDP-CoLin's per-user continual release)",
        _local("tree")),
    Row("local-round", "one Gaussian report r x + N(0, sigma^2 I) per interaction ((eps, delta)-LDP each)",
        _local("round")),
    Row("local-shuffle", "pure eps0-LDP Laplace reports, shuffled in batches of distinct users of a unit; "
                         "epsilon is the central guarantee of a batch (Feldman, McMillan & Talwar)",
        _local("shuffle")),
]

#: Rows that cannot run on the synthetic world: there each user is their own unit, so a unit's batch can never
#: hold several distinct users (nothing to hide among).
NEEDS_POOLED_UNITS = {"local-shuffle"}


def register_row(row: Row) -> None:
    """Add (or replace) a mode's row."""
    for i, r in enumerate(ROWS):
        if r.name == row.name:
            ROWS[i] = row
            return
    ROWS.append(row)


# ------------------------------------------------------------------------------ jobs


@dataclass(frozen=True)
class _Job:
    row: str
    epsilon: float
    run: int
    dataset: str  # "synthetic" | "lastfm"


@dataclass
class _Result:
    job: _Job
    value: float  # regret (synthetic) or reward (lastfm)
    bytes_per_site_per_tick: float | None
    seconds: float
    local: dict[str, float] | None = None  # local rows: what reached the server's sums (see _local_stats)


_CTX: dict[str, Any] = {}


def _policy(row: Row, epsilon: float, seed: int, cfg: ModesConfig, dataset: str, n_units: int, d: int) -> Any:
    V = np.eye(n_units)
    if dataset == "synthetic":
        return row.make(V, d, epsilon, seed, cfg, tick=cfg.tick, lam=cfg.lambda_, kappa=cfg.noise_ridge,
                        horizon=cfg.horizon)
    return row.make(V, d, epsilon, seed, cfg, tick=cfg.lastfm_tick, lam=cfg.lastfm_lambda,
                    kappa=cfg.lastfm_noise_ridge, horizon=((1 << cfg.tree_levels) - 1) * cfg.lastfm_tick)


def _execute(job: _Job) -> _Result:
    cfg: ModesConfig = _CTX["cfg"]
    row = next(r for r in ROWS if r.name == job.row)
    t0 = time.perf_counter()
    seed = derive_seed("modes-noise", job.dataset, job.run, job.row, job.epsilon)
    if job.dataset.startswith("scaling"):  # the synthetic world with N users (local vs global as N grows)
        n_users = int(job.dataset[len("scaling"):])
        env = SyntheticEnvironment(d=cfg.d, n_users=n_users, horizon=cfg.horizon, seed=cfg.seed + job.run)
        policy = _policy(row, job.epsilon, seed, cfg, "synthetic", env.n_users, env.d)
        from .runner import simulate

        value, _ = simulate(env, policy, checkpoints=1)
    elif job.dataset == "synthetic":
        env = SyntheticEnvironment(d=cfg.d, n_users=cfg.n_users, horizon=cfg.horizon, seed=cfg.seed + job.run)
        policy = _policy(row, job.epsilon, seed, cfg, "synthetic", env.n_users, env.d)
        from .runner import simulate

        value, _ = simulate(env, policy, checkpoints=1)
    else:
        lf = _CTX["lastfm"]
        policy = _policy(row, job.epsilon, seed, cfg, "lastfm", lf["n_units"], lf["d"])
        value = lastfm_reward(policy, lf["units"], lf["pools"], lf["features"], lf["correct"], lf["users"])
    per_tick = None
    if isinstance(policy, FederatedUCB) and policy.ticks:
        per_tick = float(policy.bytes_sent.mean() / policy.ticks)
    return _Result(job, float(value), per_tick, time.perf_counter() - t0, _local_stats(policy))


def _local_stats(policy: Any) -> dict[str, float] | None:
    """A local row's cost beyond the noise: the share of reports in the server's sums when the run ended (with
    shuffling only completed batches count; the rest wait in open batches), the batches completed, the public
    noise std of the sums at the end, and the devices (users) that reported."""
    if not isinstance(policy, LocalUCB) or not policy.reports:
        return None
    batches = sum(policy.shuffler.seq.values()) if policy.shuffler is not None else 0
    return {"applied_fraction": float(policy.aggregate.count.sum()) / policy.reports, "batches": float(batches),
            "noise_std": policy.aggregate.noise_std(), "devices": float(len(policy._clients))}


def untrained_lastfm_reward(lf: dict[str, Any], seed: int, cfg: ModesConfig) -> float:
    """LastFM reward of the same LinUCB per unit whose server never refreshes (no statistics ever arrive): every
    pick is the UCB of the empty model. A row at or below this learned nothing usable in the replay."""
    never = LocalUCB(d=lf["d"], n_units=lf["n_units"], config=LocalConfig(algorithm="round", d=lf["d"], epsilon=1.0,
                                                                          delta=cfg.delta),
                     tick=1 << 62, seed=seed, lambda_=cfg.lastfm_lambda, alpha=cfg.alpha,
                     noise_ridge=cfg.lastfm_noise_ridge)
    return lastfm_reward(never, lf["units"], lf["pools"], lf["features"], lf["correct"], lf["users"])


def lastfm_reward(policy: Any, units: np.ndarray, pools: np.ndarray, features: np.ndarray,
                  correct: np.ndarray, users: np.ndarray | None = None) -> float:
    """Offline replay: recommend each pool's top item to the event's unit; reward 1 iff it is the logged one.

    ``pools`` are row indices into ``features``; ``correct[i]`` is the position of the logged item in pool ``i``.
    A policy with ``per_user`` (the local mode's devices) also learns who the user is.
    """
    reward = 0.0
    per_user = users is not None and getattr(policy, "per_user", False)
    by_user = users is not None and getattr(policy, "select_by_user", False)
    for i in range(len(units)):
        X = features[pools[i]]
        k = policy.select(int(units[i]), X, user=str(users[i])) if by_user else policy.select(int(units[i]), X)  # type: ignore[index]
        r = 1.0 if k == int(correct[i]) else 0.0
        if per_user:
            policy.update(int(units[i]), X[k], r, user=str(users[i]))  # type: ignore[index]
        else:
            policy.update(int(units[i]), X[k], r)
        reward += r
    return reward


def _lastfm_arrays(n: int, data_dir: str | None) -> dict[str, Any]:
    from producers.lastfm import load_catalog

    cat = load_catalog(data_dir, progress=False)
    ev = cat.event_arrays()
    n = min(n, len(ev.users))
    units = np.array([cat.cluster_of(str(u)) for u in ev.users[:n]], dtype=np.int64)
    pools = np.array([[cat.artist_index[str(a)] for a in row] for row in ev.pools[:n]], dtype=np.int64)
    correct = np.array([int(np.flatnonzero(ev.pools[i] == ev.arms[i])[0]) for i in range(n)], dtype=np.int64)
    return {"units": units, "users": np.array([str(u) for u in ev.users[:n]]), "pools": pools,
            "features": np.asarray(cat.feature_matrix), "correct": correct,
            "n_units": cat.n_clusters, "d": cat.d, "events": n, "pool_size": int(ev.pools.shape[1])}


def run_modes(cfg: ModesConfig, out: Path, *, jobs: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every (row, ε, run) on both datasets; write modes.json / .md / .png; return the document."""
    from tqdm import tqdm

    t_start = time.perf_counter()
    rows = [r for r in ROWS if not cfg.rows or r.name in cfg.rows]
    unknown = set(cfg.rows) - {r.name for r in ROWS}
    if unknown:
        raise ValueError(f"`rows` names unknown mode(s) {sorted(unknown)}; known: {[r.name for r in ROWS]}")
    _CTX.clear()  # nothing from an earlier call in this process (its LastFM arrays) may leak into this one
    _CTX["cfg"] = cfg
    if cfg.lastfm:
        _CTX["lastfm"] = _lastfm_arrays(cfg.lastfm_events, cfg.data_dir)
    eps_all = [math.inf, *cfg.epsilons]
    work: list[_Job] = []
    for r in rows:
        for e in eps_all:
            if r.name not in NEEDS_POOLED_UNITS:
                work += [_Job(r.name, e, k, "synthetic") for k in range(cfg.runs)]
            if cfg.lastfm:
                work += [_Job(r.name, e, k, "lastfm") for k in range(cfg.lastfm_runs)]
    if cfg.scaling_users and {"global", "local-tree"} <= {r.name for r in rows}:
        for n_users in cfg.scaling_users:
            for row_name, e in (("global", math.inf), ("global", 2.0), ("local-tree", 2.0)):
                work += [_Job(row_name, e, k, f"scaling{n_users}") for k in range(cfg.runs)]
    n = max(1, jobs or os.cpu_count() or 1)
    bar = tqdm(total=len(work), desc="modes", unit="run", disable=not progress, dynamic_ncols=True)
    results: list[_Result] = []
    if n == 1:
        for j in work:
            results.append(_execute(j))
            bar.update()
    else:
        with mp.get_context("fork").Pool(n) as pool:
            for res in pool.imap_unordered(_execute, work, chunksize=1):
                results.append(res)
                bar.update()
    bar.close()
    if cfg.lastfm:
        lf = _CTX["lastfm"]
        _CTX["lastfm_untrained"] = [untrained_lastfm_reward(lf, derive_seed("modes-untrained", k), cfg)
                                    for k in range(cfg.lastfm_runs)]
    doc = _document(cfg, rows, results, time.perf_counter() - t_start)
    out.mkdir(parents=True, exist_ok=True)
    (out / "modes.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "modes.md").write_text(_markdown(doc))
    _plot(doc, out / "modes.png")
    return doc


def _document(cfg: ModesConfig, rows: Sequence[Row], results: list[_Result], seconds: float) -> dict[str, Any]:
    def values(row: str, eps: float, dataset: str) -> list[float]:
        return [r.value for r in results if r.job.row == row and r.job.epsilon == eps and r.job.dataset == dataset]

    lf = _CTX.get("lastfm")
    random_reward = lf["events"] / lf["pool_size"] if lf else math.nan
    modes: dict[str, Any] = {}
    for row in rows:
        entry: dict[str, Any] = {"about": row.about, "regret": [], "regret_sd": [], "added_regret": [],
                                 "lastfm_ratio": [], "lastfm_ratio_sd": []}
        base = summarize(values(row.name, math.inf, "synthetic"))[0]
        entry["nonprivate_regret"] = _num(base)
        for e in cfg.epsilons:
            m, sd = summarize(values(row.name, e, "synthetic"))
            entry["regret"].append(_num(m))
            entry["regret_sd"].append(_num(sd))
            entry["added_regret"].append(_num(m - base))
            if lf:
                rm, rsd = summarize([v / random_reward for v in values(row.name, e, "lastfm")])
                entry["lastfm_ratio"].append(rm)
                entry["lastfm_ratio_sd"].append(rsd)
        if lf:
            entry["lastfm_ratio_nonprivate"] = summarize([v / random_reward for v in values(row.name, math.inf,
                                                                                            "lastfm")])[0]
        local = [r for r in results if r.job.row == row.name and r.local is not None and r.job.dataset == "lastfm"]
        if local:  # per epsilon, mean over the LastFM runs
            for key in ("applied_fraction", "batches", "noise_std"):
                entry[f"lastfm_{key}"] = [_num(summarize([r.local[key] for r in local if r.job.epsilon == e
                                                          and r.local is not None])[0]) for e in cfg.epsilons]
        if row.federated:
            costs = [r.bytes_per_site_per_tick for r in results
                     if r.job.row == row.name and r.bytes_per_site_per_tick is not None and r.job.dataset == "synthetic"]
            costs_lf = [r.bytes_per_site_per_tick for r in results
                        if r.job.row == row.name and r.bytes_per_site_per_tick is not None and r.job.dataset == "lastfm"]
            entry["bytes_per_site_per_tick"] = float(np.mean(costs)) if costs else None
            entry["lastfm_bytes_per_site_per_tick"] = float(np.mean(costs_lf)) if costs_lf else None
        modes[row.name] = entry
    doc: dict[str, Any] = {
        "epsilons": list(cfg.epsilons),
        "modes": modes,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "seconds": round(seconds, 1),
        "machine": machine_info(),
    }
    if lf and _CTX.get("lastfm_untrained"):
        doc["lastfm_untrained_ratio"] = summarize([v / random_reward for v in _CTX["lastfm_untrained"]])[0]
    scaling = [r for r in results if r.job.dataset.startswith("scaling")]
    if scaling:
        sc: dict[str, Any] = {"n_users": list(cfg.scaling_users), "global_added": [], "local_added": [],
                              "ratio": [], "local_minus_global": [], "nonprivate_regret": [], "global_regret": [],
                              "local_regret": [], "epsilon": 2.0}
        for n_users in cfg.scaling_users:
            def mean(row: str, eps: float, n_users: int = n_users) -> float:
                return summarize([r.value for r in scaling if r.job.row == row and r.job.epsilon == eps
                                  and r.job.dataset == f"scaling{n_users}"])[0]
            base = mean("global", math.inf)
            g, loc = mean("global", 2.0) - base, mean("local-tree", 2.0) - base
            sc["global_added"].append(g)
            sc["local_added"].append(loc)
            sc["ratio"].append(loc / g if g > 0 else None)
            sc["local_minus_global"].append(mean("local-tree", 2.0) - mean("global", 2.0))
            sc["nonprivate_regret"].append(base)
            sc["global_regret"].append(mean("global", 2.0))
            sc["local_regret"].append(mean("local-tree", 2.0))
        doc_scaling = sc
    else:
        doc_scaling = None
    if "global" in modes and "federated-star" in modes and 2.0 in cfg.epsilons:
        i = list(cfg.epsilons).index(2.0)
        g = modes["global"]["added_regret"][i]
        st = modes["federated-star"]["added_regret"][i]
        doc["target"] = {"what": f"federated star (M = {cfg.sites}) at epsilon = 2 within 1.5x the global mode's "
                                 f"added regret", "star_added": st, "global_added": g,
                         "ratio": st / g if g > 0 else None, "met": bool(g > 0 and st <= 1.5 * g)}
    if doc_scaling is not None:
        doc["scaling"] = doc_scaling
    if "local-shuffle" in modes and 2.0 in cfg.epsilons and lf:
        i = list(cfg.epsilons).index(2.0)
        sh = modes["local-shuffle"]
        got = sh["lastfm_ratio"][i]
        untrained = doc.get("lastfm_untrained_ratio")
        doc["local_target"] = {"what": "local mode with shuffling: LastFM ratio at central epsilon = 2 at least the "
                                       "papers' global system at epsilon = 2 (0.79, docs/serving.md)",
                               "reached": got, "papers_global": 0.79,
                               "met": bool(isinstance(got, float) and not math.isnan(got) and got >= 0.79),
                               "untrained_ratio": untrained,
                               "applied_fraction": (sh.get("lastfm_applied_fraction") or [None] * (i + 1))[i],
                               "batches": (sh.get("lastfm_batches") or [None] * (i + 1))[i],
                               "shuffle_batch": cfg.shuffle_batch}
    return doc


def _num(x: float) -> float | None:
    """JSON has no NaN: a value that could not be measured is null."""
    return None if math.isnan(x) else x


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}"


def _markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    eps = doc["epsilons"]
    lines = ["# Trust modes side by side", "",
             f"Synthetic environment (d = {cfg['d']}, N = {cfg['n_users']} users, T = {cfg['horizon']:,}, release "
             f"every {cfg['tick']:,} interactions, lambda = {cfg['lambda_']}, kappa = {cfg['noise_ridge']}), "
             f"{cfg['runs']} seeded runs; LinUCB per unit with the `{MECHANISM}` mechanism, delta = {cfg['delta']}; "
             f"federated rows with M = {cfg['sites']} sites (units u mod M). Wall time {doc['seconds']:.0f} s.", "",
             "## Regret (mean over runs; added regret against the non-private twin in brackets)", "",
             "| mode | non-private | " + " | ".join(f"ε = {e:g}" for e in eps) + " | bytes/site/tick |",
             "|---|---|" + "---|" * len(eps) + "---|"]
    for name, m in doc["modes"].items():
        cells = [f"{_fmt(r)} ({_fmt(a)})" for r, a in zip(m["regret"], m["added_regret"])]
        lines.append(f"| {name} | {_fmt(m['nonprivate_regret'])} | " + " | ".join(cells)
                     + f" | {_fmt(m.get('bytes_per_site_per_tick'))} |")
    if any(m["lastfm_ratio"] for m in doc["modes"].values()):
        lines += ["", f"## LastFM: reward ratio to random play (first {cfg['lastfm_events']:,} events, "
                      f"{cfg['lastfm_runs']} noise seed(s), release every {cfg['lastfm_tick']} events, lambda = "
                      f"{cfg['lastfm_lambda']}, kappa = {cfg['lastfm_noise_ridge']})", "",
                  "| mode | non-private | " + " | ".join(f"ε = {e:g}" for e in eps) + " | bytes/site/tick |",
                  "|---|---|" + "---|" * len(eps) + "---|"]
        for name, m in doc["modes"].items():
            cells = [f"{_fmt(r, 2)}" + (f" ± {sd:.2f}" if sd else "") for r, sd in zip(m["lastfm_ratio"],
                                                                                       m["lastfm_ratio_sd"])]
            lines.append(f"| {name} | {_fmt(m.get('lastfm_ratio_nonprivate'), 2)} | " + " | ".join(cells)
                         + f" | {_fmt(m.get('lastfm_bytes_per_site_per_tick'))} |")
    t = doc.get("target")
    if t:
        lines += ["", f"Target — {t['what']}: star {_fmt(t['star_added'])} vs global {_fmt(t['global_added'])}, "
                      f"ratio {_fmt(t['ratio'], 2)}: **{'met' if t['met'] else 'missed'}**."]
    if doc.get("lastfm_untrained_ratio") is not None:
        lines += ["", f"A LinUCB per unit whose server never refreshes (no statistics ever arrive) reaches "
                      f"{_fmt(doc['lastfm_untrained_ratio'], 2)} on the same events: a cell near it learned "
                      f"nothing usable."]
    local_rows = {n: m for n, m in doc["modes"].items() if m.get("lastfm_applied_fraction")}
    if local_rows:
        lines += ["", "Local rows on LastFM: share of the reports in the server's sums at the end (shuffled reports "
                      "count only in completed batches of distinct users of one unit) / batches completed / public "
                      "noise std of the sums", "",
                  "| mode | " + " | ".join(f"ε = {e:g}" for e in eps) + " |", "|---|" + "---|" * len(eps)]
        for name, m in local_rows.items():
            cells = [f"{_fmt(a, 2)} / {_fmt(b)} / {_fmt(s, 1)}" for a, b, s in
                     zip(m["lastfm_applied_fraction"], m["lastfm_batches"], m["lastfm_noise_std"])]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lt = doc.get("local_target")
    if lt:
        lines += ["", f"Target — {lt['what']}: reached {_fmt(lt['reached'], 2)}: "
                      f"**{'met' if lt['met'] else 'missed'}**."]
        if lt.get("untrained_ratio") is not None:
            lines += [f"(Against the never-refreshed policy's {_fmt(lt['untrained_ratio'], 2)}: "
                      f"{_fmt(lt.get('applied_fraction'), 2)} of the reports reached the sums in "
                      f"{_fmt(lt.get('batches'))} batch(es) of {lt['shuffle_batch']}.)"]
    sc = doc.get("scaling")
    if sc:
        lines += ["", f"## Local against global as the users grow (synthetic, ε = {sc['epsilon']:g}, added regret "
                      f"against the non-private twin)", "",
                  "| N users | global | local-tree | local / global | local − global (regret) |", "|---|---|---|---|---|"]
        for n_users, g, loc, r, diff in zip(sc["n_users"], sc["global_added"], sc["local_added"], sc["ratio"],
                                            sc["local_minus_global"]):
            lines.append(f"| {n_users} | {_fmt(g)} | {_fmt(loc)} | {_fmt(r, 2)} | {_fmt(diff)} |")
        lines += ["", "Regret itself (non-private / global / local-tree): " + "; ".join(
            f"N = {n_users}: {_fmt(b)} / {_fmt(g)} / {_fmt(loc)}" for n_users, b, g, loc in
            zip(sc["n_users"], sc["nonprivate_regret"], sc["global_regret"], sc["local_regret"])) + ".",
                  "", "(The collaborative paper claims the local mode's added regret is about √N times the global "
                      "mode's. An added regret at or below zero means the noise-scaled ridge regularized better "
                      "than the non-private twin's lambda: the ratio is then undefined, and local − global is "
                      "the comparison left.)"]
    lines += ["", "`local-shuffle` has no synthetic row: there every user is a unit of their own, so no batch of "
                  "distinct users of one unit can form.", ""] if "local-shuffle" in doc["modes"] else []
    lines += ["", f"Machine yardstick: sum(range(1000)) = {doc['machine']['python_speed_us']} µs.", ""]
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    has_lf = any(m["lastfm_ratio"] for m in doc["modes"].values())
    sc = doc.get("scaling")
    panels = 1 + int(has_lf) + int(bool(sc))
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    if sc:
        ax = axes[0][panels - 1]
        ax.plot(sc["n_users"], sc["global_added"], marker="o", label="global")
        ax.plot(sc["n_users"], sc["local_added"], marker="o", label="local-tree")
        ax.set_xscale("log")
        ax.set_xlabel("users N")
        ax.set_ylabel(f"added regret at ε = {sc['epsilon']:g}")
        ax.set_title("local against global as N grows")
        ax.legend()
    ax = axes[0][0]
    for name, m in doc["modes"].items():
        if all(v is None for v in m["regret"]):
            continue  # no synthetic row (local-shuffle)
        ax.errorbar(doc["epsilons"], m["regret"], yerr=m["regret_sd"], marker="o", capsize=3, label=name)
    epsilon_axis(ax, doc["epsilons"])
    ax.set_ylabel("cumulative regret (synthetic)")
    ax.set_title("regret against ε")
    ax.legend()
    if has_lf:
        ax = axes[0][1]
        for name, m in doc["modes"].items():
            ax.errorbar(doc["epsilons"], m["lastfm_ratio"], yerr=m["lastfm_ratio_sd"], marker="o", capsize=3,
                        label=name)
        ax.axhline(1.0, color="k", ls="--", lw=1, label="random play")
        epsilon_axis(ax, doc["epsilons"])
        ax.set_ylabel("reward / random play (LastFM)")
        ax.set_title("LastFM replay, offline")
        ax.legend()
    save(fig, path)

