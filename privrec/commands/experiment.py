"""``privrec experiment``: offline reproductions of the papers' experiments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _alpha(value: str) -> float | str:
    if value == "theory":
        return value
    try:
        a = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'theory', got {value!r}") from None
    if a < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return a


def register(sub: Any) -> None:
    p = sub.add_parser("experiment", help="run an offline experiment and write JSON, Markdown and plots")
    esub = p.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)

    from models.mechanisms import MECHANISMS

    from privrec.experiments.table1 import PRESETS

    t = esub.add_parser(
        "table1",
        help="Table 1 / Fig. 1a of the collaborative paper (regret vs epsilon, synthetic data)",
        description="Reproduce Table 1 of Wang et al. (RecSys 2020): five private and three non-private "
                    "algorithms plus random play, paired over seeded runs. Writes table1.json, table1.md, "
                    "table1.png and curves.png to --out.",
    )
    t.add_argument("--out", type=Path, required=True, help="output directory")
    t.add_argument("--preset", choices=sorted(PRESETS), default="paper",
                   help="paper: d=25, lambda=0.1; d5: d=5, lambda=1; uniform: near-uniform W, lambda=1")
    t.add_argument("--runs", type=int, default=None, help="seeded runs (default 5; --quick: 2)")
    t.add_argument("--horizon", type=int, default=None, help="interactions per run (default 10000; --quick: 3000)")
    t.add_argument("--seed", type=int, default=0, help="seed of run 0 (run r uses seed+r)")
    t.add_argument("--alpha", type=_alpha, default=0.3, help="constant width, or 'theory' (default 0.3)")
    t.add_argument("--tick", type=int, default=1, help="release every TICK interactions (default 1)")
    t.add_argument("--mechanism", choices=sorted(MECHANISMS), default="paper",
                   help="continual-release mechanism (default: the paper's Laplace tree)")
    t.add_argument("--delta", type=float, default=1e-5, help="delta of Gaussian mechanisms (default 1e-5)")
    t.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    t.add_argument("--quick", action="store_true", help="a small grid (2 runs x 3000 interactions), under two minutes")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=_table1)

    from privrec.experiments.mechanisms import ROWS

    m = esub.add_parser(
        "mechanisms",
        help="continual-release mechanisms side by side: the papers' tree, S&S, DGS and better mechanisms",
        description="Run DP-LinUCB and DP-CoLin with every mechanism of models.mechanisms worth comparing, plus "
                    "Shariff & Sheffet's and DGS's private LinUCB, on the paper's synthetic setting with the same "
                    "environments and seeds; release ticks of the '+tick' rows are tuned on held-out seeds first. "
                    "Writes mechanisms.json, mechanisms.md and mechanisms.png to --out.",
    )
    m.add_argument("--out", type=Path, required=True, help="output directory")
    m.add_argument("--runs", type=int, default=None, help="seeded runs (default 5; --quick: 2)")
    m.add_argument("--horizon", type=int, default=None, help="interactions per run (default 100000; --quick: 4000)")
    m.add_argument("--seed", type=int, default=0, help="seed of run 0 (run r uses seed+r)")
    m.add_argument("--delta", type=float, default=1e-5, help="delta of Gaussian mechanisms (default 1e-5)")
    m.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    m.add_argument("--no-tune", action="store_true",
                   help="skip tick tuning; '+tick' rows use --tick (default: 5%% of the horizon)")
    m.add_argument("--tick", type=int, default=None, help="tick of the '+tick' rows with --no-tune")
    m.add_argument("--tune-runs", type=int, default=None, help="held-out tuning runs (default 2; --quick: 1)")
    m.add_argument("--tune-seed", type=int, default=1000, help="seed of tuning run 0 (default 1000)")
    m.add_argument("--rows", default=None,
                   help="comma-separated subset of rows (default all): " + ", ".join(r.name for r in ROWS))
    m.add_argument("--quick", action="store_true", help="a small grid (2 runs x 4000 interactions), a few minutes")
    m.add_argument("--no-progress", action="store_true", help="no progress bar")
    m.set_defaults(func=_mechanisms)

    from privrec.experiments.lastfm import ROWS as LASTFM_ROWS

    lf = esub.add_parser(
        "lastfm",
        help="the LastFM replay offline: every model against popularity (seeded, several runs)",
        description="Replay the first LastFM events offline with the same models code as the pipeline: random play, "
                    "online popularity (global and per cluster), privately released popularity, and LinUCB, CoLin, "
                    "GOB.Lin alone and with the item term, non-private and at each epsilon, mean and sd over seeded "
                    "runs. Writes lastfm.json, lastfm.md and lastfm.png to --out.",
    )
    lf.add_argument("--out", type=Path, required=True, help="output directory")
    lf.add_argument("--events", default=None, help="comma-separated event counts (default 5000,20000; --quick: 2000)")
    lf.add_argument("--epsilons", default=None, help="comma-separated epsilons (default 1,2,5)")
    lf.add_argument("--runs", type=int, default=None, help="seeded runs (default 5; --quick: 2)")
    lf.add_argument("--rows", default=None,
                    help="comma-separated subset of rows (default all): " + ", ".join(r.name for r in LASTFM_ROWS))
    lf.add_argument("--weight", type=float, default=None, help="weight of the item term (default 1)")
    lf.add_argument("--listen-weight", type=float, default=None,
                    help="weight of an organic listen in the bandit, in [0, 1] (default: 0.2 non-private, 1 private)")
    lf.add_argument("--start", type=int, default=0,
                    help="first event (default 0, the replay's; a later window is a held-out set for tuning)")
    lf.add_argument("--share", type=float, default=None,
                    help="the bandit's share of the budget (of mu**2; default 0.5); the item sums get the rest")
    lf.add_argument("--data-dir", default=None, help="LastFM data directory (default: PRIVREC_DATA_DIR or ../shared/data/lastfm-2k)")
    lf.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    lf.add_argument("--quick", action="store_true", help="2 runs x 2,000 events, LinUCB rows only (about a minute)")
    lf.add_argument("--no-progress", action="store_true", help="no progress bar")
    lf.set_defaults(func=_lastfm)

    from privrec.experiments.modes import ROWS as MODE_ROWS

    o = esub.add_parser(
        "modes",
        help="the trust modes side by side: regret against epsilon, LastFM reward ratio, communication",
        description="Run LinUCB per unit under each trust mode (global, federated star and ring, local per-user "
                    "tree, local per-round, local + shuffling) with the default mechanism on the synthetic "
                    "environment (regret against epsilon) and on the first LastFM replay events (reward ratio to "
                    "random play, offline), same seeds; and the local mode's added regret against the global "
                    "mode's as the users grow. Federated rows report bytes per site per release tick. Writes "
                    "modes.json, modes.md and modes.png to --out.",
    )
    o.add_argument("--out", type=Path, required=True, help="output directory")
    o.add_argument("--runs", type=int, default=None, help="seeded synthetic runs (default 5; --quick: 2)")
    o.add_argument("--horizon", type=int, default=None, help="synthetic interactions per run (default 50000; --quick: 10000)")
    o.add_argument("--tick", type=int, default=None, help="synthetic interactions per release (default 2000; --quick: 500)")
    o.add_argument("--lastfm-events", type=int, default=None, help="LastFM events (default 5000; --quick: 2000)")
    o.add_argument("--lastfm-runs", type=int, default=None, help="LastFM noise seeds (default 3; --quick: 1)")
    o.add_argument("--no-lastfm", action="store_true", help="skip the LastFM part (no data needed)")
    o.add_argument("--data-dir", default=None, help="LastFM data directory (default: PRIVREC_DATA_DIR or ../shared/data/lastfm-2k)")
    o.add_argument("--sites", type=int, default=4, help="federated sites M (default 4)")
    o.add_argument("--shuffle-batch", type=int, default=200,
                   help="local-shuffled-vectors: distinct users of a unit per shuffled batch (default 200)")
    o.add_argument("--local-unit", choices=("user", "event"), default="user",
                   help="local rows: each device's privacy unit (default user: at most --user-cap reports per epoch, "
                        "noise calibrated to them, a lifetime budget of 10; event: each interaction alone)")
    o.add_argument("--user-cap", type=int, default=8, help="local rows at user level: reports per epoch; "
                                                           "federated-sites-user: release ticks per user and epoch "
                                                           "(default 8)")
    o.add_argument("--scaling-users", default="10,40,160",
                   help="comma-separated user counts for local vs global as N grows ('' to skip; default 10,40,160)")
    o.add_argument("--population", default=None,
                   help="comma-separated population sizes for the population axis ('' to skip; default "
                        "1000,10000,100000; --quick: 1000)")
    o.add_argument("--seed", type=int, default=0, help="seed of synthetic run 0 (run r uses seed+r)")
    o.add_argument("--rows", default=None,
                   help="comma-separated subset of modes (default all): " + ", ".join(r.name for r in MODE_ROWS))
    o.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    o.add_argument("--quick", action="store_true", help="a small grid, under five minutes")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.set_defaults(func=_modes)

    fg = esub.add_parser(
        "fullgraph", help="CoLin over every LastFM user (sparse relation matrix, CG) against 100 clusters",
        description="The replay's protocol offline on the first LastFM events: CoLin over the 100 friend-graph "
                    "clusters (dense solve) and over every user with the friend graph as a sparse relation "
                    "matrix (matrix-free CG), non-private and at each epsilon, same seeds. Writes fullgraph.json "
                    "and fullgraph.md to --out.")
    fg.add_argument("--out", type=Path, required=True, help="output directory")
    fg.add_argument("--events", type=int, default=5000, help="LastFM events (default 5000)")
    fg.add_argument("--runs", type=int, default=3, help="seeded runs (default 3)")
    fg.add_argument("--epsilons", default="2", help="comma-separated epsilons (default 2)")
    fg.add_argument("--data-dir", default=None, help="LastFM data directory (default: PRIVREC_DATA_DIR or ../shared/data/lastfm-2k)")
    fg.set_defaults(func=_fullgraph)

    fr = esub.add_parser(
        "frontier", help="what privacy costs the default model: share of the non-private gain per epsilon, mode and "
                         "population",
        description="Run the default (hierarchical) model at user-level epsilon 0.5, 1, 2, 4, 8 and inf under the "
                    "global, federated and local modes on the LastFM replay, an optional catalog directory, a "
                    "generated tagged catalog and the synthetic population at several sizes; report each cell's "
                    "reward ratio to random play, the share of the non-private gain kept (against the best "
                    "data-free scorer), private and online popularity on the same events, and whether the cell "
                    "clears its floor. Evaluation only: nothing is tuned. Writes frontier.json, frontier.md and "
                    "frontier.png to --out (and the generated catalog under it).",
    )
    fr.add_argument("--out", type=Path, required=True, help="output directory")
    fr.add_argument("--epsilons", default=None,
                    help="comma-separated user-level epsilons, 'inf' for non-private (default 0.5,1,2,4,8,inf; "
                         "--quick: 1,2,inf)")
    fr.add_argument("--modes", default=None, help="comma-separated subset of global,federated,local (default all)")
    fr.add_argument("--seeds", type=int, default=None, help="seeds per cell: noise keys and tie-breaking (default 3; "
                                                            "--quick: 1)")
    fr.add_argument("--sizes", default=None,
                    help="comma-separated population sizes ('' for none; default 10000,100000,1000000; --quick: "
                         "10000); the largest run last")
    fr.add_argument("--lastfm-events", type=int, default=None,
                    help="LastFM evaluation window length (default 20000; --quick: 5000)")
    fr.add_argument("--lastfm-start", type=int, default=0, help="first LastFM event of the window (default 0)")
    fr.add_argument("--no-lastfm", action="store_true", help="skip LastFM (no data needed)")
    fr.add_argument("--data-dir", default=None, help="LastFM data directory (default: PRIVREC_DATA_DIR or ../shared/data/lastfm-2k)")
    fr.add_argument("--catalog", default=None, help="also a catalog directory with an events.csv (replayed as "
                                                    "privrec replay events does)")
    fr.add_argument("--catalog-events", type=int, default=None, help="the catalog's first N positives (default all)")
    fr.add_argument("--no-tagged", action="store_true", help="skip the generated tagged catalog")
    fr.add_argument("--tagged-events", type=int, default=None, help="the tagged catalog's window (default 5000)")
    fr.add_argument("--tagged-catalog", default=None, metavar="ITEMS,USERS,EVENTS",
                    help="size of the generated tagged catalog (default 2000,2000,20000)")
    fr.add_argument("--tagged-seed", type=int, default=0,
                    help="public seed of the generated tagged catalog (default 0, the evaluation catalog; the "
                         "defaults were chosen on seed 1)")
    fr.add_argument("--population-seed", type=int, default=0,
                    help="public seed of the synthetic population's draws (default 0, the evaluation population; "
                         "the defaults were chosen on seed 1)")
    fr.add_argument("--sites", type=int, default=4, help="federated sites (default 4)")
    fr.add_argument("--local-batch", type=int, default=None,
                    help="local mode: distinct users per shuffled batch, on every population (default 150; grown to the "
                         "smallest the blanket can calibrate at the cell's epsilon)")
    fr.add_argument("--seed", type=int, default=0, help="seed the runs' noise keys derive from (default 0)")
    fr.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    fr.add_argument("--quick", action="store_true", help="epsilon 1, 2, inf; LastFM 5,000 events; tagged; the 10k "
                                                         "population; one seed (a few minutes)")
    fr.add_argument("--no-progress", action="store_true", help="no progress bar")
    fr.set_defaults(func=_frontier)

    u = esub.add_parser(
        "userlevel",
        help="utility at user level: LastFM reward ratio and synthetic regret against the user-level epsilon",
        description="Run the offline twin of privacy_unit=user (each user's events of a tick summed and clipped, "
                    "at most CAP ticks per user and epoch, noise calibrated so that a capped user's epoch is "
                    "(epsilon, delta)-DP) on the first LastFM replay events and on the synthetic environment, with "
                    "the cap tuned per epsilon on held-out data first. Writes userlevel.json, userlevel.md and "
                    "userlevel.png to --out.",
    )
    u.add_argument("--out", type=Path, required=True, help="output directory")
    u.add_argument("--epsilons", default=None, help="comma-separated user-level epsilons (default 1,2,4,8)")
    u.add_argument("--caps", default=None, help="comma-separated LastFM caps to tune over (default 2,4,8,16)")
    u.add_argument("--lastfm-events", type=int, default=None, help="LastFM events (default 5000; --quick: 2000)")
    u.add_argument("--lastfm-runs", type=int, default=None, help="LastFM noise seeds (default 3; --quick: 1)")
    u.add_argument("--tick", type=int, default=None, help="LastFM events per release (default 100)")
    u.add_argument("--no-lastfm", action="store_true", help="skip the LastFM part (no data needed)")
    u.add_argument("--data-dir", default=None, help="LastFM data directory (default: PRIVREC_DATA_DIR or ../shared/data/lastfm-2k)")
    u.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    u.add_argument("--quick", action="store_true", help="a small grid (one seed, two caps), a few minutes")
    u.set_defaults(func=_userlevel)

    r = esub.add_parser(
        "relation",
        help="the add/remove relation against replace: the LastFM replay through the real ingest, release, solve "
             "and serving, the same events and noise keys",
        description="Replay LastFM events offline through the pipeline's own ingest processor, release stage, solve "
                    "stage and serving (a redis-server of its own, no Kafka or HTTP), once per epsilon, relation "
                    "(add-remove, replace) and noise seed, the namespace's secret seed set to the seed, so both "
                    "relations see the same events and noise keys. Writes relation.json and relation.md to --out.",
    )
    r.add_argument("--out", type=Path, required=True, help="output directory")
    r.add_argument("--events", type=int, default=5000, help="LastFM replay events (default 5000)")
    r.add_argument("--start", type=int, default=0, help="first event (default 0; e.g. 40000: a held-out window)")
    r.add_argument("--epsilons", default=None, help="comma-separated user-level epsilons, inf allowed "
                                                     "(default 1,2,4,8)")
    r.add_argument("--seeds", default=None, help="comma-separated noise seeds (default 1,2)")
    r.add_argument("--per-tick", type=int, default=100, help="events per release tick (default 100)")
    r.add_argument("--data-dir", default=None, help="LastFM data directory (default: PRIVREC_DATA_DIR or "
                                                    "../shared/data/lastfm-2k)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=_relation)


def _relation(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from privrec.experiments.relation import RelationConfig, run_relation

    kw: dict[str, Any] = {"data_dir": args.data_dir, "events": args.events, "start": args.start,
                          "per_tick": args.per_tick}
    if args.epsilons:
        kw["epsilons"] = _epsilons(args.epsilons)
    if args.seeds:
        kw["seeds"] = _numbers(args.seeds, "seeds", int)
    cfg = RelationConfig(**kw)
    bar = tqdm(total=len(cfg.epsilons) * len(cfg.relations) * len(cfg.seeds), desc="relation", unit="run",
               disable=args.no_progress, dynamic_ncols=True)
    doc = run_relation(cfg, args.out, progress=lambda done, total: bar.update(1))
    bar.close()
    print((args.out / "relation.md").read_text())
    print(f"wrote {args.out}/relation.json, relation.md ({doc['seconds']:.0f} s)", file=sys.stderr)
    return 0


def _table1(args: argparse.Namespace) -> int:
    from privrec.experiments.table1 import Table1Config, run_table1

    runs = args.runs if args.runs is not None else (2 if args.quick else 5)
    horizon = args.horizon if args.horizon is not None else (3000 if args.quick else 10_000)
    cfg = Table1Config(preset=args.preset, runs=runs, horizon=horizon, seed=args.seed, alpha=args.alpha,
                       tick=args.tick, mechanism=args.mechanism, delta=args.delta, jobs=args.jobs)
    doc = run_table1(cfg, args.out, progress=not args.no_progress)
    print((args.out / "table1.md").read_text())
    print(f"wrote {args.out}/table1.json, table1.md, table1.png, curves.png ({doc['seconds']:.0f} s)", file=sys.stderr)
    return 0


def _mechanisms(args: argparse.Namespace) -> int:
    from privrec.experiments.mechanisms import ROWS, MechanismsConfig, run_mechanisms

    runs = args.runs if args.runs is not None else (2 if args.quick else 5)
    horizon = args.horizon if args.horizon is not None else (4000 if args.quick else 100_000)
    tune_runs = args.tune_runs if args.tune_runs is not None else (1 if args.quick else 2)
    rows = tuple(r.strip() for r in args.rows.split(",")) if args.rows else tuple(r.name for r in ROWS)
    cfg = MechanismsConfig(runs=runs, horizon=horizon, seed=args.seed, delta=args.delta, jobs=args.jobs,
                           tune=not args.no_tune, tune_runs=tune_runs, tune_seed=args.tune_seed,
                           fixed_tick=args.tick, rows=rows)
    doc = run_mechanisms(cfg, args.out, progress=not args.no_progress)
    print((args.out / "mechanisms.md").read_text())
    print(f"wrote {args.out}/mechanisms.json, mechanisms.md, mechanisms.png ({doc['timings']['total_seconds']:.0f} s)",
          file=sys.stderr)
    return 0


def _fullgraph(args: argparse.Namespace) -> int:
    from privrec.experiments.fullgraph import run_fullgraph

    if args.events < 1 or args.runs < 1:
        raise ValueError("`--events` and `--runs` must be positive.")
    try:
        eps = tuple(float(e) for e in args.epsilons.split(",") if e.strip())
    except ValueError:
        raise ValueError(f"`--epsilons` must be comma-separated numbers, got {args.epsilons!r}.") from None
    if any(not e > 0 for e in eps):
        raise ValueError("`--epsilons` must be positive.")
    doc = run_fullgraph(args.out, events=args.events, runs=args.runs, epsilons=eps, data_dir=args.data_dir)
    print((args.out / "fullgraph.md").read_text())
    print(f"wrote {args.out}/fullgraph.json, fullgraph.md ({doc['seconds']:.0f} s)", file=sys.stderr)
    return 0


def _modes(args: argparse.Namespace) -> int:
    from privrec.experiments.modes import ModesConfig, run_modes

    kw: dict[str, Any] = {"sites": args.sites, "seed": args.seed, "data_dir": args.data_dir, "lastfm": not args.no_lastfm,
                          "shuffle_batch": args.shuffle_batch, "local_unit": args.local_unit, "user_cap": args.user_cap}
    if args.user_cap < 1:
        raise ValueError(f"`--user-cap` must be positive, got {args.user_cap}.")
    if args.shuffle_batch < 1:
        raise ValueError(f"`--shuffle-batch` must be positive, got {args.shuffle_batch}.")
    try:
        kw["scaling_users"] = tuple(int(v) for v in args.scaling_users.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"`--scaling-users` must be comma-separated integers, got {args.scaling_users!r}.") from None
    sizes = args.population if args.population is not None else ("1000" if args.quick else "1000,10000,100000")
    try:
        kw["population_sizes"] = tuple(int(v) for v in sizes.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"`--population` must be comma-separated integers, got {sizes!r}.") from None
    for name in ("runs", "horizon", "tick", "lastfm_events", "lastfm_runs"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"`--{name.replace('_', '-')}` must be positive, got {value}.")
            kw[name] = value
    if args.sites < 1:
        raise ValueError(f"`--sites` must be positive, got {args.sites}.")
    if args.rows:
        kw["rows"] = tuple(r.strip() for r in args.rows.split(","))
    cfg = ModesConfig.quick(**kw) if args.quick else ModesConfig(**kw)
    doc = run_modes(cfg, args.out, jobs=args.jobs, progress=not args.no_progress)
    print((args.out / "modes.md").read_text())
    print(f"wrote {args.out}/modes.json, modes.md, modes.png ({doc['seconds']:.0f} s)", file=sys.stderr)
    return 0


def _numbers(text: str, name: str, kind: type) -> tuple[Any, ...]:
    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"`--{name}` must be comma-separated numbers, got {text!r}.") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"`--{name}` must be positive numbers, got {text!r}.")
    return values


def _lastfm(args: argparse.Namespace) -> int:
    from privrec.experiments.lastfm import LastFMConfig, run_lastfm

    kw: dict[str, Any] = {"data_dir": args.data_dir, "start": args.start}
    if args.listen_weight is not None:
        if not 0 <= args.listen_weight <= 1:
            raise ValueError(f"`--listen-weight` must be in [0, 1], got {args.listen_weight}.")
        kw["listen_weight"] = args.listen_weight
    if args.events:
        kw["events"] = _numbers(args.events, "events", int)
    if args.epsilons:
        kw["epsilons"] = _numbers(args.epsilons, "epsilons", float)
    if args.runs is not None:
        if args.runs < 1:
            raise ValueError(f"`--runs` must be at least 1, got {args.runs}.")
        kw["runs"] = args.runs
    if args.rows:
        kw["rows"] = tuple(r.strip() for r in args.rows.split(","))
    if args.weight is not None:
        if not args.weight >= 0:
            raise ValueError(f"`--weight` must be non-negative, got {args.weight}.")
        kw["weight"] = args.weight
    if args.share is not None:
        if not 0 < args.share < 1:
            raise ValueError(f"`--share` must be in (0, 1), got {args.share}.")
        kw["share"] = args.share
    cfg = LastFMConfig.quick(**kw) if args.quick else LastFMConfig(**kw)
    doc = run_lastfm(cfg, args.out, jobs=args.jobs, progress=not args.no_progress)
    print((args.out / "lastfm.md").read_text())
    print(f"wrote {args.out}/lastfm.json, lastfm.md, lastfm.png ({doc['seconds']:.0f} s)", file=sys.stderr)
    return 0


def _userlevel(args: argparse.Namespace) -> int:
    from privrec.experiments.userlevel import UserLevelConfig, run_userlevel

    kw: dict[str, Any] = {"data_dir": args.data_dir, "lastfm": not args.no_lastfm}
    if args.epsilons:
        kw["epsilons"] = _numbers(args.epsilons, "epsilons", float)
    if args.caps:
        kw["caps"] = _numbers(args.caps, "caps", int)
    for name in ("lastfm_events", "lastfm_runs", "tick"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"`--{name.replace('_', '-')}` must be positive, got {value}.")
            kw[name] = value
    cfg = UserLevelConfig.quick(**kw) if args.quick else UserLevelConfig(**kw)
    doc = run_userlevel(cfg, args.out, jobs=args.jobs)
    print((args.out / "userlevel.md").read_text())
    print(f"wrote {args.out}/userlevel.json, userlevel.md, userlevel.png ({doc['seconds']:.0f} s)", file=sys.stderr)
    return 0


def _epsilons(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"`--epsilons` must be comma-separated numbers or 'inf', got {text!r}.") from None
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"`--epsilons` must be positive numbers or 'inf', got {text!r}.")
    return values


def _frontier(args: argparse.Namespace) -> int:
    from privrec.experiments.frontier import FrontierConfig, run_frontier

    kw: dict[str, Any] = {"data_dir": args.data_dir, "lastfm": not args.no_lastfm, "tagged": not args.no_tagged,
                          "lastfm_start": args.lastfm_start, "sites": args.sites, "seed": args.seed,
                          "catalog": args.catalog, "catalog_events": args.catalog_events,
                          "tagged_seed": args.tagged_seed, "population_seed": args.population_seed}
    for name in ("lastfm_start", "tagged_seed", "population_seed"):
        if getattr(args, name) < 0:
            raise ValueError(f"`--{name.replace('_', '-')}` must be non-negative, got {getattr(args, name)}.")
    if args.epsilons:
        kw["epsilons"] = _epsilons(args.epsilons)
    if args.modes:
        kw["modes"] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if args.sizes is not None:
        try:
            kw["sizes"] = tuple(int(v) for v in args.sizes.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"`--sizes` must be comma-separated integers, got {args.sizes!r}.") from None
    for name, key in (("seeds", "seeds"), ("lastfm_events", "lastfm_events"), ("tagged_events", "tagged_events"),
                      ("local_batch", "local_batch")):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"`--{name.replace('_', '-')}` must be positive, got {value}.")
            kw[key] = value
    if args.tagged_catalog:
        try:
            kw["tagged_items"], kw["tagged_users"], kw["tagged_log"] = (int(v) for v in args.tagged_catalog.split(","))
        except ValueError:
            raise ValueError(f"`--tagged-catalog` must be three comma-separated integers ITEMS,USERS,EVENTS, got "
                             f"{args.tagged_catalog!r}.") from None
    cfg = FrontierConfig.quick(**kw) if args.quick else FrontierConfig(**kw)
    doc = run_frontier(cfg, args.out, jobs=args.jobs, progress=not args.no_progress)
    print((args.out / "frontier.md").read_text())
    print(f"wrote {args.out}/frontier.json, frontier.md, frontier.png ({doc['seconds']:.0f} s)", file=sys.stderr)
    return 0
