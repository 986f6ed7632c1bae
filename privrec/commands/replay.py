"""``privrec replay``: drive the live API with logged events, as real users would."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="replay logged events through the live HTTP API")
    rsub = p.add_subparsers(dest="source", metavar="SOURCE", required=True)
    lf = rsub.add_parser(
        "lastfm", help="replay HetRec LastFM events: recommend over each event's 25-artist pool, reward 1 iff "
                       "the logged artist is recommended",
        description="For each logged LastFM event: GET /recommend over its 25-artist pool (k=1), reward 1 iff the "
                    "top artist is the logged one, POST /feedback. Writes replay.json and replay.png to --out. "
                    "The stack must run with --catalog lastfm.")
    lf.add_argument("--events", type=int, default=5000, help="events to replay (default 5000)")
    lf.add_argument("--start", type=int, default=0, help="index of the first event (default 0)")
    lf.add_argument("--rate", default="auto",
                    help="events/s: a number, 'max' (as fast as the API answers) or 'auto' (default: 100 events per "
                         "release tick, so that the model can follow: 100/s at the default 1 s tick)")
    lf.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    lf.add_argument("--out", type=Path, required=True, help="output directory")
    lf.add_argument("--http", default=None, help="API base URL (default: $PRIVREC_HTTP_URL, or the running "
                                                 "stack of --state-dir)")
    lf.add_argument("--state-dir", type=Path, default=None, help="state directory of `privrec up`")
    lf.add_argument("--data-dir", default=None, help="LastFM data directory (default: $PRIVREC_DATA_DIR or "
                                                     "../shared/data/lastfm-2k)")
    lf.add_argument("--no-listens", action="store_true",
                    help="do not send each logged artist as an organic listen (POST /listen, after every feedback)")
    lf.add_argument("--no-baselines", action="store_true",
                    help="skip the offline baselines on the same events (random, popularity, private popularity)")
    lf.add_argument("--mode", choices=("auto", "global", "local"), default="auto",
                    help="local: every simulated user runs the device library (models.local.LocalClient) and sends "
                         "only noisy reports (POST /report); auto (default): what the stack runs (GET /local/config)")
    lf.add_argument("--devices", type=Path, default=None,
                    help="local mode: keep each simulated device's state in DIR (one file per user; default: memory)")
    lf.add_argument("--no-progress", action="store_true", help="no progress bar")
    lf.set_defaults(func=_lastfm)
    ev = rsub.add_parser(
        "events", help="replay any events.csv (user,item,timestamp[,reward]): LastFM's protocol on your log",
        description="For each logged positive of FILE in time order: a pool of --pool items (the logged one plus "
                    "others of the catalog drawn by the public --seed), GET /recommend over it (k=1), reward 1 iff "
                    "the top item is the logged one, POST /feedback. Writes replay.json and replay.png to --out, "
                    "with the random and popularity baselines on the same events. The stack must serve the "
                    "catalog directory the events name items of (privrec up --catalog DIR).")
    ev.add_argument("file", type=Path, metavar="FILE", help="an events.csv (columns user, item, timestamp, "
                                                            "optional reward)")
    ev.add_argument("--catalog", type=Path, default=None,
                    help="the catalog directory (default: the one the stack serves, else FILE's directory)")
    ev.add_argument("--pool", type=int, default=25, help="items per pool (default 25)")
    ev.add_argument("--seed", type=int, default=0, help="public seed of the pools (default 0)")
    ev.add_argument("--events", type=int, default=None, help="replay at most this many positives (default: all)")
    ev.add_argument("--rate", default="auto", help="events/s: a number, 'max' or 'auto' (default: 100 events per "
                                                   "release tick)")
    ev.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    ev.add_argument("--out", type=Path, required=True, help="output directory")
    ev.add_argument("--http", default=None, help="API base URL (default: $PRIVREC_HTTP_URL, or the running "
                                                 "stack of --state-dir)")
    ev.add_argument("--state-dir", type=Path, default=None, help="state directory of `privrec up`")
    ev.add_argument("--no-listens", action="store_true",
                    help="do not send each logged item as an organic listen (POST /listen, after every feedback)")
    ev.add_argument("--no-baselines", action="store_true", help="skip the offline baselines on the same events")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.set_defaults(func=_events)


def resolve_http(explicit: str | None, state_dir: Path | None) -> str:
    """The API base URL: the flag, ``$PRIVREC_HTTP_URL``, or the ``http`` entry of ``privrec status``."""
    if explicit:
        return explicit
    if os.environ.get("PRIVREC_HTTP_URL"):
        return os.environ["PRIVREC_HTTP_URL"]
    from privrec.ops import status

    sd = state_dir or Path(os.environ.get("PRIVREC_STATE_DIR", ".privrec"))
    st = status(sd, probe=False)
    if st.get("http") and "web" in st.get("processes", {}):
        return str(st["http"])
    raise ValueError(f"no API URL: pass --http, set PRIVREC_HTTP_URL, or start the stack with `privrec up` "
                     f"(no running HTTP server recorded in {sd})")


def _check_catalog(base: str) -> None:
    """Refuse early, with the fix, when the stack does not serve LastFM."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/users?limit=1", timeout=10) as resp:
            catalog = json.loads(resp.read()).get("catalog")
    except (urllib.error.URLError, OSError) as exc:
        raise ValueError(f"cannot reach the API at {base}: {exc}") from None
    if catalog != "lastfm":
        raise ValueError(f"the stack at {base} serves the {catalog!r} catalog; LastFM replay needs a stack "
                         f"started with `privrec up --catalog lastfm`")


