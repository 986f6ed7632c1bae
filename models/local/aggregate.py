"""The analyzer's primitives, pure: the context clip, the version check and the public noise level of sums.

The fold itself — per-unit sums of reports and shuffled batches — is :class:`models.local.analyzer.Analyzer`.

>>> import numpy as np
>>> clip_context(np.array([3.0, 4.0])).tolist(), unit_noise_std(np.array([4.0, 9.0]))
([0.6, 0.8], 3.0)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .reports import LocalReport

__all__ = ["StaleReport", "check_version", "clip_context", "unit_noise_std"]

FloatArray = NDArray[np.float64]


class StaleReport(ValueError):
    """A report whose version is not above the user's latest: repeated or out of order."""


def clip_context(x: FloatArray) -> FloatArray:
    """``x`` scaled to norm 1 if longer (what the device did before using it)."""
    x = np.asarray(x, dtype=np.float64)
    n = float(np.linalg.norm(x))
    return x / n if n > 1.0 else x


def unit_noise_std(var: FloatArray, V: FloatArray | None = None) -> float:
    """Largest per-coordinate noise std of ``(V ⊗ I) b`` when unit ``u``'s sum has variance ``var[u]``."""
    v = np.asarray(var, dtype=np.float64)
    if V is not None:
        v = (np.asarray(V, dtype=np.float64) ** 2) @ v
    return float(np.sqrt(max(float(v.max(initial=0.0)), 0.0)))


def check_version(latest: dict[str, tuple[int, FloatArray | None]], report: LocalReport) -> None:
    """Raise :class:`StaleReport` unless ``report``'s version is above the user's latest in ``latest``."""
    prev = latest.get(report.user)
    if prev is not None and report.version <= prev[0]:
        raise StaleReport(f"stale or repeated version {report.version} of user {report.user!r} (latest {prev[0]})")
