"""The shared ground of :mod:`models`: nothing here knows about privacy or bandit policies.

``codec``        arrays ↔ plain bytes (little-endian, shape and dtype recorded; never pickles)
``noise``        keyed, counter-based noise: a pure function of (seed, stream, epoch, level, index)
``linalg``       input checks, UCB scores, Sherman–Morrison
``graphs``       collaboration matrices W, G^{-1/2}, per-user sensitivities
``environment``  the collaborative paper's synthetic environment with a regret oracle
"""

from __future__ import annotations

from .codec import SchemaError, decode_arrays, encode_arrays
from .environment import SyntheticEnvironment
from .linalg import check_interaction, sherman_morrison, ucb_scores
from .noise import KeyedNoise

__all__ = [
    "KeyedNoise",
    "SchemaError",
    "SyntheticEnvironment",
    "check_interaction",
    "decode_arrays",
    "encode_arrays",
    "sherman_morrison",
    "ucb_scores",
]
