"""Ingest's math: exact sufficient statistics per model unit (trusted data).

Examples
--------
>>> import numpy as np
>>> stats = UnitStats.zeros(n_units=2, d=2)
>>> stats.add(np.array([0, 0, 1]), np.eye(2)[[0, 1, 0]], np.array([1.0, 0.0, 1.0]))
>>> stats.count.tolist()
[2, 1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from models.ground.codec import decode_arrays, encode_arrays

__all__ = ["UnitStats"]

FloatArray = NDArray[np.float64]


@dataclass(slots=True)
class UnitStats:
    """Exact sufficient statistics per model unit (trusted data).

    Attributes
    ----------
    gram
        ``(N, d, d)``: ``sum x x^T`` over each unit's interactions.
    b
        ``(N, d)``: ``sum r x``.
    count
        ``(N,)``: interactions per unit.
    """

    gram: FloatArray
    b: FloatArray
    count: NDArray[np.int64]

    SCHEMA = "privrec.UnitStats/1"

    @classmethod
    def zeros(cls, *, n_units: int, d: int) -> UnitStats:
        if n_units < 1 or d < 1:
            raise ValueError(f"`n_units` and `d` must be positive, got {n_units} and {d}.")
        return cls(np.zeros((n_units, d, d)), np.zeros((n_units, d)), np.zeros(n_units, dtype=np.int64))

    @property
    def n_units(self) -> int:
        return int(self.b.shape[0])

    @property
    def d(self) -> int:
        return int(self.b.shape[1])

    def add(self, units: NDArray[np.int64], contexts: FloatArray, rewards: FloatArray) -> None:
        """Fold in a batch of interactions (in order), bit-identically to one at a time.

        ``np.add.at`` applies unbuffered additions in index order, so repeated
        units accumulate exactly as a sequential loop would.
        """
        units = np.asarray(units, dtype=np.int64)
        X = np.asarray(contexts, dtype=np.float64)
        r = np.asarray(rewards, dtype=np.float64)
        n = units.shape[0]
        if X.shape != (n, self.d):
            raise ValueError(f"`contexts` must have shape ({n}, {self.d}), got {X.shape}.")
        if r.shape != (n,):
            raise ValueError(f"`rewards` must have shape ({n},), got {r.shape}.")
        if n and (units.min() < 0 or units.max() >= self.n_units):
            raise ValueError(f"`units` must lie in [0, {self.n_units}), got {units.min()}..{units.max()}.")
        if not n:
            return
        # Per unit, a left-to-right running sum (np.add.accumulate is strictly sequential), so the
        # result is bit-identical to adding the events one at a time, in order.
        order = np.argsort(units, kind="stable")
        us, Xs, rs = units[order], X[order], r[order]
        starts = np.flatnonzero(np.r_[True, us[1:] != us[:-1]])
        ends = np.r_[starts[1:], n]
        d = self.d
        for s, e in zip(starts.tolist(), ends.tolist()):
            k = int(us[s])
            G = np.empty((e - s + 1, d, d))
            G[0] = self.gram[k]
            np.multiply(Xs[s:e, :, None], Xs[s:e, None, :], out=G[1:])
            np.add.accumulate(G, axis=0, out=G)
            self.gram[k] = G[-1]
            B = np.empty((e - s + 1, d))
            B[0] = self.b[k]
            np.multiply(rs[s:e, None], Xs[s:e], out=B[1:])
            np.add.accumulate(B, axis=0, out=B)
            self.b[k] = B[-1]
            self.count[k] += e - s

    @classmethod
    def merged(cls, shards: list[UnitStats]) -> UnitStats:
        """Sum of per-partition shards, added in the given order (``0 + s_0 + s_1 + ...``)."""
        if not shards:
            raise ValueError("`shards` must not be empty.")
        total = cls.zeros(n_units=shards[0].n_units, d=shards[0].d)
        for s in shards:
            total.gram += s.gram
            total.b += s.b
            total.count += s.count
        return total

    def copy(self) -> UnitStats:
        return UnitStats(self.gram.copy(), self.b.copy(), self.count.copy())

    def to_mapping(self) -> dict[str, bytes]:
        return encode_arrays({"gram": self.gram, "b": self.b, "count": self.count}, schema=self.SCHEMA)

    @classmethod
    def from_mapping(cls, mapping: dict[str, bytes] | dict[bytes, bytes]) -> UnitStats:
        a, _ = decode_arrays(mapping, schema=cls.SCHEMA)  # type: ignore[arg-type]
        return cls(a["gram"].astype(np.float64), a["b"].astype(np.float64), a["count"].astype(np.int64))
