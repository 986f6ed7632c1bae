"""``privrec experiment frontier``: what privacy costs the default model, per ε, trust mode and population.

The default model is the hierarchical one (:class:`models.policies.hierarchy.HierarchicalUCB`, the offline twin of
``--model hierarchy``: public prior → pooled tilt → units → items, user level, its default shares, cap and tick).
Each cell is one (population, mode, ε) and runs it on the population's events with the replay's protocol (a pool
of 25 items, the logged one among them; recommend the top item; reward 1 iff it is the logged one; a miss is an
organic listen of the logged item):

* modes: ``global`` (one trusted server), ``federated`` (``sites`` sites, each its own noise, summed by a
  coordinator: ``HierarchicalUCB(sites=M)``) and ``local`` (:class:`models.local.policy.LocalItemUCB` with
  ``hierarchy=True``: population-wide shuffled batches of distinct users, the item histogram through a blanket of
  fake messages and the listens as Laplace vectors, served by the same
  :func:`~models.streaming.hierarchy.solve_hierarchy` over what its server released; ``cap`` reports per device);
* ε ∈ {0.5, 1, 2, 4, 8, ∞} at user level (δ = 1e-5); at ε = ∞ each mode's non-private twin (``global`` *is* the
  non-private reference);
* populations: the LastFM replay (a window of its events), any catalog directory with an ``events.csv``
  (``--catalog``, replayed as ``privrec replay events`` does), a synthetic tagged catalog generated into the output
  directory (``write_catalog(zipf=1.0)``, public seed) and the synthetic population
  (:class:`~privrec.experiments.population.SyntheticPopulation`) at several sizes.

Per cell: the reward's **ratio to random play** (mean ± standard error over seeds: noise keys and tie-breaking), and
the **share of the non-private gain kept**, ``(private − baseline) / (non-private − baseline)``, where non-private is
``HierarchicalUCB`` at ε = ∞ with all three levels released and baseline the best *data-free* scorer,
``max(random play, the public prior alone)`` (the prior ranks by ``x · u_0``,
:func:`~models.streaming.hierarchy.prior_direction`). Beside each private cell, on the same events: private
popularity at that ε (:class:`models.policies.popularity.PrivatePopularity`: user level, cap 1, the whole budget on
the item sums) and online popularity (:class:`models.policies.OnlinePopularity`, non-private). ``floor_met``: the
private ratio is at least ``max(best data-free, private popularity) − 2 SE`` (at ε = ∞, online popularity stands in
for private popularity; ``SE`` is the standard error of the difference, 0 with one seed). Private popularity is the
one under the row's trust model: a federated cell's is ``PrivatePopularity(sites=M)`` (each site its own noise;
``one_server_floor_met``: the test against one trusted server's), a local cell's is the local twin's own releases
ranked by its items block alone (:class:`models.local.policy.LocalPopularity`: the same devices, blanket and
batches, its releases the local cell's bit for bit; ``central_floor_met``: the test against one trusted server's)
where the catalog is the codebook — beyond ``MAX_CATALOG_CODEBOOK`` items the server estimates no item's count, the
baseline is reported not applicable and the local cell keeps the central floor. A local cell whose blanket cannot be
calibrated (too few distinct users per batch for its ε) is not run: it is reported ``n/c`` with the calibration's
reason (:func:`~privrec.experiments.population.uncalibrated`).

It only evaluates: nothing is tuned, every model runs with its defaults, and ``frontier.json`` records the windows
evaluated. Writes ``frontier.json``, ``frontier.md`` (one table) and ``frontier.png`` (the share of the gain kept
against ε, a panel per mode).

>>> round(share_of_gain(3.0, nonprivate=5.0, baseline=1.0), 3)
0.5
>>> share_of_gain(3.0, nonprivate=1.0, baseline=1.0) is None   # no gain to keep
True
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.local.policy import LocalItemUCB, LocalPopularity
from models.policies import OnlinePopularity, PrivatePopularity
from models.policies.hierarchy import HierarchicalUCB, PriorScorer
from models.streaming.hierarchy import default_shares

from .lastfm import LastFMEvents, load_events, replay_offline
from .plots import pyplot, save
from .population import SyntheticPopulation, uncalibrated
from .runner import derive_seed, machine_info

__all__ = ["FrontierConfig", "run_frontier", "share_of_gain", "standard_error", "catalog_events",
           "EPSILONS", "MODES"]

EPSILONS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
MODES: tuple[str, ...] = ("global", "federated", "local")
#: Without privacy every level is released (nothing to share a budget between).
ALL_LEVELS = {"pool": 1.0, "items": 1.0, "units": 1.0}


@dataclass(frozen=True)
class FrontierConfig:
    """Settings of the frontier (``--quick``: ε ∈ {1, 2, ∞}, LastFM 5,000 events, the 10k population, one seed)."""

    epsilons: tuple[float, ...] = EPSILONS
    modes: tuple[str, ...] = MODES
    seeds: int = 3
    delta: float = 1e-5
    tick: int = 100                 # interactions per release tick (HierarchicalUCB's default)
    sites: int = 4                  # federated mode's sites
    lastfm: bool = True
    lastfm_events: int = 20_000
    lastfm_start: int = 0
    data_dir: str | None = None
    catalog: str | None = None      # a catalog directory with events.csv (optional)
    catalog_events: int | None = None  # its first N positives (None: all)
    tagged: bool = True
    tagged_items: int = 2_000
    tagged_users: int = 2_000
    tagged_log: int = 20_000        # events written to the tagged catalog's events.csv
    tagged_events: int = 5_000      # the evaluation window: its first N positives
    tagged_seed: int = 0            # public seed of the generated catalog (the defaults were chosen on positives
                                    # 10,000-14,999 of seed 0: a different window)
    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    population_items: int = 1_000
    population_units: int = 100
    population_events_per_user: int = 3
    population_seed: int = 0        # public seed of the population draws (the defaults were chosen on seed 1)
    pool: int = 25                  # pool of a catalog's replay (LastFM's pools are its own, 25)
    local_cap: int = 2              # reports per device and epoch (local mode)
    local_batch: int = 150          # local mode's default batch (grown to the smallest the blanket can calibrate)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.epsilons or any(not e > 0 for e in self.epsilons):
            raise ValueError(f"`epsilons` must be positive numbers (inf: non-private), got {self.epsilons}.")
        unknown = set(self.modes) - set(MODES)
        if unknown or not self.modes:
            raise ValueError(f"`modes` must be among {list(MODES)}, got {list(self.modes)}.")
        for name in ("seeds", "tick", "sites", "lastfm_events", "tagged_items", "tagged_users", "tagged_log",
                     "tagged_events", "population_items", "population_units", "population_events_per_user",
                     "local_cap", "local_batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}.")
        if any(n < 2 for n in self.sizes):
            raise ValueError(f"`sizes` must be populations of at least 2 users, got {self.sizes}.")
        if self.catalog_events is not None and self.catalog_events < 1:
            raise ValueError(f"`catalog_events` must be positive, got {self.catalog_events}.")

    @classmethod
    def quick(cls, **kw: Any) -> FrontierConfig:
        base: dict[str, Any] = {"epsilons": (1.0, 2.0, math.inf), "lastfm_events": 5_000, "sizes": (10_000,),
                                "seeds": 1}
        return cls(**{**base, **kw})


# ------------------------------------------------------------------------------ small public pieces


def share_of_gain(private: float, *, nonprivate: float, baseline: float) -> float | None:
    """``(private − baseline) / (non-private − baseline)``; ``None`` when the non-private model gains nothing."""
    gain = nonprivate - baseline
    return None if not gain > 0 else (private - baseline) / gain


def standard_error(values: Sequence[float]) -> float | None:
    """The mean's standard error ``sd / sqrt(n)`` (``ddof = 1``); ``None`` for fewer than two values.

    >>> standard_error([1.0, 2.0, 3.0])
    0.5773502691896258
    >>> standard_error([2.0]) is None
    True
    """
    if len(values) < 2:
        return None
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


def catalog_events(root: str | os.PathLike[str], *, n: int | None = None, pool: int = 25, seed: int = 0,
                   use_cache: bool = True) -> tuple[LastFMEvents, dict[str, Any]]:
    """A catalog directory's ``events.csv`` as replay arrays: its positives in time order, each with a pool drawn by
    the public ``seed`` (:func:`producers.catalog.replay_pools.replay_plan`, as ``privrec replay events`` does), the
    first ``n`` of them (``None``: all); units from the catalog, else the public hash rule. Also what was read."""
    from pipeline.data.catalog_open import OpenCatalog
    from producers.catalog import build_catalog, read_events
    from producers.catalog.replay_pools import replay_plan

    path = Path(root)
    if not (path / "events.csv").is_file():
        raise ValueError(f"`catalog` must be a catalog directory with an events.csv, got {str(path)!r} (no "
                         f"{path / 'events.csv'}).")
    built = build_catalog(path, d=25, units=100, use_cache=use_cache)
    plan = replay_plan(read_events(path / "events.csv"), built.item_ids, pool=pool, seed=seed)
    events = plan.events if n is None else plan.events[:n]
    if not events:
        raise ValueError(f"{path / 'events.csv'}: no logged positive names an item of the catalog.")
    cat = OpenCatalog(built)
    rows = {a: i for i, a in enumerate(built.item_ids)}
    user_index: dict[str, int] = {}
    users = np.array([user_index.setdefault(e.user, len(user_index)) for e in events], dtype=np.int64)
    ev = LastFMEvents(np.array([cat.unit_of(e.user) for e in events], dtype=np.int64),
                      np.array([[rows[a] for a in e.pool] for e in events], dtype=np.int64),
                      np.array([e.slot for e in events], dtype=np.int64), np.asarray(built.features), built.W,
                      cat.n_units, users)
    info = {"catalog": str(path.resolve()), "positives": len(plan.events), "skipped_unknown_item":
            plan.skipped_unknown_item, "skipped_not_positive": plan.skipped_not_positive, "pool_seed": seed}
    return ev, info


def _load_lastfm(n: int, data_dir: str | None, start: int) -> LastFMEvents:
    """The LastFM replay's events ``start .. start + n`` (a seam: the tests put a stand-in here)."""
    return load_events(n, data_dir, start)


