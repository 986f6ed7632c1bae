"""The Table-1 claims that the issue requires, re-measured on the full protocol.

An experiment of ~3 minutes, opt-in under ``-m slow`` (``pytest -m slow tests/experiments``).

Deterministic: every run is seeded, so these are exact re-computations, not samples.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privrec.experiments.runner import Job, run_jobs
from privrec.experiments.table1 import NONPRIVATE, Table1Config, assemble, build_jobs

pytestmark = pytest.mark.slow



def test_d5_preset_orders_epsilon_and_ldp_and_nonprivate() -> None:
    cfg = Table1Config(preset="d5", runs=5, horizon=10_000, jobs=2)
    doc = assemble(cfg, run_jobs(build_jobs(cfg), n_jobs=2, progress=False), 0.0)
    claims = doc["claims"]
    assert all(claims["a_regret_falls_with_epsilon"].values()), claims["a_regret_falls_with_epsilon"]
    assert claims["b_ldp_above_dp_everywhere"], claims["b_ldp_minus_dp_paired"]
    assert claims["c_nonprivate_below_private_everywhere"], claims["c_min_gap_private_minus_nonprivate"]


def test_uniform_preset_dpcolin_beats_dplinucb_from_epsilon_2() -> None:
    cfg = Table1Config(preset="uniform", runs=5, horizon=10_000, jobs=2)
    eps = (2.0, 5.0, 10.0)
    jobs = [Job(r, name, e, cfg.env_spec(r), cfg.policy_spec()) for r in range(cfg.runs)
            for name in ("DP-CoLin", "DP-LinUCB") for e in eps]
    jobs += [Job(r, name, math.inf, cfg.env_spec(r), cfg.policy_spec()) for r in range(cfg.runs) for name in NONPRIVATE]
    res = run_jobs(jobs, n_jobs=2, progress=False)

    def mean(name: str, e: float) -> float:
        return float(np.mean([x.regret for x in res if x.job.algorithm == name and x.job.epsilon == e]))

    for e in eps:
        assert mean("DP-CoLin", e) < mean("DP-LinUCB", e), e
    nonpriv = max(mean(n, math.inf) for n in NONPRIVATE)
    assert all(mean(n, e) > nonpriv for n in ("DP-CoLin", "DP-LinUCB") for e in eps)
