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

import numpy as np
from numpy.typing import NDArray

__all__ = ["popularity_feature"]

FloatArray = NDArray[np.float64]


def popularity_feature(sums: FloatArray, *, total: float, threshold: float = 0.0) -> FloatArray:
    """``log1p(max(sums - threshold, 0)) / log1p(max(total, 1))``, clipped to ``[0, 1]``."""
    if not (threshold >= 0 and math.isfinite(threshold)):
        raise ValueError(f"`threshold` must be a non-negative number, got {threshold}.")
    s = np.maximum(np.asarray(sums, dtype=np.float64) - threshold, 0.0)
    out: FloatArray = np.minimum(1.0, np.log1p(s) / math.log1p(max(float(total), 1.0)))
    return out