# ------------------------------------------------------------------------------ populations and jobs


@dataclass
class _Population:
    name: str
    label: str
    events: LastFMEvents
    local_batch: int
    window: dict[str, Any]
    about: str

    @property
    def n_users(self) -> int:
        assert self.events.users is not None
        return int(len(np.unique(self.events.users)))


@dataclass(frozen=True)
class _Job:
    population: str
    kind: str      # a mode, "nonprivate", "private-popularity[-federated|-local]", "online-popularity" or "prior"
    epsilon: float
    run: int


@dataclass
class _Result:
    job: _Job
    ratio: float | None
    seconds: float
    uncalibrated: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    not_applicable: str | None = None  # a baseline the population's catalog does not define (nothing was run)


_CTX: dict[str, Any] = {}


def _population_names(cfg: FrontierConfig) -> list[str]:
    """In run order: the replays, then the synthetic population from the smallest to the largest (1M last)."""
    names = (["lastfm"] if cfg.lastfm else []) + (["catalog"] if cfg.catalog else []) + \
        (["tagged"] if cfg.tagged else [])
    return names + [f"population-{n}" for n in sorted(cfg.sizes)]


def _jobs(cfg: FrontierConfig, population: str) -> list[_Job]:
    runs = range(cfg.seeds)
    out = [_Job(population, kind, math.inf, r) for r in runs
           for kind in ("nonprivate", "online-popularity", "prior")]
    for e in cfg.epsilons:
        for mode in cfg.modes:
            if mode == "global" and math.isinf(e):
                continue  # the global mode's non-private twin is the reference itself
            out += [_Job(population, mode, e, r) for r in runs]
        if not math.isinf(e):
            out += [_Job(population, "private-popularity", e, r) for r in runs]
            if "federated" in cfg.modes:  # the federated cells' floor: private popularity under their trust model
                out += [_Job(population, "private-popularity-federated", e, r) for r in runs]
            # the local cells' floor (the local default twin's items block alone) comes from the local job's own
            # run: the same twin, paired (_execute)
    return out


