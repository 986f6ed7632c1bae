"""``privrec experiment modes``: the trust modes side by side — regret against ε, LastFM reward, communication.

Every row is a *mode*: who perturbs the statistics and how the noisy parts are aggregated, with
the same bandit (LinUCB over the model units), the same mechanism and the same seeds:

* ``global`` — the trusted server releases ``b`` through the default mechanism (``user-blt-exact``
  with the noise-scaled ridge), as ``privrec up`` does;
* ``federated-star`` — ``M`` sites (units ``u mod M``), each releasing its own units' statistics
  with its own mechanism and seed; a coordinator sums them (:class:`models.streaming.federated.FederatedUCB`);
* ``federated-ring`` — the same sites on a ring, mixing by running consensus with ``P = I - (κ/d_max) L``;
  each site serves its own users from its own view;
* ``federated-sites-event`` / ``federated-sites-user`` — a star of the same sites calibrated as ``privrec up
  --mode federated`` calibrates them (replace-one neighbours), at ``privacy_unit = event`` and at user level, the
  live default (:func:`federated_sites_twin`: each user's ticks clipped, ``user_cap`` ticks per epoch, the noise
  scaled by the participation factor).

Two measurements per row and ε ∈ {0.5, 1, 2, 5, 10}: cumulative pseudo-regret on the collaborative
paper's synthetic environment (mean over seeded runs; the added regret is against the non-private
twin of the same runs), and the reward ratio to random play on the first LastFM replay events
(offline: the replay's protocol — the pool's top item, reward 1 iff it is the logged artist — with
the same ``models`` code as the pipeline, one release every ``lastfm_tick`` events). Federated rows
also report the communication: bytes per site per release tick.

Rows come from :data:`ROWS`, a registry: a mode adds a :class:`Row` with a factory of its policy.

Writes ``modes.json`` (``{"epsilons": [...], "modes": {mode: {"regret": [...], "lastfm_ratio": [...],
...}}, ...}``), ``modes.md`` and ``modes.png``. A cell whose blanket of fake messages cannot be calibrated
(too few users per batch for its ε) is not run: its values are ``null``, the mode's ``"uncalibrated"`` /
``"lastfm_uncalibrated"`` (lists parallel to the epsilons) hold the reason, ``modes.md`` shows ``n/c``.
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
from models.local.config import VARIANTS
from models.local.policy import LocalItemUCB
from models.mechanisms.participation import B_CLIP, participation_factor, replace_sensitivity
from models.policies import PopularityUCB, UserLevelUCB, make_policy
from models.streaming.federated import FederatedUCB, assign_sites

from .plots import epsilon_axis, pyplot, save
from .population import uncalibrated
from .runner import derive_seed, machine_info, simulate, summarize

__all__ = ["ModesConfig", "Row", "ROWS", "run_modes", "register_row", "lastfm_reward", "federated_sites_twin"]

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
    shuffle_batch: int = 200            # local-shuffled-vectors: distinct users per batch of a unit (LastFM clusters)
    population_batch: int = VARIANTS["shuffled-items"].shuffle_batch    # local-shuffled-items: distinct users per batch
    population_cap: int = VARIANTS["shuffled-items"].cap or 2           # local-shuffled-items: reports per device and epoch
    population_codewords: int = VARIANTS["shuffled-items"].codewords    # local-shuffled-items: the public codebook's size
    local_unit: str = "user"            # local rows: the device's unit (user: cap, calibration to it, budget)
    user_cap: int = 8                   # local rows at user level: reports per epoch (the pipeline's default)
    user_budget: float = 10.0           # local rows at user level: a device's lifetime budget
    scaling_users: tuple[int, ...] = (10, 40, 160)  # local vs global added regret as N grows (epsilon = 2)
    population_sizes: tuple[int, ...] = ()   # the population axis (privrec.experiments.population); CLI: 1k, 10k, 100k
    population_items: int = 1_000
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


class _SiteUsers:
    """This runner's protocol (``select(unit, X)``, ``update(unit, x, r)``, no organic listens) around a
    :func:`federated_sites_twin`: each interaction names its user first (LastFM: the listener; the synthetic world:
    each user is their own unit)."""

    select_by_user = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def select(self, unit: int, contexts: np.ndarray, user: str | None = None) -> int:
        if isinstance(self.inner, UserLevelUCB):
            self.inner.begin_event(int(unit) if user is None else int(user))
        return int(self.inner.select(unit, contexts, np.zeros(len(contexts), dtype=np.int64)))

    def update(self, unit: int, context: np.ndarray, reward: float) -> None:
        self.inner.update(unit, context, reward, 0)

    @property
    def federated(self) -> FederatedUCB:
        """The sites and their releases (for the bytes they sent)."""
        pop = self.inner.inner if isinstance(self.inner, UserLevelUCB) else self.inner
        fed: FederatedUCB = pop.base
        return fed


def federated_sites_twin(unit: str, *, n_units: int, d: int, sites: int, epsilon: float, delta: float, lam: float,
                         alpha: float, kappa: float, tick: int, horizon: int, cap: int, seed: int,
                         features: np.ndarray | None = None, listen_weight: float = 0.0) -> Any:
    """The offline twin of ``privrec up --mode federated`` (a star of ``sites`` sites; units ``u mod M``), calibrated
    as the sites are: replace-one neighbours (``2 b_clip``,
    :func:`~models.mechanisms.participation.replace_sensitivity`), the flat model, no item term. ``unit = "user"`` (the default of the live sites): each site's fold sums and clips
    each user's interactions of a tick, counts at most ``cap`` ticks per user and epoch, and its noise is scaled by the
    mechanism's participation factor (:class:`~models.policies.UserLevelUCB` around :class:`FederatedUCB`); the
    lifetime budget is not modelled (a capped user spends the epoch's epsilon, below the default budget of 10, in one
    epoch). ``features`` and ``listen_weight`` (the live default: 1 with noise): organic listens (``observe``) enter
    ``b``. Returns a policy with the items interface (``select(unit, X, items)``, ``update(unit, x, r, item)``,
    ``observe(unit, item)``) of :func:`privrec.experiments.lastfm.replay_offline`."""
    def build(scale: float, tick_: int, horizon_: int) -> FederatedUCB:
        return FederatedUCB(d=d, V=np.eye(n_units), site_of=assign_sites(n_units, sites), topology="star",
                            lambda_=lam, alpha=alpha, noise_ridge=kappa, mechanism=MECHANISM, epsilon=epsilon,
                            delta=delta, horizon=horizon_, tick=tick_, seed=seed, sensitivity_scale=scale)

    replace = replace_sensitivity(B_CLIP, signed=True)
    n_items = 1 if features is None else len(features)
    if unit == "event":
        # (FederatedUCB has PopularityUCB's base interface: scores, update(..., gram=False), release)
        return PopularityUCB(build(replace, tick, horizon), n_items, weight=0.0,  # type: ignore[arg-type]
                             listen_weight=listen_weight, features=features, seed=seed)
    capacity = -(-horizon // tick)  # release ticks per epoch
    never = 1 << 62  # the sites release when the user-level fold says so
    fed = build(replace, never, capacity * never)
    mech = next((m for m in fed.mechanisms if m is not None), None)
    if mech is not None:
        fed = build(replace * participation_factor(mech, cap), never, capacity * never)
    inner = PopularityUCB(fed, n_items, weight=0.0, seed=seed)  # type: ignore[arg-type]  # (as above)
    inner.features = None if features is None else np.asarray(features, dtype=np.float64)
    return UserLevelUCB(inner, tick=tick, cap=cap, capacity=capacity, listen_weight=listen_weight)


def _federated_sites(unit: str) -> Callable[..., Any]:
    """A row of :func:`federated_sites_twin` at ``unit`` (this runner's protocol: no organic listens)."""
    def make(V: np.ndarray, d: int, epsilon: float, seed: int, cfg: ModesConfig, *, tick: int, lam: float,
             kappa: float, horizon: int) -> Any:
        return _SiteUsers(federated_sites_twin(unit, n_units=V.shape[0], d=d, sites=cfg.sites, epsilon=epsilon,
                                               delta=cfg.delta, lam=lam, alpha=cfg.alpha, kappa=kappa, tick=tick,
                                               horizon=horizon, cap=cfg.user_cap, seed=seed))
    return make


def _local(variant: str) -> Callable[..., Any]:
    """Local mode, variant ``variant`` of :data:`models.local.config.VARIANTS` (``tree``, ``round``,
    ``shuffled-vectors``): a device per user (models.local.LocalClient) and the server's sums; epsilon = inf falls
    back to the non-private twin (a device never sends its exact statistic)."""
    def make(V: np.ndarray, d: int, epsilon: float, seed: int, cfg: ModesConfig, *, tick: int, lam: float,
             kappa: float, horizon: int) -> Any:
        if math.isinf(epsilon):
            return _global(V, d, epsilon, seed, cfg, tick=tick, lam=lam, kappa=kappa, horizon=horizon)
        v, user = VARIANTS[variant], cfg.local_unit == "user"
        config = v.config(d=d, epsilon=epsilon, delta=cfg.delta, unit=cfg.local_unit, cap=cfg.user_cap,
                          shuffle_batch=cfg.shuffle_batch if v.shuffle_batch else 0,
                          user_budget=cfg.user_budget if user else math.inf)
        return LocalUCB(d=d, n_units=V.shape[0], config=config, tick=tick, seed=seed, lambda_=lam, alpha=cfg.alpha,
                        noise_ridge=kappa)
    return make


def _local_population(V: np.ndarray, d: int, epsilon: float, seed: int, cfg: ModesConfig, *, tick: int, lam: float,
                      kappa: float, horizon: int) -> Any:
    """Local mode with population-wide shuffled batches (models.local.policy.LocalItemUCB): listens as codewords of a
    public codebook of the catalog's features, through a blanket of fake messages, user level (cap reports per
    device); epsilon = inf: the non-private twin of the same model (exact listens, no batch, no cap)."""
    from models.local.items import codebook

    lf = _CTX["lastfm"]
    cw = _CTX.get("codebook")
    if cw is None:
        cw = _CTX["codebook"] = codebook(lf["features"], cfg.population_codewords, seed=0)
    return LocalItemUCB(d=d, n_items=len(lf["features"]), epsilon=2.0 if math.isinf(epsilon) else epsilon,
                        batch=cfg.population_batch, cap=cfg.population_cap, seed=seed, delta=cfg.delta, share=0.0,
                        lambda_=lam, alpha=cfg.alpha, noise_ridge=0.0, tick=tick, private=not math.isinf(epsilon),
                        codewords=cw)


#: The modes, in report order.
ROWS: list[Row] = [
    Row("global", "trusted server, default mechanism (user-blt-exact + noise ridge)", _global),
    Row("federated-star", "M sites with their own mechanisms; a coordinator sums their releases",
        _federated("star"), federated=True),
    Row("federated-ring", "M sites on a ring, running consensus with P = I - (kappa/d_max) L",
        _federated("ring"), federated=True),
    Row("federated-sites-event", "the live sites' calibration at privacy_unit = event: replace-one (2 b_clip), "
                                 "star", _federated_sites("event"), federated=True),
    Row("federated-sites-user", "the live sites' default, user level: per-user per-tick clip, user_cap ticks per "
                                "epoch, noise scaled by the participation factor, star", _federated_sites("user"),
        federated=True),
    # the local variants (models.local.config.VARIANTS), each row named local-<variant>
    Row("local-tree", VARIANTS["tree"].about, _local("tree")),
    Row("local-round", VARIANTS["round"].about, _local("round")),
    Row("local-shuffled-vectors", VARIANTS["shuffled-vectors"].about + " (Feldman, McMillan & Talwar)",
        _local("shuffled-vectors")),
    Row("local-shuffled-items", VARIANTS["shuffled-items"].about + " (the default; Balcer & Cheu's blanket)",
        _local_population),
]

#: Rows renamed to their variant's name draw the noise of their former name, so every figure published under it
#: stays reproducible bit for bit (a cell's noise seed derives from its row's name).
_SEED_NAMES = {"local-shuffled-vectors": "local-shuffle", "local-shuffled-items": "local-shuffle-pop"}

#: Rows that cannot run on the synthetic world: there each user is their own unit, so a unit's batch can never
#: hold several distinct users (nothing to hide among).
NEEDS_POOLED_UNITS = {"local-shuffled-vectors", "local-shuffled-items"}


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
    value: float  # regret (synthetic) or reward (lastfm); NaN when uncalibrated
    bytes_per_site_per_tick: float | None
    seconds: float
    local: dict[str, float] | None = None  # local rows: what reached the server's sums (see _local_stats)
    uncalibrated: str | None = None  # why the cell's noise could not be calibrated (then nothing was measured)


_CTX: dict[str, Any] = {}


def _policy(row: Row, epsilon: float, seed: int, cfg: ModesConfig, dataset: str, n_units: int, d: int) -> Any:
    V = np.eye(n_units)
    if dataset == "synthetic":
        return row.make(V, d, epsilon, seed, cfg, tick=cfg.tick, lam=cfg.lambda_, kappa=cfg.noise_ridge,
                        horizon=cfg.horizon)
    return row.make(V, d, epsilon, seed, cfg, tick=cfg.lastfm_tick, lam=cfg.lastfm_lambda,
                    kappa=cfg.lastfm_noise_ridge, horizon=((1 << cfg.tree_levels) - 1) * cfg.lastfm_tick)


def _execute(job: _Job) -> _Result:
    """One cell's run. A cell whose blanket cannot be calibrated (too few users per batch for its epsilon, delta and
    cap) comes back uncalibrated, with the calibration's reason and nothing measured, instead of ending the grid."""
    cfg: ModesConfig = _CTX["cfg"]
    row = next(r for r in ROWS if r.name == job.row)
    t0 = time.perf_counter()
    seed = derive_seed("modes-noise", job.dataset, job.run, _SEED_NAMES.get(job.row, job.row), job.epsilon)
    lf = _CTX.get("lastfm")
    if job.dataset == "lastfm":
        policy = _policy(row, job.epsilon, seed, cfg, "lastfm", lf["n_units"], lf["d"])
    else:  # the synthetic world; "scalingN": with N users (local vs global as N grows)
        n_users = int(job.dataset[len("scaling"):]) if job.dataset.startswith("scaling") else cfg.n_users
        env = SyntheticEnvironment(d=cfg.d, n_users=n_users, horizon=cfg.horizon, seed=cfg.seed + job.run)
        policy = _policy(row, job.epsilon, seed, cfg, "synthetic", env.n_users, env.d)
    why = uncalibrated(policy)  # calibrated now, not at the first full batch: whether or not the run fills one
    if why is not None:
        return _Result(job, math.nan, None, time.perf_counter() - t0, None, uncalibrated=why)
    if job.dataset == "lastfm":
        value = lastfm_reward(policy, lf["units"], lf["pools"], lf["features"], lf["correct"], lf["users"])
    else:
        value, _ = simulate(env, policy, checkpoints=1)
    per_tick = None
    fed = getattr(policy, "federated", policy)  # (a twin of the live sites wraps its FederatedUCB)
    if isinstance(fed, FederatedUCB) and fed.ticks:
        per_tick = float(fed.bytes_sent.mean() / fed.ticks)
    return _Result(job, float(value), per_tick, time.perf_counter() - t0, _local_stats(policy))


def _local_stats(policy: Any) -> dict[str, float] | None:
    """A local row's cost beyond the noise: the share of reports in the server's sums when the run ended (with
    shuffling only completed batches count; the rest wait in open batches), the batches completed, the public
    noise std of the sums at the end, and the devices (users) that reported."""
    if isinstance(policy, LocalItemUCB) and policy.reports:
        return {"applied_fraction": policy.item_reports / policy.events, "batches": float(policy.batches),
                "noise_std": math.sqrt(policy.b_var), "devices": float(len(policy._counts)),
                "reported_fraction": policy.reports / policy.events}
    if not isinstance(policy, LocalUCB) or not policy.reports:
        return None
    batches = sum(policy.shuffler.seq.values()) if policy.shuffler is not None else 0
    return {"applied_fraction": float(policy.state.count.sum()) / policy.reports, "batches": float(batches),
            "refused_fraction": policy.refused / (policy.reports + policy.refused),
            "noise_std": policy.state.noise_std(), "devices": float(len(policy._clients))}


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
    if users is not None and getattr(policy, "with_items", False):  # the pool's items and the listened one
        for i in range(len(units)):
            X = features[pools[i]]
            k = policy.select(int(units[i]), X, user=str(users[i]), items=pools[i])
            r = 1.0 if k == int(correct[i]) else 0.0
            a = int(pools[i][int(correct[i])])
            policy.update(int(units[i]), X[k], r, user=str(users[i]), item=a, x_item=features[a])
            reward += r
        return reward
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
    if cfg.population_sizes:
        _CTX["population"] = _population(cfg, n)
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


def _population_one(job: tuple[int, int]) -> dict[str, Any]:
    from .population import population_gain

    return population_gain(job[0], _population_config(_CTX["cfg"]), job[1])


def _population_config(cfg: ModesConfig) -> Any:
    from .population import PopulationConfig

    return PopulationConfig(sizes=cfg.population_sizes, epsilon=2.0, delta=cfg.delta, n_items=cfg.population_items,
                            seed=cfg.seed)


def _population(cfg: ModesConfig, jobs: int) -> dict[str, Any]:
    """The population axis: the share of the non-private gain local + shuffling keeps at central epsilon = 2 (user
    level), per population size (largest first, in parallel when ``jobs`` > 1)."""
    pc = _population_config(cfg)
    work = sorted(((n, r) for n in pc.sizes for r in range(pc.runs)), reverse=True)
    if jobs == 1 or len(work) == 1:
        rows = [_population_one(j) for j in work]
    else:
        with mp.get_context("fork").Pool(min(jobs, len(work))) as pool:
            rows = pool.map(_population_one, work, chunksize=1)
    gains: list[float | None] = []
    for size in pc.sizes:
        vals = [r["gain"] for r in rows if r["n_users"] == size and r["gain"] is not None]
        gains.append(float(np.mean(vals)) if vals else None)
    conf = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(pc).items()}
    return {"n_users": list(pc.sizes), "gain": gains, "epsilon": pc.epsilon, "mode": "local-shuffled-items",
            "what": "share of the non-private gain kept: (reward - random) / (non-private - random), same events",
            "runs": sorted(rows, key=lambda r: r["n_users"]), "config": conf,
            "target": {"what": "local + shuffling keeps >= 50 % of the non-private gain at 100,000 users",
                       "met": bool(100_000 in pc.sizes and (gains[list(pc.sizes).index(100_000)] or 0) >= 0.5)
                       if 100_000 in pc.sizes else None}}


