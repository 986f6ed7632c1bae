"""``privrec experiment lastfm``: the LastFM replay offline — every model against popularity, seeded, fast.

The protocol is ``privrec replay lastfm``'s, without the HTTP round trips and with the same ``models``
code as the pipeline: for each of the first ``N`` logged events (a user and the artist they listened
to), the policy ranks the event's 25-artist pool (the logged artist and 24 random tagged ones) and
recommends its top item; the reward is 1 iff that is the logged artist. The bandit learns from that
feedback alone. The logged listen is also an *organic positive*: models with an item term and the
popularity counter count it (:meth:`models.policies.PopularityUCB.observe`) after every event, whatever the
reward, as the live replay posts ``/listen`` after every feedback (:func:`producers.replay.event_requests`: a
listen sent only on a miss would make the public arrivals encode every reward). A hit therefore counts the
artist twice, as its feedback and as its listen. Model units are the 100 friend-graph clusters,
releases happen every ``tick`` events (the live replay's ~100 events per one-second tick), and the
private models use the pipeline's defaults (``user-blt-exact``, λ = 1, κ = 100, α = 0.3, trees of
2**14 − 1 ticks). Runs differ in their noise keys and tie-breaking seeds; the events and pools are the
replay's own.

Rows: ``random``, ``popularity`` (global), ``popularity-cluster``, ``private-popularity`` (the item
sums released through ``blt-exact`` with the whole budget), each of ``LinUCB``, ``CoLin``, ``GOBLin``
alone (bandit feedback only, the papers' protocol) and ``+pop`` (the item term, the budget split
between the two releases by exact Gaussian-DP composition, and organic listens in the bandit), and
the ablation ``LinUCB+listens`` (listens, no item term), non-private and at each ε.

Writes ``lastfm.json`` (``{"events": [...], "epsilons": [...], "rows": {row: {"<N>": {"<eps>":
{"ratio", "sd", "runs"}}}}, ...}``), ``lastfm.md`` and ``lastfm.png``.
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

from models.policies import OnlinePopularity, make_policy, make_popularity_policy

from .plots import epsilon_axis, pyplot, save
from .runner import derive_seed, machine_info, summarize

__all__ = ["LastFMConfig", "LastFMEvents", "load_events", "replay_offline", "run_lastfm", "ROWS"]

EPSILONS = (1.0, 2.0, 5.0)


@dataclass(frozen=True)
class LastFMConfig:
    """Settings of the offline evaluation (``--quick``: 2 runs, 2,000 events, fewer rows)."""

    events: tuple[int, ...] = (5_000, 20_000)
    epsilons: tuple[float, ...] = EPSILONS
    runs: int = 5
    tick: int = 100
    lambda_: float = 1.0
    alpha: float = 0.3
    noise_ridge: float = 100.0
    tree_levels: int = 14
    mechanism: str = "user-blt-exact"
    item_mechanism: str = "blt-exact"
    weight: float = 1.0
    share: float = 0.5
    item_tick: int = 100
    threshold_stds: float = 2.0
    listen_weight: float | None = None  # None: by privacy (models.policies.popularity.LISTEN_WEIGHT)
    noise_scale: float = 2.0
    start: int = 0                      # first event (a held-out window for tuning: e.g. 40000)
    delta: float = 1e-5
    rows: tuple[str, ...] = ()
    data_dir: str | None = None
    seed: int = 0

    @classmethod
    def quick(cls, **kw: Any) -> LastFMConfig:
        base = {"events": (2_000,), "runs": 2,
                "rows": ("random", "popularity", "popularity-cluster", "private-popularity", "LinUCB", "LinUCB+listens",
                         "LinUCB+pop")}
        return cls(**{**base, **kw})


@dataclass(frozen=True)
class LastFMEvents:
    """The first ``n`` replay events as arrays: unit, pool rows, the logged item's position."""

    units: np.ndarray     # (n,) cluster of the event's user
    pools: np.ndarray     # (n, pool) rows of the catalog's feature matrix
    correct: np.ndarray   # (n,) position of the logged artist in the pool
    features: np.ndarray  # (K, d)
    W: np.ndarray         # (units, units) CoLin matrix
    n_units: int
    users: np.ndarray | None = None  # (n,) the event's user (user-level privacy caps users, not units)

    @property
    def n(self) -> int:
        return int(self.units.shape[0])

    @property
    def pool_size(self) -> int:
        return int(self.pools.shape[1])