#: Relative cost per event, to start the longest jobs first.
_COST = {"local": 3.0, "nonprivate": 2.0, "federated": 1.0, "global": 1.0, "private-popularity": 0.5,
         "private-popularity-federated": 0.5, "online-popularity": 0.05,
         "prior": 0.05}


def _load(cfg: FrontierConfig, name: str, out: Path) -> _Population:
    if name == "lastfm":
        ev = _load_lastfm(cfg.lastfm_events, cfg.data_dir, cfg.lastfm_start)
        window = {"source": "LastFM replay (privrec replay lastfm's events, in order)",
                  "events": [cfg.lastfm_start, cfg.lastfm_start + ev.n - 1]}
        return _Population(name, "LastFM", ev, cfg.local_batch, window,
                           "the LastFM replay: the logged artist among 24 random tagged ones")
    if name == "catalog":
        assert cfg.catalog is not None
        ev, info = catalog_events(cfg.catalog, n=cfg.catalog_events, pool=cfg.pool)
        window = {"source": f"catalog {info['catalog']} (events.csv's positives in time order)",
                  "events": [0, ev.n - 1], **info}
        return _Population(name, f"catalog {Path(cfg.catalog).name}", ev, cfg.local_batch, window,
                           "a catalog directory's events.csv, replayed as privrec replay events does")
    if name == "tagged":
        from producers.catalog.generate import write_catalog

        root = out / "tagged-catalog"
        if root.exists():
            shutil.rmtree(root)  # always the catalog this configuration names
        write_catalog(root, n_items=cfg.tagged_items, n_users=cfg.tagged_users, n_events=cfg.tagged_log,
                      seed=cfg.tagged_seed, zipf=1.0)
        ev, info = catalog_events(root, n=cfg.tagged_events, pool=cfg.pool, use_cache=False)
        window = {"source": f"synthetic tagged catalog write_catalog(n_items={cfg.tagged_items}, "
                            f"n_users={cfg.tagged_users}, n_events={cfg.tagged_log}, seed={cfg.tagged_seed}, "
                            f"zipf=1.0) in {root}",
                  "events": [0, ev.n - 1], **info}
        return _Population(name, "tagged catalog", ev, cfg.local_batch, window,
                           "a generated tagged catalog with a Zipf(1) popularity")
    n_users = int(name.split("-", 1)[1])
    pop = SyntheticPopulation(n_users=n_users, n_units=cfg.population_units, n_items=cfg.population_items,
                              events_per_user=cfg.population_events_per_user, seed=cfg.population_seed)
    ev = LastFMEvents(pop.units.astype(np.int64), pop.pools, pop.correct.astype(np.int64), pop.features,
                      np.eye(pop.n_units), pop.n_units, pop.users.astype(np.int64))
    window = {"source": f"SyntheticPopulation(n_users={n_users}, n_units={cfg.population_units}, "
                        f"n_items={cfg.population_items}, events_per_user={cfg.population_events_per_user}, "
                        f"seed={cfg.population_seed})", "events": [0, pop.n - 1]}
    batch = cfg.local_batch
    return _Population(name, f"population {n_users:,}", ev, batch, window,
                       "the synthetic population: units of Zipf sizes, a taste per unit, Zipf item popularity")


