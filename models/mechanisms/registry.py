"""The mechanism registry: names → calibrated mechanisms (the top of :mod:`models.mechanisms`).

The registry imports every mechanism; no mechanism imports the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from models.ground.graphs import column_norms, is_sparse
from models.ground.noise import SAMPLERS, Sampler, check_grid, default_grid

from .base import Mechanism
from .discrete import DEFAULT_GRID, DiscreteTreeMechanism
from .factorization import BLTMechanism, DiscreteBLTMechanism
from .honaker import HonakerTreeMechanism
from .smooth import SmoothBinaryMechanism
from .tree import BinaryTreeMechanism
from .userspace import UserSpaceMechanism

__all__ = ["MECHANISMS", "MechanismName", "DISCRETE_SAMPLER_MECHANISMS", "Sampler", "make_mechanism"]

MechanismName = Literal["paper", "laplace-l1", "gaussian-zcdp", "gaussian-exact", "discrete-zcdp", "honaker-paper",
                        "honaker-zcdp",
                        "honaker-exact", "smooth-zcdp", "smooth-exact", "blt-zcdp", "blt-exact",
                        "user-gaussian-exact", "user-honaker-exact", "user-blt-exact"]

#: Mechanism names accepted by :func:`make_mechanism`, with what they are.
MECHANISMS: dict[str, str] = {
    "paper": "binary tree, Laplace scaled to the L2 sensitivity (the papers' calibration; not a valid pure-DP proof)",
    "laplace-l1": "binary tree, Laplace scaled to the L1 sensitivity (valid pure epsilon-DP)",
    "gaussian-zcdp": "binary tree, Gaussian noise accounted in zCDP, converted to (epsilon, delta)",
    "gaussian-exact": "binary tree, Gaussian noise with exact Gaussian-DP accounting",
    "discrete-zcdp": "binary tree, discrete Gaussian noise on a 2**-30 grid sampled with integers only (no "
                     "floating-point artefacts; Canonne, Kamath & Steinke 2020), accounted in zCDP",
    "honaker-paper": "binary tree with Honaker's online estimator, the papers' Laplace-on-L2 calibration "
                     "(same noise as 'paper'; not a valid pure-DP proof)",
    "honaker-zcdp": "binary tree with Honaker's online estimator, Gaussian noise accounted in zCDP",
    "honaker-exact": "binary tree with Honaker's online estimator, Gaussian noise with exact Gaussian-DP accounting",
    "smooth-zcdp": "smooth binary mechanism (Andersson & Pagh 2023), Gaussian noise accounted in zCDP",
    "smooth-exact": "smooth binary mechanism (Andersson & Pagh 2023), Gaussian noise with exact Gaussian-DP accounting",
    "blt-zcdp": "buffered-linear-Toeplitz square-root factorization (4 buffers), Gaussian noise accounted in zCDP",
    "blt-exact": "buffered-linear-Toeplitz square-root factorization (4 buffers), Gaussian noise with exact "
                 "Gaussian-DP accounting on its largest column norm",
    "user-gaussian-exact": "'gaussian-exact' on the users' own statistics b_u (sensitivity Lx), mixed by the "
                           "public V: noise (V ⊗ I) xi shaped like the signal (same as the base for LinUCB)",
    "user-honaker-exact": "'honaker-exact' on the users' own statistics, mixed by V (see 'user-gaussian-exact')",
    "user-blt-exact": "'blt-exact' on the users' own statistics, mixed by V (see 'user-gaussian-exact')",
}


#: Names that take ``sampler="discrete"`` (exact discrete Gaussian noise on a grid, accounted in zCDP).
DISCRETE_SAMPLER_MECHANISMS: tuple[str, ...] = ("gaussian-zcdp", "gaussian-exact", "discrete-zcdp", "blt-zcdp",
                                                "blt-exact")


def make_mechanism(
    name: str,
    *,
    dim: int,
    sensitivity: float,
    epsilon: float,
    delta: float,
    horizon: int,
    seed: int,
    stream: int = 0,
    sensitivity_l1: float | None = None,
    mixing: Any = None,
    block_dim: int | None = None,
    sampler: Sampler = "float",
    grid: float | None = None,
) -> Mechanism:
    """Build a calibrated mechanism by name (see :data:`MECHANISMS`).

    ``horizon`` is the number of ticks one epoch covers. ``sensitivity`` is
    the L2 sensitivity of one interaction on the released vector (L1 for
    ``"laplace-l1"``). ``"user-*"`` names also take the public ``mixing``
    matrix ``V`` and the user block length ``block_dim`` (default: identity,
    one block): their inner mechanism runs on the stacked user statistics
    with sensitivity ``sensitivity / max_u ||V[:, u]||_2`` (``= Lx`` when
    ``sensitivity = Lx max_u ||V[:, u]||_2``, as the policies compute it).

    ``sampler="discrete"`` (issue 12, hardened noise) draws exact discrete Gaussian noise on the grid
    ``grid`` (a power of two; default :func:`~models.ground.noise.default_grid` of the sensitivity,
    ``2**-30 Delta``) with integer arithmetic from the same keyed Philox words, over a statistic rounded to
    the grid: no floating-point artefacts. Supported for :data:`DISCRETE_SAMPLER_MECHANISMS`: the tree names
    build a :class:`DiscreteTreeMechanism`, the BLT names a :class:`DiscreteBLTMechanism`. Both are
    calibrated and accounted in **zCDP** for the rounded statistic's sensitivity whatever the name's suffix
    (the discrete Gaussian's privacy loss is not Gaussian, so the ``-exact`` Gaussian-DP calibration is no
    proof for it); the default ``"float"`` is unchanged.
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {list(SAMPLERS)}, got {sampler!r}.")
    if grid is not None:
        check_grid(grid)
        if sampler != "discrete" and name != "discrete-zcdp":
            raise ValueError("`grid` applies to sampler='discrete' (or the 'discrete-zcdp' mechanism) only.")
    if sampler == "discrete" and name in MECHANISMS:
        if name not in DISCRETE_SAMPLER_MECHANISMS:
            raise ValueError(f"sampler='discrete' is supported for {list(DISCRETE_SAMPLER_MECHANISMS)}, not {name!r}"
                             + (": the user-space wrapper re-adds the mixed noise to the exact statistic in floating "
                                "point" if name.startswith("user-") else "") + ".")
        if name.startswith("blt-"):
            return DiscreteBLTMechanism.calibrate(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                                  horizon=horizon, seed=seed, stream=stream, grid=grid)
        g = grid if grid is not None else (DEFAULT_GRID if name == "discrete-zcdp" else default_grid(sensitivity))
        return DiscreteTreeMechanism.calibrate(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                               horizon=horizon, seed=seed, stream=stream, grid=g)
    if name.startswith("user-") and name in MECHANISMS:
        V: Any = np.eye(1) if mixing is None else (mixing if is_sparse(mixing) else np.asarray(mixing, dtype=np.float64))
        bd = int(dim) if mixing is None else int(block_dim or 0)
        col = float(column_norms(V).max()) if V.shape[0] else 0.0
        if not col > 0:
            raise ValueError("`mixing` must have a non-zero column.")
        inner = make_mechanism(name[len("user-"):], dim=dim, sensitivity=float(sensitivity) / col, epsilon=epsilon,
                               delta=delta, horizon=horizon, seed=seed, stream=stream, sensitivity_l1=sensitivity_l1)
        return UserSpaceMechanism(inner, mixing=V, block_dim=bd)
    if name == "discrete-zcdp" and grid is not None:
        return DiscreteTreeMechanism.calibrate(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                               horizon=horizon, seed=seed, stream=stream, grid=grid)
    if name in _EXTRA_FACTORIES:
        return _EXTRA_FACTORIES[name](dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                      horizon=horizon, seed=seed, stream=stream)
    if name == "paper":
        return BinaryTreeMechanism.paper(dim=dim, sensitivity=sensitivity, epsilon=epsilon,
                                         horizon=horizon, seed=seed, stream=stream)
    if name == "laplace-l1":
        if sensitivity_l1 is None:
            raise ValueError("`sensitivity_l1` is required for the 'laplace-l1' mechanism.")
        return BinaryTreeMechanism.laplace_l1(dim=dim, sensitivity_l1=sensitivity_l1, epsilon=epsilon,
                                              horizon=horizon, seed=seed, stream=stream)
    if name in ("gaussian-zcdp", "gaussian-exact"):
        return BinaryTreeMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                            horizon=horizon, seed=seed, stream=stream,
                                            accounting="zcdp" if name == "gaussian-zcdp" else "exact")
    raise ValueError(f"`mechanism` must be one of {sorted(MECHANISMS)}, got {name!r}.")