def load_events(n: int, data_dir: str | None = None, start: int = 0) -> LastFMEvents:
    """The replay's events ``start .. start + n`` (``privrec replay lastfm --start`` plays the same ones, in order)."""
    from producers.lastfm import load_catalog

    cat = load_catalog(data_dir, progress=False)
    ev = cat.event_arrays()
    if not 0 <= start < len(ev.users):
        raise ValueError(f"`start` must be in [0, {len(ev.users)}), got {start}.")
    sl = slice(start, min(start + int(n), len(ev.users)))
    units = np.array([cat.cluster_of(str(u)) for u in ev.users[sl]], dtype=np.int64)
    index = cat.artist_index
    pools = np.array([[index[str(a)] for a in row] for row in ev.pools[sl]], dtype=np.int64)
    correct = np.argmax(ev.pools[sl] == ev.arms[sl, None], axis=1).astype(np.int64)
    return LastFMEvents(units, pools, correct, np.asarray(cat.feature_matrix), np.asarray(cat.W), cat.n_clusters,
                        np.asarray(ev.users[sl], dtype=np.int64))


def replay_offline(policy: Any, ev: LastFMEvents, n: int | None = None,
                   curve: list[tuple[int, float]] | None = None, every: int = 0) -> float:
    """Total reward of ``policy`` on the first ``n`` events (see the module docstring for the protocol).

    ``curve`` (with ``every``) collects ``(events, cumulative reward)``. ``policy`` either takes the pool's items (``select(unit, X, items)``, ``update(unit, x, r, item)``,
    optionally ``observe(unit, item)``) or is a plain bandit (``select(unit, X)``, ``update(unit, x, r)``).
    """
    with_items = hasattr(policy, "observe")
    observe = getattr(policy, "observe", None)
    begin = getattr(policy, "begin_event", None)  # user-level policies need the event's user
    reward = 0.0
    for i in range(ev.n if n is None else min(n, ev.n)):
        u, items, j = int(ev.units[i]), ev.pools[i], int(ev.correct[i])
        if begin is not None:
            begin(int(ev.users[i]) if ev.users is not None else u)
        X = ev.features[items]
        k = policy.select(u, X, items) if with_items else policy.select(u, X)
        r = 1.0 if k == j else 0.0
        if with_items:
            policy.update(u, X[k], r, int(items[k]))
            if observe is not None:  # the organic listen of every event, independent of the reward
                observe(u, int(items[j]))
        else:
            policy.update(u, X[k], r)
        reward += r
        if curve is not None and every and (i + 1) % every == 0:
            curve.append((i + 1, reward))
    return reward


class _Random:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def select(self, user: int, contexts: np.ndarray) -> int:
        return int(self.rng.integers(len(contexts)))

    def update(self, user: int, context: np.ndarray, reward: float) -> None:
        pass


def _bandit(name: str) -> Callable[..., Any]:
    def make(ev: LastFMEvents, epsilon: float, seed: int, cfg: LastFMConfig) -> Any:
        private = not math.isinf(epsilon)
        W = np.eye(ev.n_units) if name == "LinUCB" else ev.W
        horizon = ((1 << cfg.tree_levels) - 1) * cfg.tick
        return make_policy(f"DP-{name}" if private else name, d=ev.features.shape[1], W=W, epsilon=epsilon,
                           delta=cfg.delta, mechanism=cfg.mechanism, horizon=horizon, tick=cfg.tick, seed=seed,
                           lambda_=cfg.lambda_, alpha=cfg.alpha, noise_ridge=cfg.noise_ridge)
    return make


def _with_pop(name: str | None, weight: float | None = None) -> Callable[..., Any]:
    def make(ev: LastFMEvents, epsilon: float, seed: int, cfg: LastFMConfig) -> Any:
        W = np.eye(ev.n_units) if name in (None, "LinUCB") else ev.W
        horizon = ((1 << cfg.tree_levels) - 1) * cfg.tick
        return make_popularity_policy(name, d=ev.features.shape[1], W=W, n_items=ev.features.shape[0],
                                      epsilon=epsilon, delta=cfg.delta, share=cfg.share, mechanism=cfg.mechanism,
                                      item_mechanism=cfg.item_mechanism,
                                      weight=cfg.weight if weight is None else weight,
                                      item_tick=cfg.item_tick, threshold_stds=cfg.threshold_stds, horizon=horizon,
                                      item_horizon=(1 << cfg.tree_levels) - 1, seed=seed, tick=cfg.tick,
                                      features=ev.features, listen_weight=cfg.listen_weight,
                                      noise_scale=cfg.noise_scale,
                                      lambda_=cfg.lambda_, alpha=cfg.alpha, noise_ridge=cfg.noise_ridge)
    return make


@dataclass(frozen=True)
class Row:
    name: str
    about: str
    make: Callable[..., Any]
    private: bool  # evaluated at every epsilon (else once, without privacy)


