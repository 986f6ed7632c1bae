"""The other papers' private LinUCB variants, by name: Shariff & Sheffet and dynamic global sensitivity.

=========================  ==========================================================================
name                       what it is
=========================  ==========================================================================
SS-LinUCB-Gaussian         S&S JDP LinUCB, symmetrised Gaussian tree, the paper's calibration (Prop. 11)
SS-LinUCB-Gaussian-tight   the same with exact Gaussian-DP calibration (ERRATA §6: 6–14x less noise)
SS-LinUCB-Wishart          S&S with shifted, padded Wishart noise (Prop. 9, Eq. 4, D.3), run at eps/2
DGS-LinUCB-Laplace         LinUCB-DGS with Laplace noise on theta, the paper's scale Delta/eps'
DGS-LinUCB-Gaussian        LinUCB-DGS with Gaussian noise on theta (zCDP, spec D.6)
=========================  ==========================================================================

Both papers define single-model LinUCB only; here every user has its own
model and its own mechanism (see :mod:`models.policies.peruser`). Their DP-CoLin /
DP-GOB.Lin variants are not defined by the papers and are not provided.

Examples
--------
>>> pol = make_baseline("SS-LinUCB-Gaussian-tight", d=3, n_users=2, epsilon=2.0, horizon=100, seed=0)
>>> type(pol).__name__, pol.calibration, pol.noise_kind
('SSLinUCB', 'tight', 'gaussian')
"""

from __future__ import annotations

import math
from typing import Any, Literal

from .peruser import PerUserLinUCB
from .dgs import DGSLinUCB
from .jdp_linucb import SSLinUCB

__all__ = ["BASELINES", "make_baseline"]

#: Baseline names -> (class, fixed keyword arguments).
BASELINES: dict[str, tuple[type[PerUserLinUCB], dict[str, Any]]] = {
    "SS-LinUCB-Gaussian": (SSLinUCB, {"noise": "gaussian", "calibration": "paper"}),
    "SS-LinUCB-Gaussian-tight": (SSLinUCB, {"noise": "gaussian", "calibration": "tight"}),
    "SS-LinUCB-Wishart": (SSLinUCB, {"noise": "wishart", "calibration": "paper"}),
    "DGS-LinUCB-Laplace": (DGSLinUCB, {"noise": "laplace", "calibration": "paper"}),
    "DGS-LinUCB-Gaussian": (DGSLinUCB, {"noise": "gaussian"}),
}


def make_baseline(
    name: str,
    *,
    d: int,
    n_users: int,
    lambda_: float = 0.1,
    alpha: float | Literal["theory"] | None = None,
    epsilon: float = math.inf,
    delta: float = 1e-5,
    horizon: int = 10_000,
    tick: int = 1,
    seed: int = 0,
    **options: Any,
) -> PerUserLinUCB:
    """Build one of :data:`BASELINES`; ``alpha=None`` means each paper's default.

    S&S default to their own width (``"theory"``, Prop. 4), DGS to the
    constant 0.3 (its theory width, spec D.13, is available as ``"theory"``).
    ``options`` go to the class (e.g. ``lambda_0`` for DGS, ``fail_prob``).
    """
    if name not in BASELINES:
        raise ValueError(f"`name` must be one of {sorted(BASELINES)}, got {name!r}.")
    cls, fixed = BASELINES[name]
    if alpha is None:
        alpha = "theory" if cls is SSLinUCB else 0.3
    kwargs: dict[str, Any] = {**fixed, **options}
    return cls(d=d, n_users=n_users, lambda_=lambda_, alpha=alpha, epsilon=epsilon, delta=delta, horizon=horizon,
               tick=tick, seed=seed, **kwargs)