def _document(cfg: ModesConfig, rows: Sequence[Row], results: list[_Result], seconds: float) -> dict[str, Any]:
    def values(row: str, eps: float, dataset: str) -> list[float]:
        return [r.value for r in results if r.job.row == row and r.job.epsilon == eps and r.job.dataset == dataset
                and r.uncalibrated is None]

    def why(row: str, eps: float, dataset: str) -> str | None:
        """The calibration's reason if a run of the cell could not be calibrated (then the cell has no value)."""
        return next((r.uncalibrated for r in results if r.job.row == row and r.job.epsilon == eps
                     and r.job.dataset == dataset and r.uncalibrated is not None), None)

    lf = _CTX.get("lastfm")
    random_reward = lf["events"] / lf["pool_size"] if lf else math.nan
    modes: dict[str, Any] = {}
    for row in rows:
        entry: dict[str, Any] = {"about": row.about, "regret": [], "regret_sd": [], "added_regret": [],
                                 "lastfm_ratio": [], "lastfm_ratio_sd": [], "uncalibrated": [],
                                 "lastfm_uncalibrated": []}
        base = summarize(values(row.name, math.inf, "synthetic"))[0]
        entry["nonprivate_regret"] = _num(base)
        for e in cfg.epsilons:
            nc = why(row.name, e, "synthetic")
            m, sd = summarize(values(row.name, e, "synthetic")) if nc is None else (math.nan, math.nan)
            entry["regret"].append(_num(m))
            entry["regret_sd"].append(_num(sd))
            entry["added_regret"].append(_num(m - base))
            entry["uncalibrated"].append(nc)
            if lf:
                nc = why(row.name, e, "lastfm")
                rm, rsd = summarize([v / random_reward for v in values(row.name, e, "lastfm")])
                entry["lastfm_ratio"].append(rm if nc is None else None)
                entry["lastfm_ratio_sd"].append(rsd if nc is None else None)
                entry["lastfm_uncalibrated"].append(nc)
        if lf:
            entry["lastfm_ratio_nonprivate"] = summarize([v / random_reward for v in values(row.name, math.inf,
                                                                                            "lastfm")])[0]
        local = [r for r in results if r.job.row == row.name and r.local is not None and r.job.dataset == "lastfm"]
        if local:  # per epsilon, mean over the LastFM runs
            for key in ("applied_fraction", "batches", "noise_std", "refused_fraction"):
                if all(key not in r.local for r in local if r.local is not None):
                    continue  # a figure this row's policy does not have (the population row refuses nothing itself)
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
    if _CTX.get("population"):
        doc["population"] = _CTX["population"]
    if "local-shuffled-vectors" in modes and 2.0 in cfg.epsilons and lf:
        i = list(cfg.epsilons).index(2.0)
        sh = modes["local-shuffled-vectors"]
        got = sh["lastfm_ratio"][i]
        untrained = doc.get("lastfm_untrained_ratio")
        doc["local_target"] = {"what": "local mode with shuffling: LastFM ratio at central epsilon = 2 at least the "
                                       "papers' global system at epsilon = 2 (0.79, docs/serving.md)",
                               "reached": got, "uncalibrated": sh["lastfm_uncalibrated"][i], "papers_global": 0.79,
                               "met": bool(isinstance(got, float) and not math.isnan(got) and got >= 0.79),
                               "untrained_ratio": untrained,
                               "applied_fraction": (sh.get("lastfm_applied_fraction") or [None] * (i + 1))[i],
                               "batches": (sh.get("lastfm_batches") or [None] * (i + 1))[i],
                               "shuffle_batch": cfg.shuffle_batch}
    if "local-shuffled-items" in modes and 2.0 in cfg.epsilons and lf:
        i = list(cfg.epsilons).index(2.0)
        pm = modes["local-shuffled-items"]
        got = pm["lastfm_ratio"][i]
        doc["local_pop_target"] = {
            "what": "local mode with population-wide shuffling at central epsilon = 2, user level: LastFM ratio >= 2.0",
            "reached": got, "uncalibrated": pm["lastfm_uncalibrated"][i],
            "met": bool(isinstance(got, float) and not math.isnan(got) and got >= 2.0),
            "nonprivate": pm.get("lastfm_ratio_nonprivate"),
            "applied_fraction": (pm.get("lastfm_applied_fraction") or [None] * (i + 1))[i],
            "batch": cfg.population_batch, "cap": cfg.population_cap}
    return doc


