"""``privrec bench noise``: the hardened (discrete) sampler's cost against today's float sampler, in one run.

Two measurements, float and discrete side by side, at d = 25 (one LinUCB unit) and d·N = 2,500 (CoLin over 100
LastFM clusters):

* ``sampler``: one keyed noise vector — :meth:`KeyedNoise.normal` (numpy's Philox + ziggurat) against
  :meth:`KeyedNoise.discrete_gaussian` (exact discrete Gaussian integers on a ``2**-30`` grid, CKS Alg. 1-3 on
  the same Philox words): µs per vector and draws per second;
* ``release``: one continual release (``step``) of ``gaussian-exact`` (binary tree: one node drawn per tick) and
  ``blt-exact`` (one vector per tick plus the buffers) built by ``make_mechanism(..., sampler=...)``.

Writes ``noise.json`` with the machine yardstick (``machine.python_speed_us``: ``sum(range(1000))``).
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

SIGMA = 9.35  # the tree's per-node sigma at epsilon = 2, delta = 1e-5, 16,383 ticks, Delta = 1


def _sampler_us(sampler: str, dim: int, reps: int) -> float:
    from models.ground.noise import KeyedNoise, default_grid

    src, gamma = KeyedNoise(seed=7, stream=1), default_grid(1.0)
    t0 = time.perf_counter()
    for i in range(reps):
        if sampler == "float":
            src.normal(SIGMA, (dim,), epoch=0, level=0, index=i)
        else:
            src.discrete_gaussian(SIGMA, (dim,), epoch=0, level=0, index=i, gamma=gamma)
    return (time.perf_counter() - t0) / reps * 1e6


def _release_us(name: str, sampler: str, dim: int, ticks: int) -> float:
    from models.mechanisms import make_mechanism

    m = make_mechanism(name, dim=dim, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=16383, seed=7,
                       sampler=sampler)  # type: ignore[arg-type]
    s = m.init_state()
    x = np.full(dim, 0.01)
    t0 = time.perf_counter()
    for _ in range(ticks):
        _, s, _ = m.step(s, x)
    return (time.perf_counter() - t0) / ticks * 1e6


def bench_noise(ticks: int = 200) -> dict[str, Any]:
    from privrec.experiments.runner import machine_info

    out: dict[str, Any] = {"machine": machine_info(), "ticks": ticks, "sigma": SIGMA, "grid": 2.0**-30,
                           "sampler": {}, "release": {}}
    for dim, n in ((25, ticks), (2500, max(3, ticks // 40))):
        f, d = _sampler_us("float", dim, n * 5), _sampler_us("discrete", dim, n)
        out["sampler"][str(dim)] = {"float_us": f, "discrete_us": d, "ratio": d / f,
                                    "float_draws_per_s": dim / f * 1e6, "discrete_draws_per_s": dim / d * 1e6}
        for name in ("gaussian-exact", "blt-exact"):
            fr, dr = _release_us(name, "float", dim, n * 5), _release_us(name, "discrete", dim, n)
            out["release"][f"{name}/{dim}"] = {"float_us": fr, "discrete_us": dr, "ratio": dr / fr}
    out["machine_after"] = machine_info()
    return out


def register(bsub: Any) -> None:
    p = bsub.add_parser("noise", help="the discrete Gaussian sampler's cost against the float sampler",
                        description="Time keyed noise vectors and mechanism releases with float Gaussian and with "
                                    "exact discrete Gaussian noise (d = 25 and 2,500); writes noise.json to --out.")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--ticks", type=int, default=200, help="timed discrete vectors/releases at d = 25 (default 200; "
                                                          "the float side runs 5x as many, d = 2,500 1/40 as many)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.ticks < 20:
        raise ValueError(f"`--ticks` must be at least 20, got {args.ticks}.")
    doc = bench_noise(args.ticks)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "noise.json").write_text(json.dumps(doc, indent=2) + "\n")
    for dim, r in doc["sampler"].items():
        print(f"noise vector d = {dim:>5}: float {r['float_us']:10.1f} µs ({r['float_draws_per_s']:12,.0f} draws/s), "
              f"discrete {r['discrete_us']:10.1f} µs ({r['discrete_draws_per_s']:10,.0f} draws/s), {r['ratio']:.0f}x")
    for key, r in doc["release"].items():
        print(f"release {key:>20}: float {r['float_us']:10.1f} µs, discrete {r['discrete_us']:10.1f} µs "
              f"({r['ratio']:.0f}x)")
    print(f"machine yardstick: sum(range(1000)) takes {doc['machine']['python_speed_us']:.1f} µs before, "
          f"{doc['machine_after']['python_speed_us']:.1f} µs after")
    print(f"wrote {args.out}/noise.json", file=sys.stderr)
    return 0
