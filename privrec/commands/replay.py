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
    lf.add_argument("--rate", type=float, default=None, help="at most RATE events/s (default: as fast as the API)")
    lf.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    lf.add_argument("--out", type=Path, required=True, help="output directory")
    lf.add_argument("--http", default=None, help="API base URL (default: $PRIVREC_HTTP_URL, or the running "
                                                 "stack of --state-dir)")
    lf.add_argument("--state-dir", type=Path, default=None, help="state directory of `privrec up`")
    lf.add_argument("--data-dir", default=None, help="LastFM data directory (default: $PRIVREC_DATA_DIR or "
                                                     "../shared/data/lastfm-2k)")
    lf.add_argument("--no-progress", action="store_true", help="no progress bar")
    lf.set_defaults(func=_lastfm)


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
    from producers.replay import ReplayEvent, replay, summary

    if args.events < 1:
        raise ValueError(f"`--events` must be positive, got {args.events}.")
    if args.start < 0:
        raise ValueError(f"`--start` must be non-negative, got {args.start}.")
    base = resolve_http(args.http, args.state_dir)
    _check_catalog(base)
    catalog = load_catalog(args.data_dir, progress=not args.no_progress)
    n = min(args.events, catalog.n_events - args.start)
    events = (ReplayEvent(e.user, e.arm, e.pool) for e in catalog.events(limit=n, start=args.start))
    bar = tqdm(total=n, desc="replay lastfm", unit="ev", disable=args.no_progress, dynamic_ncols=True)

    def progress(done: int, res: Any) -> None:
        bar.update(1)
        if done % 100 == 0:
            bar.set_postfix(ratio=f"{res.ratio:.2f}", model=res.last_model_version)

    result = replay(base, events, total=n, rate=args.rate, concurrency=args.concurrency, progress=progress)
    bar.close()
    info = _api_info(base)
    doc = {**summary(result),
           "settings": {"http": base, "events_requested": args.events, "start": args.start, "rate": args.rate,
                        "concurrency": args.concurrency, "k": 1, "pool_size": 25,
                        "positives": catalog.params.positives, "catalog_seed": catalog.params.seed,
                        "protocol": "recommend the top item of each logged event's pool; reward 1 iff it is the "
                                    "logged artist; random play's expected reward is 1/len(pool) per event"},
           "model": info.get("model"), "privacy": info.get("privacy"),
           "curve": [{"events": e, "reward": r, "random_reward": rr} for e, r, rr in result.cumulative],
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay.json").write_text(json.dumps(doc, indent=2) + "\n")
    _plot(doc, args.out / "replay.png")
    print(f"events {result.events}  reward {result.reward:.0f}  random {result.random_reward:.1f}  "
          f"ratio {result.ratio:.2f}  ({result.seconds:.0f} s, model v{result.first_model_version}"
          f"→v{result.last_model_version})")
    print(f"wrote {args.out}/replay.json and replay.png", file=sys.stderr)
    return 0


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
    label = f"{model.get('algorithm', '?')} (ε={priv.get('epsilon', 'inf') if priv.get('private') else '∞'})"
    ax.plot(xs, [c["reward"] for c in doc["curve"]], label=label)
    ax.plot(xs, [c["random_reward"] for c in doc["curve"]], "k--", label="random (expected)")
    ax.set_xlabel("replayed events")
    ax.set_ylabel("cumulative reward")
    ax.set_title(f"LastFM replay: reward ratio to random = {doc['ratio']:.2f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