def _lastfm(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from producers.lastfm import load_catalog
    from producers.replay import ReplayEvent, replay

    if args.events < 1:
        raise ValueError(f"`--events` must be positive, got {args.events}.")
    if args.start < 0:
        raise ValueError(f"`--start` must be non-negative, got {args.start}.")
    base = resolve_http(args.http, args.state_dir)
    _check_catalog(base)
    catalog = load_catalog(args.data_dir, progress=not args.no_progress)
    n = min(args.events, catalog.n_events - args.start)
    features = catalog.feature_matrix  # public: a device with codewords reports the listened artist's codeword
    events = (ReplayEvent(e.user, e.arm, e.pool, tuple(float(v) for v in features[catalog.artist_index[str(e.arm)]]))
              for e in catalog.events(limit=n, start=args.start))
    bar = tqdm(total=n, desc="replay lastfm", unit="ev", disable=args.no_progress, dynamic_ncols=True)

    def progress(done: int, res: Any) -> None:
        bar.update(1)
        if done % 100 == 0:
            bar.set_postfix(ratio=f"{res.ratio:.2f}", model=res.last_model_version)

    info = _api_info(base)
    rate = _rate(args.rate, info)
    devices = _devices(base, args.mode, args.devices)
    result = replay(base, events, total=n, rate=rate, concurrency=args.concurrency, progress=progress,
                    listens=not args.no_listens, devices=devices)
    bar.close()
    info = _api_info(base)
    baselines = {} if args.no_baselines else _baselines(_lastfm_events(args, n), n, info, every=max(1, n // 200))
    return _finish(args.out, result, info, baselines, {}, {
        "http": base, "events_requested": args.events, "start": args.start, "rate": rate, "rate_setting": args.rate,
        "concurrency": args.concurrency, "k": 1, "pool_size": 25,
        "positives": catalog.params.positives, "catalog_seed": catalog.params.seed,
        "protocol": "recommend the top item of each logged event's pool; reward 1 iff it is the "
                    "logged artist; random play's expected reward is 1/len(pool) per event"})


def _finish(out: Path, result: Any, info: dict[str, Any], baselines: dict[str, Any], extra: dict[str, Any],
            settings: dict[str, Any]) -> int:
    """Write ``replay.json`` and ``replay.png`` to ``out`` and print the summary (both replays)."""
    from producers.replay import summary

    doc = {**summary(result), **extra, "settings": settings,
           "model": info.get("model"), "privacy": info.get("privacy"),
           "curve": [{"events": e, "reward": r, "random_reward": rr} for e, r, rr in result.cumulative],
           **_baseline_fields(baselines, result.random_reward),
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_text(json.dumps(doc, indent=2) + "\n")
    _plot(doc, out / "replay.png")
    print(f"events {result.events}  reward {result.reward:.0f}  random {result.random_reward:.1f}  "
          f"ratio {result.ratio:.2f}  ({result.seconds:.0f} s, model v{result.first_model_version}"
          f"→v{result.last_model_version}; versions per 1,000 events {result.versions_per_1000()})")
    if baselines:
        print("  on the same events, offline: " + ", ".join(
            f"{name} {b['reward'] / result.random_reward:.2f}" for name, b in baselines.items()))
    print(f"wrote {out}/replay.json and replay.png", file=sys.stderr)
    return 0


def _events(args: argparse.Namespace) -> int:
    """``privrec replay events FILE``: LastFM's protocol on any events.csv (see producers.catalog.replay_pools)."""
    import numpy as np
    from tqdm import tqdm

    from pipeline.data.catalog_open import OpenCatalog
    from privrec.experiments.lastfm import LastFMEvents
    from producers.catalog import build_catalog, read_events
    from producers.catalog.replay_pools import replay_plan
    from producers.replay import ReplayEvent, replay

    if args.events is not None and args.events < 1:
        raise ValueError(f"`--events` must be positive, got {args.events}.")
    base = resolve_http(args.http, args.state_dir)
    info = _api_info(base)
    deadline = time.monotonic() + 120
    while not info.get("model") and time.monotonic() < deadline:  # no release yet: /budget answers 503
        time.sleep(0.5)
        info = _api_info(base)
    model = info.get("model") or {}
    served = str(model.get("catalog") or "")
    if args.catalog is None and served in ("synthetic", "lastfm"):
        raise ValueError(f"the stack at {base} serves the {served!r} catalog; replaying an events file needs a "
                         f"stack started with `privrec up --catalog DIR` (or pass --catalog)")
    root = args.catalog or (Path(served) if served and Path(served).is_dir() else args.file.parent)
    built = build_catalog(root, d=int(model.get("d") or 25), units=int(model.get("units") or 100))
    plan = replay_plan(read_events(args.file), built.item_ids, pool=args.pool, seed=args.seed)
    events = plan.events[:args.events] if args.events is not None else plan.events
    if plan.first_unknown is not None:
        line, item = plan.first_unknown
        print(f"skipped {plan.skipped_unknown_item} events naming an item outside the catalog (first: "
              f"{args.file.name} line {line}, item {item!r})", file=sys.stderr)
    n = len(events)
    if n == 0:
        raise ValueError(f"{args.file}: no logged positive names an item of the catalog {root}")
    bar = tqdm(total=n, desc="replay events", unit="ev", disable=args.no_progress, dynamic_ncols=True)

    def progress(done: int, res: Any) -> None:
        bar.update(1)
        if done % 100 == 0:
            bar.set_postfix(ratio=f"{res.ratio:.2f}", model=res.last_model_version)

    rate = _rate(args.rate, info)
    result = replay(base, (ReplayEvent(e.user, e.item, e.pool) for e in events), total=n, rate=rate,
                    concurrency=args.concurrency, progress=progress, listens=not args.no_listens)
    bar.close()
    info = _api_info(base)
    baselines: dict[str, Any] = {}
    if not args.no_baselines:
        cat = OpenCatalog(built)
        rows = {a: i for i, a in enumerate(built.item_ids)}
        offline = LastFMEvents(np.array([cat.unit_of(e.user) for e in events], dtype=np.int64),
                               np.array([[rows[a] for a in e.pool] for e in events], dtype=np.int64),
                               np.array([e.slot for e in events], dtype=np.int64), built.features, built.W,
                               cat.n_units)
        baselines = _baselines(offline, n, info, every=max(1, n // 200))
    return _finish(args.out, result, info, baselines, {"source": "events"}, {
        "http": base, "file": str(args.file.resolve()), "catalog": str(Path(root).resolve()),
        "events_requested": args.events, "rate": rate, "rate_setting": args.rate,
        "concurrency": args.concurrency, "k": 1, "pool_size": args.pool, "pool_seed": args.seed,
        "skipped_unknown_item": plan.skipped_unknown_item, "skipped_not_positive": plan.skipped_not_positive,
        "protocol": "each logged positive in time order: a pool of the logged item and others drawn by the public "
                    "seed; recommend the top item; reward 1 iff it is the logged item; random play's expected "
                    "reward is 1/len(pool) per event"})


#: ``--rate auto``: events per release tick, so that each release covers about this many new events.
EVENTS_PER_TICK = 100


def _rate(text: str, info: dict[str, Any]) -> float | None:
    """``--rate``: a positive number, ``max`` (None: unthrottled) or ``auto`` (EVENTS_PER_TICK per release tick)."""
    if text == "max":
        return None
    if text == "auto":
        tick = float((info.get("model") or {}).get("tick_seconds") or 1.0)
        return EVENTS_PER_TICK / tick
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"`--rate` must be a number of events/s, 'auto' or 'max', got {text!r}.") from None
    if not (rate > 0 and rate != float("inf")):
        raise ValueError(f"`--rate` must be positive, got {text!r}.")
    return rate


def _devices(base: str, mode: str, state_dir: Path | None) -> Any:
    """Local mode: the simulated users' devices, calibrated from ``GET /local/config`` (``None`` otherwise)."""
    import urllib.request

    from producers.devices import Devices, config_from_public

    with urllib.request.urlopen(f"{base}/local/config", timeout=10) as resp:
        public = json.loads(resp.read())
    running = public.get("mode", "global")
    if mode == "auto":
        mode = "local" if running == "local" else "global"
    if mode != ("local" if running == "local" else "global"):
        raise ValueError(f"--mode {mode}: the stack at {base} runs in {running} mode (privrec up --mode {mode})")
    return Devices(config_from_public(public), state_dir, esa=public.get("esa"),
                   codebook=public.get("codebook")) if mode == "local" else None


def _lastfm_events(args: argparse.Namespace, n: int) -> Any:
    from privrec.experiments.lastfm import load_events

    return load_events(n, args.data_dir, args.start)


def _baselines(ev: Any, n: int, info: dict[str, Any], every: int) -> dict[str, Any]:
    """The data-free prior, online popularity (global, per unit) and private popularity on the same events, offline.

    ``ev`` is a :class:`privrec.experiments.lastfm.LastFMEvents` (units, pools, logged slots, features, ``W``).
    """
    import math

    import numpy as np

    from models.policies import OnlinePopularity, make_popularity_policy
    from models.policies.hierarchy import PriorScorer
    from privrec.experiments.lastfm import replay_offline

    priv = info.get("privacy") or {}
    eps = float(priv["epsilon"]) if priv.get("private") and priv.get("epsilon") is not None else math.inf
    delta = float(priv.get("delta") or 1e-5)
    k = ev.features.shape[0]
    policies = {
        "prior": PriorScorer(ev.features, seed=0),  # the data-free scorer (the hierarchy's model before any data)
        "popularity": OnlinePopularity(k, seed=0),
        "popularity_cluster": OnlinePopularity(k, n_units=ev.n_units, per_unit=True, seed=0),
        "private_popularity": make_popularity_policy(None, d=ev.features.shape[1], W=np.eye(ev.n_units), n_items=k,
                                                     epsilon=eps, delta=min(delta, 0.5), item_tick=100,
                                                     horizon=16383 * 100, item_horizon=16383, seed=0),
    }
    out: dict[str, Any] = {}
    for name, pol in policies.items():
        curve: list[tuple[int, float]] = []
        reward = replay_offline(pol, ev, n, curve, every)
        out[name] = {"reward": reward, "curve": curve}
    out["private_popularity"]["epsilon"] = eps
    return out


def _baseline_fields(baselines: dict[str, Any], random_reward: float) -> dict[str, Any]:
    if not baselines:
        return {}
    out: dict[str, Any] = {}
    for name, b in baselines.items():
        out[f"{name}_reward"] = b["reward"]
        out[f"{name}_ratio"] = b["reward"] / random_reward if random_reward else None
    out["baselines"] = {"protocol": "offline, on the same events and pools, with the same models code: the prior "
                                    "ranks by x . (the catalog's mean context), with no data (the best data-free "
                                    "scorer on LastFM); online popularity counts every logged positive so far "
                                    "(global, or per friend-graph cluster); private popularity ranks the item sums "
                                    "released through blt-exact at the stack's epsilon",
                        "curves": {name: [{"events": e, "reward": r} for e, r in b["curve"]]
                                   for name, b in baselines.items()},
                        "private_popularity_epsilon": baselines["private_popularity"].get("epsilon")}
    return out


def _api_info(base: str) -> dict[str, Any]:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/budget", timeout=10) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except OSError:
        return {}


def _plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [c["events"] for c in doc["curve"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    model = doc.get("model") or {}
    priv = doc.get("privacy") or {}
    eps = priv.get("epsilon")
    label = f"{model.get('algorithm', '?')} (ε={f'{float(eps):.3g}' if priv.get('private') and eps is not None else '∞'})"
    ax.plot(xs, [c["reward"] for c in doc["curve"]], label=label)
    ax.plot(xs, [c["random_reward"] for c in doc["curve"]], "k--", label="random (expected)")
    styles = {"prior": ("tab:orange", "--", "the data-free prior (no data)"),
              "popularity": ("k", "-.", "online popularity (non-private)"),
              "popularity_cluster": ("0.5", "-.", "popularity per cluster (non-private)"),
              "private_popularity": ("tab:green", ":", "private popularity (same ε)")}
    for name, curve in (doc.get("baselines") or {}).get("curves", {}).items():
        color, ls, text = styles.get(name, ("0.3", ":", name))
        ax.plot([c["events"] for c in curve], [c["reward"] for c in curve], color=color, ls=ls, label=text)
    ax.set_xlabel("replayed events")
    ax.set_ylabel("cumulative reward")
    ax.set_title(f"{'LastFM' if doc.get('source') != 'events' else 'Event log'} replay: reward ratio to random = {doc['ratio']:.2f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