def _policy(job: _Job, cfg: FrontierConfig, pop: _Population, seed: int) -> Any:
    ev = pop.events
    F = ev.features
    K, d = F.shape
    eps = job.epsilon
    if job.kind == "nonprivate":
        return HierarchicalUCB(F, n_units=ev.n_units, epsilon=math.inf, shares=ALL_LEVELS, tick=cfg.tick, seed=seed)
    if job.kind in ("global", "federated"):
        sites = cfg.sites if job.kind == "federated" else 1
        # the live rule (pipeline.release.stages.hierarchy_layout): the unit block where the users per unit allow
        users = len(np.unique(ev.users)) if ev.users is not None else 0
        shares = ALL_LEVELS if math.isinf(eps) else default_shares(users=users, units=ev.n_units)
        return HierarchicalUCB(F, n_units=ev.n_units, epsilon=eps, delta=cfg.delta, shares=shares, tick=cfg.tick,
                               seed=seed, sites=sites)
    if job.kind == "local":
        twin = local_default_twin(F, eps=eps, delta=cfg.delta, cap=cfg.local_cap, batch=cfg.local_batch, seed=seed,
                                  tick=cfg.tick)
        if not twin.private or local_popularity_undefined(K) is not None:
            return twin
        return LocalPopularity(twin, seed=seed)  # serves the twin's own picks too: the row and its floor, paired
    if job.kind in ("private-popularity", "private-popularity-federated"):
        sites = cfg.sites if job.kind == "private-popularity-federated" else 1
        return PrivatePopularity(K, epsilon=eps, delta=cfg.delta, cap=1, tick=cfg.tick, seed=seed, sites=sites)
    if job.kind == "online-popularity":
        return OnlinePopularity(K, seed=seed)
    if job.kind == "prior":
        return PriorScorer(F, seed=seed)
    raise ValueError(f"unknown kind {job.kind!r}")


def local_default_twin(F: np.ndarray, *, eps: float, delta: float, cap: int, batch: int, seed: int,
                       tick: int) -> LocalItemUCB:
    """The offline twin of ``privrec up --mode local`` with no flags (``Settings._resolve_local`` and ``privrec up``):
    per-round reports in population-wide shuffled batches of ``max(batch, smallest workable)`` distinct users, ``cap``
    reports per device, listens as codewords through the blanket at the whole epsilon — the catalog itself as the
    codebook (the item term) up to ``privrec.ops.up.MAX_CATALOG_CODEBOOK`` items, else 64 k-means codewords —, served
    by the hierarchy. ``eps = inf``: the same model without noise, no batch, no cap."""
    from models.local.items import codebook, smallest_batch
    from privrec.ops.up import catalog_is_codebook

    K, d = F.shape
    private = not math.isinf(eps)
    items = catalog_is_codebook(K)
    clipped = F / np.maximum(1.0, np.linalg.norm(F, axis=1, keepdims=True))
    codes = clipped if items else codebook(F, 64, seed=0)
    if private:
        try:
            batch = max(batch, smallest_batch(eps, delta, cap))  # share 0: the codes' blanket gets the whole delta
        except ValueError:
            pass  # no batch can: the cell reports it (population.uncalibrated)
    return LocalItemUCB(d=d, n_items=K, epsilon=2.0 if not private else eps, delta=delta, batch=batch, cap=cap,
                        seed=seed, share=0.0, tick=tick, private=private, hierarchy=True, features=F, codewords=codes,
                        codes_are_items=items)


def local_popularity_undefined(n_items: int) -> str | None:
    """Why private popularity under the local trust model is not defined for a catalog of ``n_items`` items, or
    ``None`` where it is (the catalog itself is the local codebook, so the server estimates every item's count)."""
    from privrec.ops.up import MAX_CATALOG_CODEBOOK, catalog_is_codebook

    if catalog_is_codebook(n_items):
        return None
    return (f"the catalog's {n_items:,} items exceed the local codebook's {MAX_CATALOG_CODEBOOK:,}: the codewords are "
            f"64 k-means clusters and the server estimates no item's count; the local cells keep the central floor")


def _local_reward(policy: LocalItemUCB | LocalPopularity, ev: LastFMEvents) -> tuple[float, float]:
    """The replay's protocol for the local twin: every event is one report of the user's device about the logged
    item (their listen); the recommended item's context is the public part. Returns the policy's reward and, for
    :class:`LocalPopularity`, its twin's (the served twin's picks, ``twin_pick``; else the same reward twice)."""
    assert ev.users is not None
    reward = twin_reward = 0.0
    F = ev.features
    for i in range(ev.n):
        items, j, unit, user = ev.pools[i], int(ev.correct[i]), int(ev.units[i]), str(int(ev.users[i]))
        X = F[items]
        k = policy.select(unit, X, user=user, items=items)
        r = 1.0 if k == j else 0.0
        a = int(items[j])
        policy.update(unit, X[k], r, user=user, item=a, x_item=F[a])
        reward += r
        twin_reward += (policy.twin_pick == j) if isinstance(policy, LocalPopularity) else r
    return reward, twin_reward


