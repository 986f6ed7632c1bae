"""Item popularity from (released) per-item reward sums: a normalized score in ``[0, 1]``.

The private model's item term (issue: beat popularity): each item ``a`` has a reward sum
``s_a`` (its positives), released through a continual-release mechanism as ``s_a + eta_a``.
:func:`popularity_feature` maps released sums to ``log(1 + max(s_a - tau, 0)) / log(1 + total)``:
the log damps the head of the long tail, ``tau`` (a multiple of the release's noise std, public)
zeroes items whose released sum is within the noise, and ``total`` (the number of interactions
released so far, public) keeps the score in ``[0, 1]`` without a data-dependent maximum.

Examples
--------
>>> import numpy as np
>>> popularity_feature(np.array([0.0, 9.0, 99.0, -3.0]), total=99).round(3).tolist()
[0.0, 0.5, 1.0, 0.0]
>>> popularity_feature(np.array([5.0, 20.0]), total=100, threshold=4.0).round(3).tolist()
[0.15, 0.614]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .codec import decode_arrays, encode_arrays

__all__ = ["popularity_feature", "ReleasedItems"]

FloatArray = NDArray[np.float64]


def popularity_feature(sums: FloatArray, *, total: float, threshold: float = 0.0) -> FloatArray:
    """``log1p(max(sums - threshold, 0)) / log1p(max(total, 1))``, clipped to ``[0, 1]``."""
    if not (threshold >= 0 and math.isfinite(threshold)):
        raise ValueError(f"`threshold` must be a non-negative number, got {threshold}.")
    s = np.maximum(np.asarray(sums, dtype=np.float64) - threshold, 0.0)
    out: FloatArray = np.minimum(1.0, np.log1p(s) / math.log1p(max(float(total), 1.0)))
    return out


@dataclass(frozen=True)
class ReleasedItems:
    """Released per-item reward sums (noisy) with what is public about them.

    ``total`` is the number of interactions the release covers and ``noise_std`` the noise std
    of each released sum (both public); fields are stored under the ``items/`` prefix so they
    can share a Redis hash with a :class:`~models.streaming.ReleasedStats` mapping.

    >>> r = ReleasedItems(np.array([1.0, 2.0]), total=3, noise_std=0.5)
    >>> ReleasedItems.from_mapping(r.to_mapping()) == r
    True
    """

    sums: FloatArray
    total: int
    noise_std: float

    SCHEMA = "privrec.ReleasedItems/1"
    PREFIX = "items/"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ReleasedItems) and np.array_equal(self.sums, other.sums)
                and self.total == other.total and self.noise_std == other.noise_std)

    def to_mapping(self) -> dict[str, bytes]:
        m = encode_arrays({"sums": self.sums}, scalars={"total": int(self.total), "noise_std": float(self.noise_std)},
                          schema=self.SCHEMA)
        return {self.PREFIX + k: v for k, v in m.items()}

    @classmethod
    def from_mapping(cls, mapping: dict[str, bytes] | dict[bytes, bytes]) -> ReleasedItems | None:
        """The items of a mapping (``None`` when it holds none)."""
        own: dict[str | bytes, bytes] = {}
        for k, v in mapping.items():
            key = k.decode() if isinstance(k, bytes) else k
            if key.startswith(cls.PREFIX):
                own[key[len(cls.PREFIX):]] = v
        if not own:
            return None
        a, sc = decode_arrays(own, schema=cls.SCHEMA)
        return cls(a["sums"].astype(np.float64), int(sc["total"]), float(sc["noise_std"]))  # type: ignore[arg-type]
