"""``privrec experiment userlevel``: utility at user level — each user's whole history per epoch protected.

Two settings, user-level ε ∈ {1, 2, 4, 8} (δ = 1e-5), with the offline twin of ``privacy_unit = user``
(:class:`models.policies.UserLevelUCB`: each user's events of a release tick summed and clipped, at most
``cap`` ticks per user and epoch, noise calibrated so that a capped user gets (ε, δ) per epoch):

* **LastFM**: the replay's first events offline (``privrec experiment lastfm``'s protocol), the default
  model — LinUCB per cluster with the item term and organic listens — a release every ``tick`` events;
  the reward ratio to random play, mean ± sd over noise seeds;
* **synthetic**: the collaborative paper's environment (N users, T interactions), LinUCB per user;
  cumulative regret.

The cap is **tuned on held-out data** before anything is reported: for LastFM a later window of events
(``tune_start``), for the synthetic environment other seeds; per ε, the cap with the best held-out score.
Writes ``userlevel.json``, ``userlevel.md`` and ``userlevel.png``.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.ground.environment import SyntheticEnvironment
from models.policies import RandomPolicy, make_policy, make_user_level_policy

from .lastfm import ROWS as LASTFM_ROWS
from .lastfm import LastFMConfig, LastFMEvents, load_events, replay_offline
from .plots import epsilon_axis, pyplot, save
from .runner import derive_seed, machine_info, simulate, summarize

__all__ = ["UserLevelConfig", "run_userlevel"]


@dataclass(frozen=True)
class UserLevelConfig:
    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    caps: tuple[int, ...] = (2, 4, 8, 16)
    lastfm_events: int = 5_000
    lastfm_runs: int = 3
    tick: int = 100
    tune_start: int = 40_000
    synthetic_horizon: int = 20_000
    synthetic_tick: int = 1_000
    synthetic_caps: tuple[int, ...] = (1, 2, 5, 10, 20)
    synthetic_runs: int = 3
    tune_seed: int = 1000
    delta: float = 1e-5
    data_dir: str | None = None
    lastfm: bool = True
    seed: int = 0

    @classmethod
    def quick(cls, **kw: Any) -> UserLevelConfig:
        return cls(**{"lastfm_events": 2_000, "lastfm_runs": 1, "caps": (2, 8), "synthetic_horizon": 4_000,
                      "synthetic_tick": 400, "synthetic_caps": (2, 10), "synthetic_runs": 1, **kw})


_EV: dict[str, LastFMEvents] = {}


def _lastfm_policy(ev: LastFMEvents, epsilon: float, cap: int, seed: int, cfg: UserLevelConfig) -> Any:
    return make_user_level_policy("LinUCB", d=ev.features.shape[1], W=np.eye(ev.n_units),
                                  n_items=ev.features.shape[0], epsilon=epsilon, delta=cfg.delta, cap=cap,
                                  tick=cfg.tick, features=ev.features, seed=seed, lambda_=1.0, alpha=0.3,
                                  noise_ridge=100.0)


def _synthetic_policy(env: SyntheticEnvironment, epsilon: float, cap: int, seed: int, cfg: UserLevelConfig) -> Any:
    return make_user_level_policy("LinUCB", d=env.d, W=np.eye(env.n_users), n_items=1, epsilon=epsilon,
                                  delta=cfg.delta, cap=cap, tick=cfg.synthetic_tick, weight=0.0, seed=seed,
                                  lambda_=0.1, alpha=0.3, noise_ridge=30.0)


class _SynthAdapter:
    """The synthetic simulator calls select(user, X) / update(user, x, r): the user is the unit."""

    def __init__(self, pol: Any) -> None:
        self.pol = pol

    def select(self, user: int, contexts: np.ndarray) -> int:
        self.pol.begin_event(user)
        return int(self.pol.select(user, contexts))

    def update(self, user: int, context: np.ndarray, reward: float) -> None:
        self.pol.begin_event(user)
        self.pol.update(user, context, reward)


def _job(args: tuple[str, float, int, int, bool, UserLevelConfig]) -> tuple[str, float, int, int, bool, float]:
    dataset, eps, cap, run, tuning, cfg = args
    seed = derive_seed("userlevel", dataset, eps, cap, run, tuning)
    if dataset == "lastfm":
        ev = _EV["tune" if tuning else "eval"]
        value = replay_offline(_lastfm_policy(ev, eps, cap, seed, cfg), ev) / (ev.n / ev.pool_size)
    else:
        env_seed = (cfg.tune_seed if tuning else cfg.seed) + run
        env = SyntheticEnvironment(d=25, n_users=10, horizon=cfg.synthetic_horizon, seed=env_seed)
        value, _ = simulate(env, _SynthAdapter(_synthetic_policy(env, eps, cap, seed, cfg)), checkpoints=1)
    return dataset, eps, cap, run, tuning, float(value)


#: The references, same events and seeds: what the default model earns without user-level protection.
LASTFM_REFS = {"non-private": ("LinUCB+pop", math.inf), "event level, epsilon = 2": ("LinUCB+pop", 2.0),
               "popularity counter (non-private)": ("popularity", math.inf)}
SYNTHETIC_REFS = ("random", "non-private", "event level, epsilon = 2")


def _reference(dataset: str, name: str, run: int, cfg: UserLevelConfig) -> float:
    seed = derive_seed("userlevel-ref", dataset, name, run)
    if dataset == "lastfm":
        ev = _EV["eval"]
        row_name, eps = LASTFM_REFS[name]
        row = next(r for r in LASTFM_ROWS if r.name == row_name)
        lcfg = LastFMConfig(tick=cfg.tick, delta=cfg.delta)
        return replay_offline(row.make(ev, eps, seed, lcfg), ev) / (ev.n / ev.pool_size)
    env = SyntheticEnvironment(d=25, n_users=10, horizon=cfg.synthetic_horizon, seed=cfg.seed + run)
    if name == "random":
        pol: Any = RandomPolicy(seed=seed)
    else:
        private = name != "non-private"
        pol = make_policy("DP-LinUCB" if private else "LinUCB", d=env.d, W=np.eye(env.n_users),
                          epsilon=2.0 if private else math.inf, delta=cfg.delta, mechanism="user-blt-exact",
                          horizon=cfg.synthetic_horizon, tick=cfg.synthetic_tick, seed=seed, lambda_=0.1,
                          alpha=0.3, noise_ridge=30.0)
    value, _ = simulate(env, pol, checkpoints=1)
    return float(value)


def _dispatch(args: tuple[Any, ...]) -> tuple[Any, ...]:
    if args[0] == "ref":
        _, dataset, name, run, cfg = args
        return ("ref", dataset, name, run, _reference(dataset, name, run, cfg))
    return _job(args)  # type: ignore[arg-type]


def _run(work: list[tuple[Any, ...]], jobs: int | None) -> list[tuple[Any, ...]]:
    n = max(1, jobs or os.cpu_count() or 1)
    if n == 1:
        return [_dispatch(w) for w in work]
    with mp.get_context("fork").Pool(n) as pool:
        return list(pool.imap_unordered(_dispatch, work, chunksize=1))


def run_userlevel(cfg: UserLevelConfig, out: Path, *, jobs: int | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    if cfg.lastfm:
        _EV["eval"] = load_events(cfg.lastfm_events, cfg.data_dir, 0)
        _EV["tune"] = load_events(cfg.lastfm_events, cfg.data_dir, cfg.tune_start)
    # 1. tuning on held-out data: LastFM's later window, synthetic tuning seeds
    tune = [("synthetic", e, c, 0, True, cfg) for e in cfg.epsilons for c in cfg.synthetic_caps]
    if cfg.lastfm:
        tune += [("lastfm", e, c, 0, True, cfg) for e in cfg.epsilons for c in cfg.caps]
    tuned = _run(tune, jobs)
    chosen: dict[str, dict[float, int]] = {"lastfm": {}, "synthetic": {}}
    for dataset in chosen:
        for e in cfg.epsilons:
            cells = [(c, v) for d, ee, c, _, _, v in tuned if d == dataset and ee == e]
            if cells:  # LastFM: highest reward ratio; synthetic: lowest regret
                best = max(cells, key=lambda x: x[1]) if dataset == "lastfm" else min(cells, key=lambda x: x[1])
                chosen[dataset][e] = best[0]
    # 2. evaluation with the chosen caps
    work: list[tuple[Any, ...]] = [("synthetic", e, chosen["synthetic"][e], r, False, cfg) for e in cfg.epsilons
                                   for r in range(cfg.synthetic_runs)]
    work += [("ref", "synthetic", name, r, cfg) for name in SYNTHETIC_REFS for r in range(cfg.synthetic_runs)]
    if cfg.lastfm:
        work += [("lastfm", e, chosen["lastfm"][e], r, False, cfg) for e in cfg.epsilons for r in range(cfg.lastfm_runs)]
        work += [("ref", "lastfm", name, r, cfg) for name in LASTFM_REFS for r in range(cfg.lastfm_runs)]
    done = _run(work, jobs)
    results = [x for x in done if x[0] != "ref"]
    refs = [x for x in done if x[0] == "ref"]
    doc: dict[str, Any] = {"epsilons": list(cfg.epsilons), "unit": "user", "delta": cfg.delta,
                           "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}}
    for dataset, key in (("lastfm", "ratio"), ("synthetic", "regret")):
        if dataset == "lastfm" and not cfg.lastfm:
            continue
        means, sds = [], []
        for e in cfg.epsilons:
            m, sd = summarize([v for d, ee, _, _, _, v in results if d == dataset and ee == e])
            means.append(m)
            sds.append(sd)
        doc[dataset] = {key: means, f"{key}_sd": sds, "cap": [chosen[dataset][e] for e in cfg.epsilons],
                        "references": {name: dict(zip(("mean", "sd"), summarize(
                            [v for _, d, n, _, v in refs if d == dataset and n == name])))
                            for name in (LASTFM_REFS if dataset == "lastfm" else SYNTHETIC_REFS)},
                        "tuning": {str(e): {str(c): v for d, ee, c, _, _, v in tuned if d == dataset and ee == e}
                                   for e in cfg.epsilons}}
    if cfg.lastfm and 4.0 in cfg.epsilons:
        r4 = doc["lastfm"]["ratio"][list(cfg.epsilons).index(4.0)]
        doc["target"] = {"what": "user-level epsilon = 4: LastFM reward ratio >= 1.5", "ratio": r4, "met": r4 >= 1.5}
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    doc["machine"] = machine_info()
    out.mkdir(parents=True, exist_ok=True)
    (out / "userlevel.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "userlevel.md").write_text(_markdown(doc))
    _plot(doc, out / "userlevel.png")
    return doc


def _markdown(doc: dict[str, Any]) -> str:
    c = doc["config"]
    eps = doc["epsilons"]
    lines = ["# Utility at user level", "",
             f"Each user's events of a release tick are summed and clipped; at most `cap` ticks per user and epoch; "
             f"the noise is calibrated so that a capped user's whole epoch is (ε, {doc['delta']:g})-DP. Caps tuned on "
             f"held-out data (LastFM events from {c['tune_start']:,}; synthetic seeds from {c['tune_seed']}). "
             f"Wall time {doc['seconds']:.0f} s.", "",
             "| | " + " | ".join(f"ε = {e:g}" for e in eps) + " |", "|---|" + "---|" * len(eps)]
    if "lastfm" in doc:
        lf = doc["lastfm"]
        lines.append("| LastFM reward ratio (default model) | " + " | ".join(
            f"{m:.2f} ± {s:.2f}" for m, s in zip(lf["ratio"], lf["ratio_sd"])) + " |")
        lines.append("| LastFM cap (ticks per epoch) | " + " | ".join(str(x) for x in lf["cap"]) + " |")
    sy = doc["synthetic"]
    lines.append("| synthetic regret (LinUCB) | " + " | ".join(f"{m:,.0f} ± {s:,.0f}" for m, s in
                                                             zip(sy["regret"], sy["regret_sd"])) + " |")
    lines.append("| synthetic cap | " + " | ".join(str(x) for x in sy["cap"]) + " |")
    lines += ["", "References on the same events and seeds (no user-level protection):", ""]
    for key, fmt in (("lastfm", "{:.2f} ± {:.2f}"), ("synthetic", "{:,.0f} ± {:,.0f}")):
        for name, ref in doc.get(key, {}).get("references", {}).items():
            what = "LastFM reward ratio" if key == "lastfm" else "synthetic regret"
            lines.append(f"* {what}, {name}: " + fmt.format(ref["mean"], ref["sd"]))
    if "lastfm" in doc:
        lines += ["", f"LastFM: the first {c['lastfm_events']:,} replay events, {c['lastfm_runs']} noise seeds, a "
                      f"release every {c['tick']} events. Synthetic: d = 25, N = 10, T = {c['synthetic_horizon']:,}, "
                      f"a release every {c['synthetic_tick']:,} interactions, {c['synthetic_runs']} runs."]
    t = doc.get("target")
    if t:
        lines += ["", f"Target — {t['what']}: {t['ratio']:.2f}, **{'met' if t['met'] else 'missed'}**."]
    lines += ["", f"Machine yardstick: sum(range(1000)) = {doc['machine']['python_speed_us']} µs.", ""]
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    panels = [k for k in ("lastfm", "synthetic") if k in doc]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.4), squeeze=False)
    for ax, key in zip(axes[0], panels):
        ys = doc[key]["ratio" if key == "lastfm" else "regret"]
        sd = doc[key]["ratio_sd" if key == "lastfm" else "regret_sd"]
        ax.errorbar(doc["epsilons"], ys, yerr=sd, marker="o", capsize=3)
        for e, y, c in zip(doc["epsilons"], ys, doc[key]["cap"]):
            ax.annotate(f"cap {c}", (e, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
        epsilon_axis(ax, doc["epsilons"])
        ax.set_xlabel("user-level ε (per epoch)")
        styles = ["--", "-.", ":"]
        for (name, ref), ls in zip(doc[key].get("references", {}).items(), styles):
            ax.axhline(ref["mean"], color="0.4", ls=ls, lw=1, label=name)
        if key == "lastfm":
            ax.axhline(1.0, color="k", ls="-", lw=0.6, label="random play")
            ax.axhline(1.5, color="tab:red", ls=":", lw=1, label="target at ε = 4")
            ax.set_ylabel("reward / random play")
            ax.set_title("LastFM (offline replay)")
        else:
            ax.set_ylabel("cumulative regret")
            ax.set_title("synthetic environment")
        ax.legend(fontsize=8)
    save(fig, path)