def _execute(job: _Job) -> list[_Result]:
    """One run of one cell. A local cell whose blanket cannot be calibrated comes back with the calibration's reason
    and nothing measured; any other error ends the experiment. A private local run also measures the cell's floor,
    private popularity under the local trust model, on the same twin (a second result, ``private-popularity-local``;
    ``not_applicable`` beyond the codebook)."""
    cfg: FrontierConfig = _CTX["cfg"]
    pop: _Population = _CTX["population"]
    t0 = time.perf_counter()
    seed = derive_seed("frontier", cfg.seed, job.population, job.run)
    floor_job = _Job(job.population, "private-popularity-local", job.epsilon, job.run)
    extra: list[_Result] = []
    if job.kind == "local" and not math.isinf(job.epsilon):
        na = local_popularity_undefined(int(pop.events.features.shape[0]))
        if na is not None:
            extra = [_Result(floor_job, None, 0.0, not_applicable=na)]
    policy = _policy(job, cfg, pop, seed)
    twin = policy.twin if isinstance(policy, LocalPopularity) else policy  # the local server's releases
    why = uncalibrated(twin)  # before the run, whether or not it would fill a batch
    if why is None and isinstance(twin, LocalItemUCB) and twin.private and pop.events.users is not None:
        users = len(np.unique(pop.events.users))
        if twin.batch > users:  # the batch that calibrates holds more distinct users than the window has
            why = (f"a batch that calibrates at epsilon {job.epsilon:g} holds {twin.batch} distinct users; the "
                   f"window has {users}: none could ever close")
    if why is not None:
        if isinstance(policy, LocalPopularity):  # the same twin behind the floor: not calibrated either
            extra = [_Result(floor_job, None, 0.0, uncalibrated=why)]
        return [_Result(job, None, time.perf_counter() - t0, uncalibrated=why), *extra]
    ev = pop.events
    random = ev.n / ev.pool_size
    if isinstance(policy, LocalItemUCB | LocalPopularity):
        assert isinstance(twin, LocalItemUCB)
        reward, twin_reward = _local_reward(policy, ev)
        info: dict[str, Any] = {"batches": twin.batches, "reached": twin.item_reports / ev.n,
                                "pool_noise_std": math.sqrt(twin.b_var), "item_noise_std": math.sqrt(twin.variance)}
        seconds = time.perf_counter() - t0
        if isinstance(policy, LocalPopularity):  # one run: the row (the twin's picks) and its floor (its own)
            return [_Result(job, twin_reward / random, seconds, info=info),
                    _Result(floor_job, reward / random, seconds, info=info)]
        return [_Result(job, reward / random, seconds, info=info), *extra]
    reward = replay_offline(policy, ev)
    info = {}
    if isinstance(policy, HierarchicalUCB | PrivatePopularity):
        info = {"ticks": policy.ticks, "dropped": policy.dropped}
    return [_Result(job, reward / random, time.perf_counter() - t0, info=info)]


# ------------------------------------------------------------------------------ the run


def run_frontier(cfg: FrontierConfig, out: Path, *, jobs: int | None = None, progress: bool = True
                 ) -> dict[str, Any]:
    """Run every cell, population by population (the largest last); write frontier.json / .md / .png."""
    from tqdm import tqdm

    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    names = _population_names(cfg)
    if not names:
        raise ValueError("no population to evaluate (LastFM, the tagged catalog and every size are off).")
    work = {name: _jobs(cfg, name) for name in names}
    bar = tqdm(total=sum(len(w) for w in work.values()), desc="frontier", unit="run", disable=not progress,
               dynamic_ncols=True)
    n_proc = max(1, jobs or os.cpu_count() or 1)
    populations: dict[str, dict[str, Any]] = {}
    results: list[_Result] = []
    seconds: dict[str, float] = {}
    try:
        for name in names:
            t0 = time.perf_counter()
            bar.set_postfix_str(name)
            _CTX.clear()
            _CTX["cfg"] = cfg
            pop = _CTX["population"] = _load(cfg, name, out)
            ev = pop.events
            todo = sorted(work[name], key=lambda j: -_COST[j.kind])
            if n_proc == 1:
                for job in todo:
                    results.extend(_execute(job))
                    bar.update()
            else:
                with mp.get_context("fork").Pool(min(n_proc, len(todo))) as pool:
                    for res in pool.imap_unordered(_execute, todo, chunksize=1):
                        results.extend(res)
                        bar.update()
            populations[name] = {"label": pop.label, "about": pop.about, "window": pop.window, "events": ev.n,
                                 "users": pop.n_users, "items": int(ev.features.shape[0]), "units": ev.n_units,
                                 "pool": ev.pool_size, "local_batch": pop.local_batch}
            seconds[name] = round(time.perf_counter() - t0, 1)
    finally:
        bar.close()
        _CTX.clear()
    doc = _document(cfg, populations, results, seconds, time.perf_counter() - t_start)
    (out / "frontier.json").write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    (out / "frontier.md").write_text(_markdown(doc))
    _plot(doc, out / "frontier.png")
    return doc


def _eps_key(e: float) -> str:
    return "inf" if math.isinf(e) else f"{e:g}"


def _stats(values: Sequence[float]) -> dict[str, Any]:
    return {"ratio": float(np.mean(values)) if len(values) else None, "se": standard_error(values),
            "runs": [float(v) for v in values]}


