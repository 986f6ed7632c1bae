"""The math of privrec: pure numpy, no I/O.

Contextual bandits (LinUCB, CoLin, GOB.Lin) in one Kronecker family, the
continual-release mechanisms that privatise their statistics, privacy
events and accountants, the collaboration graphs, the synthetic environment
of the collaborative paper, and plain-bytes state codecs.

Nothing here imports Kafka, Redis, faust, reads files, reads the clock or
configures logging: the same objects run inside the streaming pipeline and
in offline experiments. Time enters as a tick count and randomness as a seed.

Modules
-------
policies      LinUCB / CoLin / GOB.Lin, non-private, global-DP and local-DP
mechanisms    continual-release trees: ``step(state, increment) -> (release, state, event)``; the registry
honaker       Honaker's online tree estimator (the binary tree's noise, 42 % less variance)
smooth        the smooth binary mechanism (Andersson & Pagh 2023)
factorization buffered-linear-Toeplitz square-root factorization (log t error, bounded memory)
userspace     user-space noise (V ⊗ I) xi for CoLin / GOB.Lin
baselines     Shariff & Sheffet's JDP LinUCB (jdp_linucb) and DGS LinUCB (dgs), by name
accounting    DP events, zCDP / Gaussian-DP / Laplace accountants, calibration
noise         keyed (counter-based) noise: never redrawn, exactly restorable
graphs        W, G^{-1/2}, sensitivities
environment   the paper's synthetic environment with a regret oracle
streaming     the pipeline's pure stages: exact unit statistics, release, solve, UCB scores
"""

from .accounting import (
    DGSEvent,
    FactorizationEvent,
    GaussianTreeEvent,
    GDPAccountant,
    LaplaceTreeEvent,
    NoNoiseEvent,
    WishartTreeEvent,
    ZCDPAccountant,
)
from .environment import SyntheticEnvironment
from .mechanisms import MECHANISMS, BinaryTreeMechanism, TreeState, make_mechanism
from .noise import KeyedNoise
from .policies import ALGORITHMS, KroneckerUCB, PrivacyConfig, RandomPolicy, make_policy
from .streaming import ReleasedStats, Releaser, UnitStats, solve, ucb_scores
from .factorization import BLTMechanism
from .honaker import HonakerTreeMechanism
from .smooth import SmoothBinaryMechanism
from .userspace import UserSpaceKroneckerUCB, UserSpaceMechanism
from .baselines import BASELINES, make_baseline
from .dgs import DGSLinUCB
from .jdp_linucb import SSLinUCB

__all__ = [
    "ALGORITHMS",
    "BASELINES",
    "BLTMechanism",
    "BinaryTreeMechanism",
    "DGSEvent",
    "DGSLinUCB",
    "FactorizationEvent",
    "GDPAccountant",
    "GaussianTreeEvent",
    "HonakerTreeMechanism",
    "KeyedNoise",
    "KroneckerUCB",
    "LaplaceTreeEvent",
    "MECHANISMS",
    "NoNoiseEvent",
    "PrivacyConfig",
    "RandomPolicy",
    "ReleasedStats",
    "Releaser",
    "SSLinUCB",
    "SmoothBinaryMechanism",
    "SyntheticEnvironment",
    "TreeState",
    "UnitStats",
    "UserSpaceKroneckerUCB",
    "UserSpaceMechanism",
    "WishartTreeEvent",
    "ZCDPAccountant",
    "make_baseline",
    "make_mechanism",
    "make_policy",
    "solve",
    "ucb_scores",
]