ROWS: list[Row] = [
    Row("random", "uniformly random play", lambda ev, e, s, c: _Random(s), False),
    Row("popularity", "online popularity: the most positives seen so far (non-private)",
        lambda ev, e, s, c: OnlinePopularity(ev.features.shape[0], seed=s), False),
    Row("popularity-cluster", "online popularity per friend-graph cluster (non-private)",
        lambda ev, e, s, c: OnlinePopularity(ev.features.shape[0], n_units=ev.n_units, per_unit=True, seed=s), False),
    Row("private-popularity", "the item sums released through blt-exact with the whole budget, ranked",
        _with_pop(None), True),
    *[Row(m, f"{m} per cluster (bandit feedback only)", _bandit(m), True) for m in ("LinUCB", "CoLin", "GOBLin")],
    Row("LinUCB+listens", "LinUCB that also learns from organic listens (no item term): an ablation",
        _with_pop("LinUCB", weight=0.0), True),
    *[Row(f"{m}+pop", f"{m} plus the item term from the privately released item sums (budget split) and "
                      f"organic listens", _with_pop(m), True) for m in ("LinUCB", "CoLin", "GOBLin")],
]


@dataclass(frozen=True)
class _Job:
    row: str
    epsilon: float
    run: int
    n: int


_EVENTS: dict[str, LastFMEvents] = {}


def _execute(job: _Job, cfg: LastFMConfig) -> tuple[_Job, float, float]:
    ev = _EVENTS["events"]
    row = next(r for r in ROWS if r.name == job.row)
    seed = derive_seed("lastfm", cfg.seed, job.run, job.row, job.epsilon, job.n)
    t0 = time.perf_counter()
    reward = replay_offline(row.make(ev, job.epsilon, seed, cfg), ev, job.n)
    return job, reward, time.perf_counter() - t0


def _worker(args: tuple[_Job, LastFMConfig]) -> tuple[_Job, float, float]:
    return _execute(*args)


def run_lastfm(cfg: LastFMConfig, out: Path, *, jobs: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every (row, ε, run, N); write lastfm.json / .md / .png; return the document."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    unknown = set(cfg.rows) - {r.name for r in ROWS}
    if unknown:
        raise ValueError(f"`rows` names unknown row(s) {sorted(unknown)}; known: {[r.name for r in ROWS]}")
    rows = [r for r in ROWS if not cfg.rows or r.name in cfg.rows]
    _EVENTS["events"] = load_events(max(cfg.events), cfg.data_dir, cfg.start)
    work = [_Job(r.name, e, k, n) for r in rows for n in cfg.events for k in range(cfg.runs)
            for e in ([math.inf, *cfg.epsilons] if r.private else [math.inf])]
    work.sort(key=lambda j: -j.n * (8 if "CoLin" in j.row or "GOBLin" in j.row else 1))  # longest first
    results: list[tuple[_Job, float, float]] = []
    bar = tqdm(total=len(work), desc="lastfm offline", unit="run", disable=not progress, dynamic_ncols=True)
    n_proc = max(1, jobs or os.cpu_count() or 1)
    if n_proc == 1:
        for j in work:
            results.append(_execute(j, cfg))
            bar.update()
    else:
        with mp.get_context("fork").Pool(n_proc) as pool:
            for res in pool.imap_unordered(_worker, [(j, cfg) for j in work], chunksize=1):
                results.append(res)
                bar.update()
    bar.close()
    doc = _document(cfg, rows, results, time.perf_counter() - t0)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lastfm.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "lastfm.md").write_text(_markdown(doc))
    _plot(doc, out / "lastfm.png")
    return doc


def _eps_key(e: float) -> str:
    return "inf" if math.isinf(e) else f"{e:g}"


def _document(cfg: LastFMConfig, rows: Sequence[Row], results: list[tuple[_Job, float, float]],
              seconds: float) -> dict[str, Any]:
    pool = _EVENTS["events"].pool_size
    table: dict[str, Any] = {}
    for r in rows:
        table[r.name] = {"about": r.about, "private": r.private}
        for n in cfg.events:
            cells: dict[str, Any] = {}
            for e in ([math.inf, *cfg.epsilons] if r.private else [math.inf]):
                ratios = [rew / (n / pool) for j, rew, _ in results
                          if j.row == r.name and j.n == n and j.epsilon == e]
                m, sd = summarize(ratios)
                cells[_eps_key(e)] = {"ratio": m, "sd": sd, "runs": ratios,
                                      "reward": m * n / pool}
            table[r.name][str(n)] = cells
    doc: dict[str, Any] = {"events": list(cfg.events), "epsilons": list(cfg.epsilons), "rows": table,
                           "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
                           "seconds": round(seconds, 1), "machine": machine_info()}
    doc["targets"] = _targets(doc)
    return doc