def _document(cfg: FrontierConfig, populations: dict[str, dict[str, Any]], results: list[_Result],
              seconds: dict[str, float], total: float) -> dict[str, Any]:
    def runs(pop: str, kind: str, eps: float = math.inf) -> list[_Result]:
        return sorted((r for r in results if r.job.population == pop and r.job.kind == kind
                       and (r.job.epsilon == eps or (math.isinf(eps) and math.isinf(r.job.epsilon)))),
                      key=lambda r: r.job.run)

    def values(rs: list[_Result]) -> list[float]:
        return [r.ratio for r in rs if r.ratio is not None]

    for name, p in populations.items():
        ref = _stats(values(runs(name, "nonprivate")))
        prior = _stats(values(runs(name, "prior")))
        online = _stats(values(runs(name, "online-popularity")))
        data_free = ({"which": "prior", **prior} if (prior["ratio"] or 0.0) > 1.0 else
                     {"which": "random", "ratio": 1.0, "se": None, "runs": []})
        p.update(nonprivate=ref, prior=prior, random={"ratio": 1.0, "se": 0.0}, data_free=data_free,
                 online_popularity=online)
        p["private_popularity"] = {_eps_key(e): _stats(values(runs(name, "private-popularity", e)))
                                   for e in cfg.epsilons if not math.isinf(e)}
        if "federated" in cfg.modes:
            p["private_popularity_federated"] = {
                _eps_key(e): _stats(values(runs(name, "private-popularity-federated", e)))
                for e in cfg.epsilons if not math.isinf(e)}
        if "local" in cfg.modes:
            p["private_popularity_local"] = {}
            for e in cfg.epsilons:
                if not math.isinf(e):
                    rs = runs(name, "private-popularity-local", e)
                    p["private_popularity_local"][_eps_key(e)] = {
                        **_stats(values(rs)), "not_applicable": next((r.not_applicable for r in rs if r.not_applicable),
                                                                     None)}
        cells: dict[str, dict[str, Any]] = {}
        for mode in cfg.modes:
            cells[mode] = {}
            for e in cfg.epsilons:
                reference = mode == "global" and math.isinf(e)
                rs = runs(name, "nonprivate") if reference else runs(name, mode, e)
                why = next((r.uncalibrated for r in rs if r.uncalibrated), None)
                st = _stats(values(rs))
                if math.isinf(e):
                    one_server, floor_row, floor_what = None, online, "online popularity"
                else:
                    one_server = p["private_popularity"][_eps_key(e)]
                    floor_row, floor_what = _floor_popularity(p, mode, _eps_key(e))
                cell: dict[str, Any] = {**st, "uncalibrated": why, "share_of_gain": None, "share_se": None,
                                        "floor": None, "floor_what": None, "floor_se": None, "floor_paired": None,
                                        "floor_met": None,
                                        "one_server_floor_met": None, "central_floor_met": None,
                                        "info": [r.info for r in rs if r.info] or None}
                if why is None and st["ratio"] is not None:
                    paired = None
                    if floor_what == "private popularity, local":  # one run measured both: the same twin and seed
                        floor_runs = runs(name, "private-popularity-local", e)
                        assert [r.job.run for r in floor_runs] == [r.job.run for r in rs]
                        paired = [a - b for a, b in zip(values(rs), values(floor_runs), strict=True)]
                    cell.update(_judge(st, ref, data_free, floor_row, floor_what, reference, paired=paired))
                    if one_server is not None and floor_row is not one_server:  # against one trusted server too
                        met = _judge(st, ref, data_free, one_server, "private popularity", reference)["floor_met"]
                        cell["central_floor_met" if mode == "local" else "one_server_floor_met"] = met
                cells[mode][_eps_key(e)] = cell
        p["cells"] = cells
    return {
        "what": "the share of the non-private gain the default (hierarchical) model keeps, per population, trust "
                "mode and user-level epsilon; ratios are reward / random play's expected reward (events / pool)",
        "epsilons": [e if not math.isinf(e) else "inf" for e in cfg.epsilons],
        "modes": list(cfg.modes), "delta": cfg.delta, "seeds": cfg.seeds,
        "populations": populations,
        "windows": {name: p["window"] for name, p in populations.items()},
        "evaluation_only": "nothing is tuned here: every model runs with its defaults on the windows listed",
        "definitions": {
            "share_of_gain": "(private - baseline) / (non-private - baseline); non-private = HierarchicalUCB at "
                             "epsilon = inf with the pool, items and units released; baseline = max(random play, the "
                             "public prior alone)",
            "se": "standard error of the mean over seeds (sd / sqrt(seeds)); null with one seed",
            "share_se": "delta method over the private, non-private and baseline SEs (0 where null)",
            "floor_met": "ratio >= max(best data-free, private popularity at that epsilon) - 2 SE of the difference "
                         "(at epsilon = inf: online popularity); SEs of one seed count as 0. Federated cells: private "
                         "popularity under the federated trust model (each site releases its own users' item sums "
                         "with its own noise, the sum ranks: private_popularity_federated); one_server_floor_met: "
                         "the same test against private popularity released by one trusted server. Local cells: "
                         "private popularity under the local trust model (the local default twin's own devices, "
                         "blanket and batches, ranked by the item counts its server estimates and nothing else: "
                         "private_popularity_local, measured in the local cell's own runs: the same twin and seed), "
                         "where the catalog is the codebook (else not_applicable says why and the floor stays "
                         "central); the test then takes the SE of the per-seed differences (floor_paired); "
                         "central_floor_met: the same test against private popularity released by one trusted server",
            "floor_se": "the SE of the difference the floor test allows 2 of: sqrt(se^2 + floor's se^2), or the SE of "
                        "the per-seed differences where floor_paired",
        },
        "config": {k: ([_eps_key(x) if isinstance(x, float) and math.isinf(x) else x for x in v]
                       if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "seconds": round(total, 1), "seconds_by_population": seconds, "machine": machine_info(),
    }


def _floor_popularity(p: dict[str, Any], mode: str, key: str) -> tuple[dict[str, Any], str]:
    """The private popularity (its row and name) a mode's private cell at ``key`` is judged against, under the mode's
    trust model: one server's (global), the federated one (each site its own noise), the local one where the catalog
    is the codebook (else one server's)."""
    if mode == "federated":
        return p["private_popularity_federated"][key], "private popularity, federated"
    local = p.get("private_popularity_local", {}).get(key)
    if mode == "local" and local and local["not_applicable"] is None:  # devices, no server
        return local, "private popularity, local"
    return p["private_popularity"][key], "private popularity"


def _judge(st: dict[str, Any], ref: dict[str, Any], data_free: dict[str, Any], floor_row: dict[str, Any],
           floor_what: str, reference: bool, paired: list[float] | None = None) -> dict[str, Any]:
    """A cell's share of the gain (with its SE) and whether it clears its floor.

    ``paired``: the cell's per-seed differences to ``floor_row`` where both were measured in the same runs (the local
    row and its local floor); the test then takes the SE of those differences, not of two independent means.
    """
    m, se = st["ratio"], st["se"] or 0.0
    out: dict[str, Any] = {}
    if ref["ratio"] is not None:
        base, base_se = data_free["ratio"], data_free["se"] or 0.0
        share = share_of_gain(m, nonprivate=ref["ratio"], baseline=base)
        out["share_of_gain"] = share
        if share is not None:
            if reference:
                out["share_se"] = 0.0
            else:
                gain = ref["ratio"] - base
                var = se**2 + share**2 * (ref["se"] or 0.0) ** 2 + (1.0 - share) ** 2 * base_se**2
                out["share_se"] = math.sqrt(var) / gain
    floor, floor_se, what = data_free["ratio"], data_free["se"] or 0.0, f"best data-free ({data_free['which']})"
    if floor_row["ratio"] is not None and floor_row["ratio"] > floor:
        floor, floor_se, what = floor_row["ratio"], floor_row["se"] or 0.0, floor_what
    diff_se = math.sqrt(se**2 + floor_se**2)
    if paired is not None and what == floor_what:
        diff_se = standard_error(paired) or 0.0
    out.update(floor=floor, floor_what=what, floor_se=diff_se, floor_paired=paired is not None and what == floor_what,
               floor_met=bool(m >= floor - 2.0 * diff_se))
    return out


# ------------------------------------------------------------------------------ the report


NC = "n/c"


def _fmt(st: dict[str, Any] | None, digits: int = 2) -> str:
    if st is None or st.get("ratio") is None:
        return "—"
    se = st.get("se")
    return f"{st['ratio']:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def _eps_label(key: str) -> str:
    return "∞" if key == "inf" else key


def _markdown(doc: dict[str, Any]) -> str:
    from privrec.ops.up import MAX_CATALOG_CODEBOOK

    cfg = doc["config"]
    keys = [_eps_key(float(e)) for e in doc["epsilons"]]
    lines = ["# What privacy costs: the default model's frontier", "",
             f"Reward ÷ random play's (mean ± standard error over {doc['seeds']} seed(s): noise keys and "
             f"tie-breaking; no ± with one seed) of the default hierarchical model, user level, δ = {doc['delta']:g}, "
             f"release every {cfg['tick']} events, per trust mode: `global` (one server), `federated` "
             f"({cfg['sites']} sites, each its own noise, summed), `local` (`privrec up --mode local`'s default: "
             f"population-wide shuffled batches of distinct users, cap {cfg['local_cap']} reports per device, "
             f"listens as codewords through a blanket of fakes at the whole ε — the catalog itself as the codebook up "
             f"to {MAX_CATALOG_CODEBOOK:,} items, else 64 codewords —, served by the hierarchy). At ε = ∞ "
             "each mode's non-private twin; `global` at ∞ is the non-private reference (HierarchicalUCB with the "
             "pool, items and units released).", "",
             "Columns: **share** of the non-private gain kept = (private − best data-free) ÷ (non-private − best "
             "data-free), ± its SE; **private pop.** = private popularity at that ε released by one trusted server (user "
             "level, cap 1, the whole budget on the item sums; at ∞: online popularity), and on the federated rows, in "
             "brackets, under the federated trust model (each site releases its own users' sums with its own noise; "
             "their sum ranks), and on the local rows, in brackets, under the local trust model (private popularity, "
             "local: the local row's own devices, blanket and batches, ranked by the item counts its server estimates "
             "alone; `n/a` where the catalog exceeds the codebook and no item's count is estimated); **online pop.** = "
             "online popularity (non-private); **data-free** = max(random play, the public prior alone); **floor** ✓ = "
             "the private ratio ≥ max(data-free, private popularity under the row's trust model) − 2 SE of the "
             "difference (on a local row, whose local popularity is measured in its own runs, the SE of the per-seed "
             "differences; a federated "
             "row also says when it misses the one-server floor, a local row when it misses the central one; a local "
             "row whose private popularity is `n/a` is judged against the central one); `n/c` = not calibrated "
             "(reason below).", "",
             "| population | mode | ε | ÷ random | share | private pop. | online pop. | data-free | non-private | "
             "floor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    for name, p in doc["populations"].items():
        first = True
        label = f"{p['label']} ({p['events']:,} events, {p['users']:,} users)"
        for mode, cells in p["cells"].items():
            reasons: dict[str, list[str]] = {}
            for key in keys:
                c = cells[key]
                pp = p["online_popularity"] if key == "inf" else p["private_popularity"].get(key)
                fed = "" if mode != "federated" or key == "inf" else \
                    f" (federated {_fmt(p['private_popularity_federated'].get(key))})"
                if mode == "local" and key != "inf":
                    lp = p["private_popularity_local"].get(key)
                    fed = f" (local {'n/a' if lp and lp['not_applicable'] else _fmt(lp)})"
                if c["uncalibrated"]:
                    value = share = floor = NC
                    reasons.setdefault(c["uncalibrated"], []).append(_eps_label(key))
                else:
                    value = _fmt(c)
                    share = "—" if c["share_of_gain"] is None else (
                        f"{c['share_of_gain']:.2f}" + ("" if not c["share_se"] else f" ± {c['share_se']:.2f}"))
                    floor = "—" if c["floor_met"] is None else ("✓" if c["floor_met"] else "✗")
                    if c.get("one_server_floor_met") is False:
                        floor += " (✗ one server)"
                    if c.get("central_floor_met") is False:
                        floor += " (✗ central)"
                df = p["data_free"]
                lines.append(f"| {label if first else ''} | {mode} | {_eps_label(key)} | {value} | {share} | "
                             f"{_fmt(pp)}{fed} | {_fmt(p['online_popularity'])} | {_fmt(df)} ({df['which']}) | "
                             f"{_fmt(p['nonprivate'])} | {floor} |")
                first = False
            for why, eps in reasons.items():
                notes.append(f"- {p['label']}, {mode}, ε = {', '.join(eps)}: {why}")
    lines += ["", _summary(doc), ""]
    if notes:
        lines += ["Not calibrated (`n/c`: the cell was not run; nothing of it is counted):", "", *notes, ""]
    lines += ["Windows evaluated (nothing was tuned on them here):", ""]
    for name, p in doc["populations"].items():
        w = p["window"]
        lines.append(f"- {p['label']}: events {w['events'][0]:,}–{w['events'][1]:,} of {w['source']}; local batch "
                     f"{p['local_batch']} users.")
    times = ", ".join(f"{doc['populations'][n]['label']} {s:.0f} s" for n, s in doc["seconds_by_population"].items())
    lines += ["", f"Wall time {doc['seconds']:.0f} s ({times}); machine yardstick sum(range(1000)) = "
                  f"{doc['machine']['python_speed_us']} µs."]
    return "\n".join(lines) + "\n"


def _summary(doc: dict[str, Any]) -> str:
    """How many private cells miss their floor, under their row's trust model and against one trusted server."""
    judged = [c for p in doc["populations"].values() for cells in p["cells"].values()
              for key, c in cells.items() if key != "inf" and c["floor_met"] is not None]
    missed = sum(not c["floor_met"] for c in judged)
    central = sum(not next(m for m in (c["one_server_floor_met"], c["central_floor_met"], c["floor_met"])
                           if m is not None) for c in judged)
    return (f"**{missed} of {len(judged)} private cells miss their floor** under their row's trust model; {central} "
            f"against one trusted server's private popularity (federated: ✗ one server, local: ✗ central).")


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    keys = [_eps_key(float(e)) for e in doc["epsilons"]]
    finite = [float(k) for k in keys if k != "inf"]
    top = max(finite) if finite else 1.0
    xs = {k: (top * 4.0 if k == "inf" else float(k)) for k in keys}  # ∞ drawn to the right of the largest ε
    modes = doc["modes"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.4), squeeze=False, sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, mode in zip(axes[0], modes):
        for i, (name, p) in enumerate(doc["populations"].items()):
            color = colors[i % len(colors)]
            cells = p["cells"][mode]
            pts = [(xs[k], cells[k]["share_of_gain"], cells[k]["share_se"] or 0.0) for k in keys
                   if cells[k]["share_of_gain"] is not None]
            if pts:
                x, y, e = zip(*pts)
                ax.errorbar(x, y, yerr=e, marker="o", capsize=3, color=color, label=p["label"])
            ref, base = p["nonprivate"]["ratio"], p["data_free"]["ratio"]
            floors = {k: _floor_popularity(p, mode, k)[0] for k in keys if k != "inf"}
            pp = [(xs[k], share_of_gain(row["ratio"], nonprivate=ref, baseline=base))
                  for k, row in floors.items() if ref is not None and row.get("ratio") is not None]
            pp = [(x, y) for x, y in pp if y is not None]
            if pp:
                x, y = zip(*pp)
                ax.plot(x, y, ls=":", lw=1.2, marker="x", color=color)
        ax.axhline(0.0, color="0.6", lw=0.8)
        ax.axhline(1.0, color="0.6", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xticks([xs[k] for k in keys])
        ax.set_xticklabels([_eps_label(k) for k in keys])
        ax.set_xticks([], minor=True)
        ax.set_xlabel("ε (user level)")
        ax.set_title(f"{mode}")
    axes[0][0].set_ylabel("share of the non-private gain kept")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       title="dotted, ×: private popularity\nunder the panel's trust model", title_fontsize=7)
    save(fig, path)
