"""The server side of local mode, pure: sums of reports per model unit.

The server never holds an exact per-user value. Per model unit it keeps the public Gram
``sum x x^T`` of every item of the answered lists (never the item a user chose), the count, and the sum of the noisy report vectors: for ``tree``
each user's *latest* noisy running sum (a new report replaces the user's previous one, so the unit
sum moves by the difference), for ``round`` every report. It also keeps the public noise variance
of each unit's sum, a function of the calibration and the report versions only.

Noise off (``vector`` = the exact value), the unit sums equal the global mode's exact statistics
of the same interactions.

Examples
--------
>>> import numpy as np
>>> from models.local import LocalConfig, LocalReport
>>> agg = LocalAggregate(LocalConfig(algorithm="tree", d=2, epsilon=2.0), n_units=1)
>>> x = np.array([1.0, 0.0])
>>> agg.apply(LocalReport("u", 1, "tree", "r1", [1.1, 0.2], ("a",)), unit=0, X=x)
>>> agg.apply(LocalReport("u", 2, "tree", "r2", [1.9, -0.1], ("a",)), unit=0, X=x)  # replaces version 1
>>> agg.b[0].tolist(), int(agg.count[0])
([1.9, -0.1], 2)
>>> agg.apply(LocalReport("u", 2, "tree", "r3", [5.0, 5.0], ("a",)), unit=0, X=x)
Traceback (most recent call last):
...
models.local.aggregate.StaleReport: stale or repeated version 2 of user 'u' (latest 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from models.streaming.stats import UnitStats

from .config import LocalConfig
from .reports import LocalReport
from .shuffle import ShuffledBatch

__all__ = ["LocalAggregate", "StaleReport", "add_report", "check_version", "clip_context", "unit_noise_std"]

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


def add_report(config: LocalConfig, gram: FloatArray, b: FloatArray, count: NDArray[np.int64], var: FloatArray,
               latest: dict[str, tuple[int, FloatArray | None]], report: LocalReport, unit: int,
               X: FloatArray) -> None:
    """Add one (already checked) report to per-unit sums in place; ``X`` holds the clipped public contexts of
    every item of the shown list the report answers (one row each): the Gram takes them all, never the
    user's choice.

    ``tree``: the user's new noisy running sum replaces their previous one (the unit's sum moves by the
    difference); ``round``: every report adds. ``var`` tracks the public noise variance of each unit's sum.
    """
    prev = latest.get(report.user)
    X = np.asarray(X, dtype=np.float64).reshape(-1, gram.shape[-1])
    gram[unit] += X.T @ X
    count[unit] += 1
    if config.algorithm == "tree":
        old_v, old_b = (0, None) if prev is None else prev
        b[unit] += report.vector if old_b is None else report.vector - old_b
        var[unit] += config.report_variance(report.version) - config.report_variance(old_v)
        latest[report.user] = (report.version, report.vector.copy())
    else:
        b[unit] += report.vector
        var[unit] += config.report_variance(report.version)
        latest[report.user] = (report.version, None)


@dataclass
class LocalAggregate:
    """Per-unit sums of reports (the released statistics of local mode, before mixing by ``V``)."""

    config: LocalConfig
    n_units: int
    gram: FloatArray = field(init=False)
    b: FloatArray = field(init=False)
    count: NDArray[np.int64] = field(init=False)
    var: FloatArray = field(init=False)
    latest: dict[str, tuple[int, FloatArray | None]] = field(init=False, default_factory=dict)
    batches: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        d = self.config.d
        self.gram = np.zeros((self.n_units, d, d))
        self.b = np.zeros((self.n_units, d))
        self.count = np.zeros(self.n_units, dtype=np.int64)
        self.var = np.zeros(self.n_units)

    def check(self, report: LocalReport) -> None:
        """Raise :class:`StaleReport` unless ``report`` is newer than the user's latest."""
        check_version(self.latest, report)

    def apply(self, report: LocalReport, *, unit: int, X: FloatArray) -> None:
        """Count one report of a user of ``unit`` on a shown list whose items have contexts ``X`` (public, one row
        each)."""
        self.check(report)
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        add_report(self.config, self.gram, self.b, self.count, self.var, self.latest, report, unit,
                   np.stack([clip_context(x) for x in X]))

    def apply_batch(self, batch: ShuffledBatch, contexts: FloatArray) -> None:
        """Count one shuffled batch (``contexts``: every shown item of the batch's lists, in any order)."""
        last = self.batches.get(batch.unit, 0)
        if batch.seq <= last:
            raise StaleReport(f"repeated batch {batch.seq} of unit {batch.unit} (latest {last})")
        X = np.stack([clip_context(x) for x in contexts]) if len(contexts) else np.zeros((0, self.config.d))
        self.gram[batch.unit] += X.T @ X
        self.b[batch.unit] += np.asarray(batch.vectors, dtype=np.float64).sum(axis=0)
        self.count[batch.unit] += batch.n
        self.var[batch.unit] += batch.n * self.config.report_variance(1)
        self.batches[batch.unit] = batch.seq

    def stats(self) -> UnitStats:
        """The sums as :class:`~models.streaming.UnitStats` (the release stage's input; noisy ``b``)."""
        return UnitStats(self.gram.copy(), self.b.copy(), self.count.copy())

    def noise_std(self, V: FloatArray | None = None) -> float:
        return unit_noise_std(self.var, V)
