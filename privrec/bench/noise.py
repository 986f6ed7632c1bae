"""``privrec bench noise``: the hardened sampler's cost against today's, in one run.

Times one release of the binary tree (a new node's noise per tick, plus the sums) with float Gaussian noise
(``gaussian-zcdp``, numpy's Philox + Box–Muller/ziggurat) and with exact discrete Gaussian noise on the grid
(``discrete-zcdp``, integer arithmetic only), at d = 25 (one LinUCB unit) and d·N = 2,500 (CoLin over 100
LastFM clusters). Writes ``noise.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["bench_noise", "register"]


def _per_release_us(name: str, dim: int, ticks: int) -> float:
    from models.mechanisms import make_mechanism

    m = make_mechanism(name, dim=dim, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=16383, seed=7)
    s = m.init_state()
    prefix = np.zeros(dim)
    t0 = time.perf_counter()
    for _ in range(ticks):
        prefix = prefix + 0.01
        _, s, _ = m.step_to(s, prefix)
    return (time.perf_counter() - t0) / ticks * 1e6


def bench_noise(ticks: int = 200) -> dict[str, Any]:
    from privrec.experiments.runner import machine_info

    out: dict[str, Any] = {"machine": machine_info(), "ticks": ticks, "rows": {}}
    for dim, n in ((25, ticks), (2500, max(5, ticks // 20))):
        f = _per_release_us("gaussian-zcdp", dim, n)
        d = _per_release_us("discrete-zcdp", dim, n)
        out["rows"][str(dim)] = {"float_us": f, "discrete_us": d, "ratio": d / f}
    return out


def register(bsub: Any) -> None:
    p = bsub.add_parser("noise", help="the discrete Gaussian sampler's cost against the float sampler",
                        description="Time one tree release with float Gaussian and with exact discrete Gaussian "
                                    "noise (d = 25 and 2,500); writes noise.json to --out.")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--ticks", type=int, default=200, help="timed releases at d = 25 (default 200)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.ticks < 20:
        raise ValueError(f"`--ticks` must be at least 20, got {args.ticks}.")
    doc = bench_noise(args.ticks)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "noise.json").write_text(json.dumps(doc, indent=2) + "\n")
    for dim, r in doc["rows"].items():
        print(f"d = {dim:>5}: float {r['float_us']:10.1f} µs, discrete {r['discrete_us']:12.1f} µs per release "
              f"({r['ratio']:.0f}x)")
    print(f"machine yardstick: sum(range(1000)) takes {doc['machine']['python_speed_us']:.1f} µs")
    print(f"wrote {args.out}/noise.json", file=sys.stderr)
    return 0