def _honaker(calibration: str) -> Callable[..., Mechanism]:
    def build(*, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int, seed: int,
              stream: int) -> Mechanism:
        if calibration == "paper":
            return HonakerTreeMechanism.paper(dim=dim, sensitivity=sensitivity, epsilon=epsilon, horizon=horizon,
                                              seed=seed, stream=stream)
        return HonakerTreeMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                             horizon=horizon, seed=seed, stream=stream,
                                             accounting=calibration)  # type: ignore[arg-type]
    return build


def _smooth(accounting: str) -> Callable[..., Mechanism]:
    def build(*, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int, seed: int,
              stream: int) -> Mechanism:
        return SmoothBinaryMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                              horizon=horizon, seed=seed, stream=stream,
                                              accounting=accounting)  # type: ignore[arg-type]
    return build


def _blt(accounting: str) -> Callable[..., Mechanism]:
    def build(*, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int, seed: int,
              stream: int) -> Mechanism:
        return BLTMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                     horizon=horizon, seed=seed, stream=stream,
                                     accounting=accounting)  # type: ignore[arg-type]
    return build


# The tree variants built by calibration name.
_EXTRA_FACTORIES: dict[str, Callable[..., Mechanism]] = {
    "honaker-paper": _honaker("paper"),
    "honaker-zcdp": _honaker("zcdp"),
    "honaker-exact": _honaker("exact"),
    "smooth-zcdp": _smooth("zcdp"),
    "smooth-exact": _smooth("exact"),
    "blt-zcdp": _blt("zcdp"),
    "blt-exact": _blt("exact"),
    "discrete-zcdp": lambda **kw: DiscreteTreeMechanism.calibrate(**kw),
}