def _num(x: float) -> float | None:
    """JSON has no NaN: a value that could not be measured is null."""
    return None if math.isnan(x) else x


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}"


#: A cell that was not calibrated (its reason is listed under the table; modes.json's ``uncalibrated`` lists).
NC = "n/c"


def _uncalibrated_notes(doc: dict[str, Any]) -> list[str]:
    """One line per (mode, dataset, reason): the cells that could not be calibrated, and why."""
    notes: dict[tuple[str, str, str], list[str]] = {}
    for name, m in doc["modes"].items():
        for dataset, key in (("synthetic", "uncalibrated"), ("LastFM", "lastfm_uncalibrated")):
            for e, why in zip(doc["epsilons"], m.get(key) or []):
                if why is not None:
                    notes.setdefault((name, dataset, why), []).append(f"{e:g}")
    for r in (doc.get("population") or {}).get("runs", []):
        if r.get("uncalibrated"):
            notes.setdefault(("population axis", "synthetic", r["uncalibrated"]), []).append(
                f"{r['n_users']:,} users")
    if not notes:
        return []
    lines = ["", f"`{NC}`: not calibrated, nothing measured — the blanket of fake messages cannot reach the "
                 f"cell's guarantee with its batch:", ""]
    for (name, dataset, why), cells in notes.items():
        at = ", ".join(cells) if name == "population axis" else "ε = " + ", ".join(cells)
        lines.append(f"- {name}, {dataset}, {at}: {why}")
    return lines


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
        cells = [NC if nc else f"{_fmt(r)} ({_fmt(a)})" for r, a, nc in zip(m["regret"], m["added_regret"],
                                                                         m["uncalibrated"])]
        lines.append(f"| {name} | {_fmt(m['nonprivate_regret'])} | " + " | ".join(cells)
                     + f" | {_fmt(m.get('bytes_per_site_per_tick'))} |")
    if any(m["lastfm_ratio"] for m in doc["modes"].values()):
        lines += ["", f"## LastFM: reward ratio to random play (first {cfg['lastfm_events']:,} events, "
                      f"{cfg['lastfm_runs']} noise seed(s), release every {cfg['lastfm_tick']} events, lambda = "
                      f"{cfg['lastfm_lambda']}, kappa = {cfg['lastfm_noise_ridge']})", "",
                  "| mode | non-private | " + " | ".join(f"ε = {e:g}" for e in eps) + " | bytes/site/tick |",
                  "|---|---|" + "---|" * len(eps) + "---|"]
        for name, m in doc["modes"].items():
            cells = [NC if nc else f"{_fmt(r, 2)}" + (f" ± {sd:.2f}" if sd else "")
                     for r, sd, nc in zip(m["lastfm_ratio"], m["lastfm_ratio_sd"], m["lastfm_uncalibrated"])]
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
            cells = [NC if nc else f"{_fmt(a, 2)} / {_fmt(b)} / {_fmt(s, 1)}" for a, b, s, nc in
                     zip(m["lastfm_applied_fraction"], m["lastfm_batches"], m["lastfm_noise_std"],
                         m["lastfm_uncalibrated"])]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lt = doc.get("local_target")
    if lt:
        lines += ["", f"Target — {lt['what']}: reached {NC if lt['uncalibrated'] else _fmt(lt['reached'], 2)}: "
                      f"**{'met' if lt['met'] else 'missed'}**."]
        if lt.get("untrained_ratio") is not None:
            lines += [f"(Against the never-refreshed policy's {_fmt(lt['untrained_ratio'], 2)}: "
                      f"{_fmt(lt.get('applied_fraction'), 2)} of the reports reached the sums in "
                      f"{_fmt(lt.get('batches'))} batch(es) of {lt['shuffle_batch']}.)"]
    lp = doc.get("local_pop_target")
    if lp:
        lines += ["", f"Target — {lp['what']}: reached {NC if lp['uncalibrated'] else _fmt(lp['reached'], 2)} "
                      f"(non-private twin {_fmt(lp['nonprivate'], 2)}; {_fmt(lp['applied_fraction'], 2)} of the "
                      f"events reached the "
                      f"model in batches of {lp['batch']} distinct users, cap {lp['cap']}): "
                      f"**{'met' if lp['met'] else 'missed'}**."]
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
    lines += ["", "`local-shuffled-vectors` has no synthetic row: there every user is a unit of their own, so no batch of "
                  "distinct users of one unit can form.", ""] if "local-shuffled-vectors" in doc["modes"] else []
    pop = doc.get("population")
    if pop:
        lines += ["", f"## Population axis: share of the non-private gain kept at central ε = {pop['epsilon']:g}, user "
                      f"level (synthetic, local + shuffling, population-wide batches)", "",
                  "| users | events | random | non-private | local + shuffling | gain kept | batch | reports reached |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in pop["runs"]:
            nc = bool(r.get("uncalibrated"))
            lines.append(f"| {r['n_users']:,} | {r['events']:,} | {_fmt(r['random'])} | {_fmt(r['nonprivate'])} | "
                         f"{NC if nc else _fmt(r['local_shuffle'])} | {NC if nc else _fmt(r['gain'], 2)} | "
                         f"{r['batch']:,} | {NC if nc else _fmt(r['reached'], 2)} |")
    lines += _uncalibrated_notes(doc)
    lines += ["", f"Machine yardstick: sum(range(1000)) = {doc['machine']['python_speed_us']} µs.", ""]
    return "\n".join(lines)


def _nan(values: Sequence[float | None]) -> list[float]:
    """A curve's points with ``None`` (uncalibrated, or nothing measured) as NaN: matplotlib leaves them out."""
    return [math.nan if v is None else v for v in values]


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    has_lf = any(m["lastfm_ratio"] for m in doc["modes"].values())
    sc = doc.get("scaling")
    pop = doc.get("population")
    panels = 1 + int(has_lf) + int(bool(sc)) + int(bool(pop))
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    if pop:
        ax = axes[0][panels - 1 - int(bool(sc))]
        ax.plot(pop["n_users"], [g if g is not None else float("nan") for g in pop["gain"]], marker="o",
                label="local + shuffling")
        ax.axhline(0.5, color="k", ls="--", lw=1, label="target 50 %")
        ax.set_xscale("log")
        ax.set_xlabel("users")
        ax.set_ylabel(f"share of the non-private gain at ε = {pop['epsilon']:g}")
        ax.set_title("population axis (synthetic)")
        ax.legend()
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
            continue  # no synthetic row (local-shuffled-vectors), or no cell of it calibrated
        ax.errorbar(doc["epsilons"], _nan(m["regret"]), yerr=_nan(m["regret_sd"]), marker="o", capsize=3,
                    label=name)
    epsilon_axis(ax, doc["epsilons"])
    ax.set_ylabel("cumulative regret (synthetic)")
    ax.set_title("regret against ε")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    if has_lf:
        ax = axes[0][1]
        for name, m in doc["modes"].items():
            if all(v is None for v in m["lastfm_ratio"]):
                continue  # no cell of the row calibrated
            ax.errorbar(doc["epsilons"], _nan(m["lastfm_ratio"]), yerr=_nan(m["lastfm_ratio_sd"]), marker="o",
                        capsize=3, label=name)
        ax.axhline(1.0, color="k", ls="--", lw=1, label="random play")
        epsilon_axis(ax, doc["epsilons"])
        ax.set_ylabel("reward / random play (LastFM)")
        ax.set_title("LastFM replay, offline")
        ax.legend()
    save(fig, path)

