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
        self._accumulate_gram(units, X)
        self._accumulate_b(units, X, r)

    def _groups(self, units: NDArray[np.int64]) -> tuple[NDArray[np.int64], list[tuple[int, int, int]]]:
        """A stable order of ``units`` and its runs ``(unit, start, end)``."""
        order = np.argsort(units, kind="stable")
        us = units[order]
        starts = np.flatnonzero(np.r_[True, us[1:] != us[:-1]])
        ends = np.r_[starts[1:], us.shape[0]]
        return order, [(int(us[s]), int(s), int(e)) for s, e in zip(starts.tolist(), ends.tolist())]

    def _accumulate_gram(self, units: NDArray[np.int64], X: FloatArray) -> None:
        if not units.shape[0]:
            return
        order, runs = self._groups(units)
        Xs, d = X[order], self.d
        for k, s, e in runs:
            G = np.empty((e - s + 1, d, d))
            G[0] = self.gram[k]
            np.multiply(Xs[s:e, :, None], Xs[s:e, None, :], out=G[1:])
            np.add.accumulate(G, axis=0, out=G)
            self.gram[k] = G[-1]

    def _accumulate_b(self, units: NDArray[np.int64], X: FloatArray, r: FloatArray) -> None:
        if not units.shape[0]:
            return
        order, runs = self._groups(units)
        Xs, rs, d = X[order], r[order], self.d
        for k, s, e in runs:
            B = np.empty((e - s + 1, d))
            B[0] = self.b[k]
            np.multiply(rs[s:e, None], Xs[s:e], out=B[1:])
            np.add.accumulate(B, axis=0, out=B)
            self.b[k] = B[-1]
            self.count[k] += e - s

    def add_parts(self, units: NDArray[np.int64], contexts: FloatArray, rewards: FloatArray,
                  gram_units: NDArray[np.int64], gram_contexts: FloatArray) -> None:
        """Fold in a batch whose Gram rows are not its events' contexts.

        ``b += r x`` and ``count += 1`` per event (``units``, ``contexts``, ``rewards``); ``gram += x x^T`` per
        row of ``gram_contexts`` (unit ``gram_units``): the items a feedback's list showed, which are public,
        rather than the item the user chose (DESIGN §2). Each part accumulates in order, as :meth:`add` does.

        >>> stats = UnitStats.zeros(n_units=1, d=2)
        >>> stats.add_parts(np.array([0]), np.array([[1.0, 0.0]]), np.array([1.0]),
        ...                 np.array([0, 0]), np.eye(2))
        >>> stats.gram[0].tolist(), stats.b[0].tolist(), int(stats.count[0])
        ([[1.0, 0.0], [0.0, 1.0]], [1.0, 0.0], 1)
        """
        gram_units = np.asarray(gram_units, dtype=np.int64)
        G = np.asarray(gram_contexts, dtype=np.float64)
        if G.shape != (gram_units.shape[0], self.d):
            raise ValueError(f"`gram_contexts` must have shape ({gram_units.shape[0]}, {self.d}), got {G.shape}.")
        if gram_units.size and (gram_units.min() < 0 or gram_units.max() >= self.n_units):
            raise ValueError(f"`gram_units` must lie in [0, {self.n_units}).")
        units = np.asarray(units, dtype=np.int64)
        X = np.asarray(contexts, dtype=np.float64)
        r = np.asarray(rewards, dtype=np.float64)
        if X.shape != (units.shape[0], self.d) or r.shape != (units.shape[0],):
            raise ValueError(f"`contexts` and `rewards` must have shapes ({units.shape[0]}, {self.d}) and "
                             f"({units.shape[0]},), got {X.shape} and {r.shape}.")
        if units.size and (units.min() < 0 or units.max() >= self.n_units):
            raise ValueError(f"`units` must lie in [0, {self.n_units}).")
        self._accumulate_gram(gram_units, G)
        self._accumulate_b(units, X, r)

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
