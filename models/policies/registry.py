"""The policy registry: the collaborative paper's algorithms and the other papers' baselines, by name.

The top of :mod:`models.policies`: it imports every policy, and no policy imports it.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from models.ground.graphs import adjacency_from_w, goblin_projection, validate_w

from .baselines import BASELINES, make_baseline
from .kronecker import KroneckerUCB, PrivacyConfig, PrivacyMode
from .userspace import UserSpaceKroneckerUCB

__all__ = ["ALGORITHMS", "projection_for", "make_policy"]

FloatArray = NDArray[np.float64]


#: The algorithms of the collaborative paper: name -> (structure, privacy mode).
ALGORITHMS: dict[str, tuple[str, PrivacyMode]] = {
    "LinUCB": ("linucb", "none"),
    "CoLin": ("colin", "none"),
    "GOBLin": ("goblin", "none"),
    "DP-LinUCB": ("linucb", "global"),
    "DP-CoLin": ("colin", "global"),
    "DP-GOBLin": ("goblin", "global"),
    "LDP-CoLin": ("colin", "local"),
    "LDP-GOBLin": ("goblin", "local"),
}


def projection_for(structure: str, W: FloatArray, goblin_scale: float = 1.0) -> FloatArray:
    """``V`` for ``"linucb"`` (identity), ``"colin"`` (``W``) or ``"goblin"`` (``G^{-1/2}``)."""
    W = validate_w(W)
    if structure == "linucb":
        return np.eye(W.shape[0])
    if structure == "colin":
        return W
    if structure == "goblin":
        return goblin_projection(adjacency_from_w(W), goblin_scale)
    raise ValueError(f"`structure` must be 'linucb', 'colin' or 'goblin', got {structure!r}.")


def make_policy(
    name: str,
    *,
    d: int,
    W: FloatArray,
    lambda_: float = 0.1,
    alpha: float | Literal["theory"] = 0.3,
    epsilon: float = math.inf,
    delta: float = 1e-5,
    mechanism: str = "paper",
    horizon: int = 10_000,
    tick: int = 1,
    seed: int = 0,
    V: FloatArray | None = None,
    options: dict[str, Any] | None = None,
    noise_ridge: float = 0.0,
    sensitivity_scale: float = 1.0,
) -> KroneckerUCB:
    """Build one of :data:`ALGORITHMS` by name.

    ``V`` overrides the projection derived from ``W`` (e.g. a precomputed
    ``G^{-1/2}``). Non-private names ignore ``epsilon``.

    The other papers' LinUCB variants (:data:`models.policies.baselines.BASELINES`,
    e.g. ``"SS-LinUCB-Gaussian"``, ``"DGS-LinUCB-Laplace"``) are built by
    :func:`models.policies.baselines.make_baseline` with ``n_users = len(W)``;
    ``mechanism`` does not apply to them, ``options`` are passed on.
    ``noise_ridge`` is :class:`KroneckerUCB`'s noise-scaled ridge ``kappa``.
    """
    if name in BASELINES:
        return make_baseline(name, d=d, n_users=validate_w(W).shape[0], lambda_=lambda_, alpha=alpha,  # type: ignore[return-value]
                             epsilon=epsilon, delta=delta, horizon=horizon, tick=tick, seed=seed, **(options or {}))
    if name not in ALGORITHMS:
        raise ValueError(f"`name` must be one of {list(ALGORITHMS)}, got {name!r}.")
    structure, mode = ALGORITHMS[name]
    proj = projection_for(structure, W) if V is None else V
    W = validate_w(W)
    if proj.shape != W.shape:
        raise ValueError(f"`V` must have the shape of `W` {W.shape}, got {proj.shape}.")
    privacy = PrivacyConfig(mode=mode, mechanism=mechanism, epsilon=epsilon if mode != "none" else math.inf,
                            delta=delta, horizon=horizon, tick=tick, seed=seed, sensitivity_scale=sensitivity_scale)
    if mode == "global" and mechanism.startswith("user-"):
        # user-space noise needs V at the mechanism (models.mechanisms.userspace)
        return UserSpaceKroneckerUCB(d=d, V=proj, lambda_=lambda_, alpha=alpha, privacy=privacy,
                                     noise_ridge=noise_ridge)
    return KroneckerUCB(d=d, V=proj, lambda_=lambda_, alpha=alpha, privacy=privacy, noise_ridge=noise_ridge)
