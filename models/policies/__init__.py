"""Bandit policies: ``select(user, contexts) -> arm`` and ``update(user, context, reward)``.

Layers, bottom to top:

``kronecker``    LinUCB / CoLin / GOB.Lin as one Kronecker family, non-private, global-DP, local-DP
``userspace``    the same with user-space noise ``(V ⊗ I) xi`` (the global default)
``peruser``      the skeleton of the per-unit private LinUCB baselines
``jdp_linucb``   Shariff & Sheffet's joint-DP LinUCB (Gaussian or Wishart tree)
``dgs``          LinUCB with dynamic global sensitivity (Wang et al. 2022)
``baselines``    :data:`BASELINES`: the per-unit baselines by name
``registry``     :data:`ALGORITHMS` and :func:`make_policy`: every policy by name
``popularity``   the popularity counter, private popularity at user level, and any bandit plus a privately
                 released item term
``userlevel``    the offline twin of user-level privacy: per-user per-tick clipping, a cap

A new bandit is one module here (below ``registry``) that takes a mechanism by
name from :mod:`models.mechanisms` and gets a name in ``registry``.
"""

from __future__ import annotations

from .baselines import BASELINES, make_baseline
from .dgs import DGSLinUCB
from .jdp_linucb import SSLinUCB
from .kronecker import KroneckerUCB, Policy, PrivacyConfig, PrivacyMode, RandomPolicy
from .peruser import PerUserLinUCB, ServingModels
from .popularity import OnlinePopularity, PopularityUCB, PrivatePopularity, make_popularity_policy
from .registry import ALGORITHMS, make_policy, projection_for
from .userlevel import UserLevelUCB, make_user_level_policy
from .userspace import UserSpaceKroneckerUCB

__all__ = [
    "ALGORITHMS",
    "BASELINES",
    "DGSLinUCB",
    "KroneckerUCB",
    "OnlinePopularity",
    "PrivatePopularity",
    "PerUserLinUCB",
    "PopularityUCB",
    "Policy",
    "PrivacyConfig",
    "PrivacyMode",
    "RandomPolicy",
    "SSLinUCB",
    "ServingModels",
    "UserLevelUCB",
    "UserSpaceKroneckerUCB",
    "make_baseline",
    "make_policy",
    "make_popularity_policy",
    "make_user_level_policy",
    "projection_for",
]