def _targets(doc: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, per event count: non-private default model >= 1.1x popularity; at eps = 2 >= popularity."""
    out: dict[str, Any] = {}
    rows = doc["rows"]
    if "popularity" not in rows:
        return out
    for n in doc["events"]:
        pop = rows["popularity"][str(n)]["inf"]["ratio"]
        best_np = max(((name, r[str(n)]["inf"]["ratio"]) for name, r in rows.items()
                       if r["private"] and name != "private-popularity"), key=lambda x: x[1], default=None)
        best_2 = max(((name, r[str(n)]["2"]["ratio"]) for name, r in rows.items()
                      if r["private"] and "2" in r[str(n)]), key=lambda x: x[1], default=None)
        out[str(n)] = {
            "popularity_ratio": pop,
            "nonprivate_best": best_np, "nonprivate_vs_popularity": None if best_np is None else best_np[1] / pop,
            "nonprivate_met": best_np is not None and best_np[1] >= 1.1 * pop,
            "eps2_best": best_2, "eps2_vs_popularity": None if best_2 is None else best_2[1] / pop,
            "eps2_met": best_2 is not None and best_2[1] >= pop,
        }
    return out


def _markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    eps = doc["epsilons"]
    lines = ["# LastFM offline: models against popularity", "",
             f"The replay's first events, offline; reward ratio to random play (1/{_EVENTS['events'].pool_size} per "
             f"event), mean ± sd over {cfg['runs']} runs (noise keys and tie-breaking). Releases every "
             f"{cfg['tick']} events; `{cfg['mechanism']}`, λ = {cfg['lambda_']}, κ = {cfg['noise_ridge']}, "
             f"α = {cfg['alpha']}; item term weight {cfg['weight']}, item sums released every {cfg['item_tick']} "
             f"events through `{cfg['item_mechanism']}`, threshold {cfg['threshold_stds']} noise std, budget share "
             f"of the bandit {cfg['share']} (of μ²). δ = {cfg['delta']}. Wall time {doc['seconds']:.0f} s.", ""]
    for n in doc["events"]:
        lines += [f"## {n:,} events", "", "| row | non-private | " + " | ".join(f"ε = {e:g}" for e in eps) + " |",
                  "|---|---|" + "---|" * len(eps)]
        for name, r in doc["rows"].items():
            cells = r[str(n)]

            def cell(key: str) -> str:
                c = cells.get(key)
                return "—" if c is None else f"{c['ratio']:.2f} ± {c['sd']:.2f}"
            lines.append(f"| {name} | {cell('inf')} | " + " | ".join(cell(_eps_key(e)) for e in eps) + " |")
        t = doc["targets"].get(str(n))
        if t:
            lines += ["", f"Targets at {n:,} events: best non-private model {t['nonprivate_best'][0]} "
                          f"{t['nonprivate_best'][1]:.2f} = {t['nonprivate_vs_popularity']:.3f}× popularity "
                          f"({t['popularity_ratio']:.2f}; target ≥ 1.1×: **{'met' if t['nonprivate_met'] else 'missed'}**); "
                          f"best at ε = 2 {t['eps2_best'][0]} {t['eps2_best'][1]:.2f} = "
                          f"{t['eps2_vs_popularity']:.3f}× (target ≥ 1×: **{'met' if t['eps2_met'] else 'missed'}**)."
                      if t["nonprivate_best"] and t["eps2_best"] else ""]
        lines.append("")
    lines.append(f"Machine yardstick: sum(range(1000)) = {doc['machine']['python_speed_us']} µs.")
    return "\n".join(lines) + "\n"


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    ns = doc["events"]
    fig, axes = plt.subplots(1, len(ns), figsize=(6.5 * len(ns), 4.8), squeeze=False)
    eps = doc["epsilons"]
    for ax, n in zip(axes[0], ns):
        for name, r in doc["rows"].items():
            cells = r[str(n)]
            if r["private"]:
                ys = [cells[_eps_key(e)]["ratio"] for e in eps]
                sd = [cells[_eps_key(e)]["sd"] for e in eps]
                ax.errorbar(eps, ys, yerr=sd, marker="o", capsize=3, label=name)
            else:
                ax.axhline(cells["inf"]["ratio"], ls="--" if name != "random" else ":", lw=1.2,
                           color={"popularity": "k", "popularity-cluster": "0.45", "random": "0.7"}.get(name),
                           label=f"{name} (non-private)")
        epsilon_axis(ax, eps)
        ax.set_ylabel("reward / random play")
        ax.set_title(f"LastFM offline, {n:,} events")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(fig, path)
