"""Shared engine for offline bandit simulations.

A *job* is one (run, algorithm, epsilon, ...) cell; jobs run in parallel
worker processes and return their cumulative-regret curve. Within a run
every algorithm sees the same environment (users, shown arms, reward noise),
so differences between algorithms are paired.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import platform
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from models.ground.environment import SyntheticEnvironment
from models.policies import KroneckerUCB, make_policy

__all__ = ["Job", "JobResult", "simulate", "run_jobs", "machine_info", "derive_seed", "summarize"]


@dataclass(frozen=True)
class Job:
    """One simulation cell."""

    run: int
    algorithm: str
    epsilon: float
    env: dict[str, Any]
    policy: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # row name in reports (defaults to the algorithm)
    checkpoints: int = 200

    @property
    def row(self) -> str:
        return self.label or self.algorithm


@dataclass
class JobResult:
    job: Job
    regret: float
    curve: list[float]
    seconds: float


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (independent of PYTHONHASHSEED)."""
    h = 0
    for p in parts:
        h = zlib.crc32(repr(p).encode(), h)
    return (h * 0x9E3779B97F4A7C15 + len(parts)) % (1 << 63)


_ENV_CACHE: dict[str, SyntheticEnvironment] = {}


def _environment(spec: dict[str, Any]) -> SyntheticEnvironment:
    key = repr(sorted(spec.items()))
    env = _ENV_CACHE.get(key)
    if env is None:
        _ENV_CACHE.clear()  # one environment at a time per worker keeps memory flat
        env = SyntheticEnvironment(**spec)
        _ENV_CACHE[key] = env
    return env


def simulate(env: SyntheticEnvironment, policy: KroneckerUCB | None, checkpoints: int = 200) -> tuple[float, list[float]]:
    """Run ``policy`` (``None``: the exact expected regret of uniform random play) on ``env``."""
    T = env.horizon
    marks = np.unique(np.linspace(0, T, checkpoints + 1).astype(int))[1:]
    if policy is None:
        cum = np.cumsum(env.random_regret())
        return float(cum[-1]), [float(cum[m - 1]) for m in marks]
    curve: list[float] = []
    total = 0.0
    users, shown, arms, rewards = env.users, env.shown, env.arms, env.rewards
    mi = 0
    for t in range(T):
        u = int(users[t])
        X = arms[shown[t]]
        k = policy.select(u, X)
        policy.update(u, X[k], float(rewards[t, k]))
        total += env.regret(t, k)
        if t + 1 == marks[mi]:
            curve.append(total)
            mi += 1
    return total, curve


def _execute(job: Job) -> JobResult:
    t0 = time.perf_counter()
    env = _environment({**job.env, "seed": job.env["seed"]})
    if job.algorithm == "random":
        policy = None
    else:
        kw = dict(job.policy)
        kw.setdefault("horizon", env.horizon)
        kw.setdefault("seed", derive_seed("noise", job.env["seed"], job.row, job.epsilon))
        policy = make_policy(job.algorithm, d=env.d, W=env.W, epsilon=job.epsilon, **kw)
    regret, curve = simulate(env, policy, job.checkpoints)
    return JobResult(job, regret, curve, time.perf_counter() - t0)


def _init_worker() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def run_jobs(jobs: Sequence[Job], *, n_jobs: int | None = None, desc: str = "simulating",
             progress: bool = True) -> list[JobResult]:
    """Run every job (in ``n_jobs`` processes), with a progress bar; results in job order."""
    from tqdm import tqdm

    n = max(1, n_jobs or os.cpu_count() or 1)
    # longest jobs first keeps both cores busy to the end
    order = sorted(range(len(jobs)), key=lambda i: _cost(jobs[i]), reverse=True)
    results: list[JobResult | None] = [None] * len(jobs)
    bar = tqdm(total=len(jobs), desc=desc, unit="run", disable=not progress, dynamic_ncols=True)
    if n == 1:
        for i in order:
            results[i] = _execute(jobs[i])
            bar.update()
    else:
        ctx = mp.get_context("fork")
        with ctx.Pool(n, initializer=_init_worker) as pool:
            for i, res in zip(order, pool.imap(_execute, [jobs[i] for i in order], chunksize=1)):
                results[i] = res
                bar.update()
    bar.close()
    return [r for r in results if r is not None]


def _cost(job: Job) -> float:
    if job.algorithm == "random":
        return 0.0
    c = job.env.get("horizon", 1) * (job.env.get("d", 25) ** 2) * job.env.get("n_users", 10)
    return c * (2.0 if "CoLin" in job.algorithm or "GOBLin" in job.algorithm else 1.0)


def summarize(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for a single value)."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        return math.nan, math.nan
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def python_speed_us(repeats: int = 5, number: int = 2000) -> float:
    """Best time of ``sum(range(1000))`` in µs: a yardstick of this machine's single-core Python speed.

    The benchmarks' wall-clock numbers move with it (the same code measured 2-3x apart on two days
    of this project's shared machines), so every report records it beside them.
    """
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=number, repeat=repeats)) / number * 1e6


def machine_info() -> dict[str, Any]:
    return {
        "python_speed_us": round(python_speed_us(), 2),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    }


def job_dict(job: Job) -> dict[str, Any]:
    return asdict(job)
