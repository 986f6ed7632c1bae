"""The math of privrec: pure numpy, no I/O.

Contextual bandits (LinUCB, CoLin, GOB.Lin) in one Kronecker family, the
continual-release mechanisms that privatise their statistics, privacy
events and accountants, the collaboration graphs, the synthetic environment
of the collaborative paper, and plain-bytes state codecs.

Nothing here imports Kafka, Redis, faust, reads files, reads the clock or
configures logging: the same objects run inside the streaming pipeline and
in offline experiments. Time enters as a tick count and randomness as a seed.

Layout (one concern per subpackage; each layer imports only the ones below it,
checked by the import contracts in ``pyproject.toml``)
---------------------------------------------------------------------------------
policies      the bandits: LinUCB / CoLin / GOB.Lin (Kronecker family), the per-unit
              baselines (Shariff & Sheffet, DGS), the registry ``make_policy``
streaming     the pipeline's pure stages: exact unit statistics, release, solve
mechanisms    continual-release mechanisms: ``step(state, increment) -> (release, state, event)``,
              one module each, the registry ``make_mechanism`` at the top
accounting    DP events, accountants (zCDP, Gaussian DP, Laplace), conversions
ground        codecs, keyed noise, small linear algebra, collaboration graphs, the synthetic environment

``policies`` and ``streaming`` sit side by side: neither imports the other.
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
from .ground import KeyedNoise, SyntheticEnvironment, ucb_scores
from .mechanisms import (
    MECHANISMS,
    BinaryTreeMechanism,
    BLTMechanism,
    HonakerTreeMechanism,
    SmoothBinaryMechanism,
    TreeState,
    UserSpaceMechanism,
    make_mechanism,
)
from .policies import (
    ALGORITHMS,
    BASELINES,
    DGSLinUCB,
    KroneckerUCB,
    PrivacyConfig,
    RandomPolicy,
    SSLinUCB,
    UserSpaceKroneckerUCB,
    make_baseline,
    make_policy,
)
from .streaming import ReleasedStats, Releaser, UnitStats, solve

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
