"""How much a public prior mean of theta lifts local mode on LastFM, and how much of it is learning.

``python -m privrec.experiments.prior_probe [--strengths 0,1000,10000] [--events 5000] [--heldout 40000]
[--seeds 11,12,13] [--out DIR]`` replays LastFM events as ``privrec experiment modes`` does
(:func:`privrec.experiments.modes.lastfm_reward`: one item picked of each event's pool of 25; ratio = reward /
(events / 25)) with the live codeword model of local mode (:class:`models.local.policy.LocalItemUCB`: listens as
codewords of a 64-word public codebook through a blanket, population-wide shuffled batches of 150 distinct users,
user level, cap 2, central epsilon 2, delta 1e-5; the settings of docs/local-protocol.md) and the serving solve's public
prior (:func:`models.streaming.solve.public_prior`, worth ``strength`` pseudo-observations), beside

* the non-private twin of the same model (exact listens, no batch, no cap) with the same prior, and
* the prior alone (score ``x . theta_0``: no data at all).

It runs on two slices: ``--heldout`` (events ``[heldout, heldout + events)``, where the strength is chosen) and the
first ``events`` (where ``privrec experiment modes`` and the live replay measure). One JSON line per (slice, model,
strength); ``--out`` also writes ``prior_probe.json``. Findings: docs/public-prior.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from models.local.items import codebook
from models.local.policy import LocalItemUCB
from models.streaming.solve import public_prior

__all__ = ["run", "slice_events", "main"]

#: The live codeword model's settings (docs/local-protocol.md).
BATCH, CAP, CODEWORDS, EPSILON, DELTA = 150, 2, 64, 2.0, 1e-5


def slice_events(lf: dict[str, Any], start: int, n: int) -> dict[str, Any]:
    """The LastFM arrays ``lf`` (:func:`privrec.experiments.modes._lastfm_arrays`) restricted to events
    ``[start, start + n)``.

    >>> lf = {"units": np.arange(5), "users": np.arange(5), "pools": np.arange(5), "correct": np.arange(5), "d": 2}
    >>> slice_events(lf, 3, 10)["units"].tolist(), slice_events(lf, 3, 10)["d"]
    ([3, 4], 2)
    """
    out = dict(lf)
    for key in ("units", "users", "pools", "correct"):
        out[key] = lf[key][start:start + n]
    out["events"] = len(out["units"])
    return out


def run(lf: dict[str, Any], *, strength: float, private: bool, seed: int, codewords: np.ndarray) -> float:
    """One replay's ratio to random play: the live codeword model (or its non-private twin) with the prior."""
    from .modes import lastfm_reward

    prior = public_prior(lf["features"], 1.0 / lf["pool_size"])
    pol = LocalItemUCB(d=lf["d"], n_items=len(lf["features"]), epsilon=EPSILON, batch=BATCH, cap=CAP, seed=seed,
                       delta=DELTA, share=0.0, lambda_=1.0, alpha=0.3, noise_ridge=0.0, tick=100, private=private,
                       codewords=codewords, prior=prior, prior_strength=strength)
    reward = lastfm_reward(pol, lf["units"], lf["pools"], lf["features"], lf["correct"], lf["users"])
    return float(reward / (len(lf["units"]) / lf["pool_size"]))


def prior_alone(lf: dict[str, Any]) -> float:
    """The ratio of scoring every pool by ``x . theta_0`` (no data): the pool's top item under the prior."""
    theta0 = public_prior(lf["features"], 1.0 / lf["pool_size"])
    picks = np.argmax(lf["features"][lf["pools"]] @ theta0, axis=1)
    return float(np.sum(picks == lf["correct"]) / (len(lf["units"]) / lf["pool_size"]))


def main(argv: list[str] | None = None) -> None:
    """Run the probe and print one JSON line per (slice, model, strength)."""
    from .modes import _lastfm_arrays

    p = argparse.ArgumentParser(prog="python -m privrec.experiments.prior_probe", description=__doc__.split("\n")[0])
    p.add_argument("--strengths", default="0,1000,3000,10000,30000,100000")
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--heldout", type=int, default=40000, help="first event of the held-out slice")
    p.add_argument("--seeds", default="11,12,13")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="directory for prior_probe.json")
    args = p.parse_args(argv)
    try:
        strengths = [float(s) for s in args.strengths.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--strengths and --seeds: comma-separated numbers, got {args.strengths!r} and {args.seeds!r}")
    if any(not (s >= 0 and np.isfinite(s)) for s in strengths) or args.events < 1 or args.heldout < 0:
        p.error("--strengths must be non-negative, --events positive and --heldout non-negative")
    lf = _lastfm_arrays(args.heldout + args.events, args.data_dir)
    cw = codebook(lf["features"], CODEWORDS, seed=0)
    rows = []
    for name, start in (("heldout", args.heldout), ("first", 0)):
        part = slice_events(lf, start, args.events)
        rows.append({"slice": name, "start": start, "events": part["events"], "model": "prior alone",
                     "ratio_mean": round(prior_alone(part), 3)})
        print(json.dumps(rows[-1]), flush=True)
        for private in (True, False):
            for strength in strengths:
                t0 = time.perf_counter()
                rs = [run(part, strength=strength, private=private, seed=s, codewords=cw) for s in (seeds if private else seeds[:1])]
                rows.append({"slice": name, "start": start, "events": part["events"],
                             "model": "local codewords" if private else "non-private twin", "strength": strength,
                             "ratio_mean": round(float(np.mean(rs)), 3),
                             "ratio_sd": round(float(np.std(rs, ddof=1)), 3) if len(rs) > 1 else 0.0,
                             "ratios": [round(r, 3) for r in rs], "seconds": round(time.perf_counter() - t0, 1)})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "prior_probe.json"), "w") as fh:
            json.dump({"settings": {"batch": BATCH, "cap": CAP, "codewords": CODEWORDS, "epsilon": EPSILON,
                                    "delta": DELTA, "seeds": seeds}, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
