"""The catalog protocol and the lookups every catalog shares (:class:`_Base`), and the lookup errors.

Split from :mod:`pipeline.data.catalog` so that the catalog kinds defined elsewhere
(:mod:`pipeline.data.catalog_open`) build on it without an import cycle; :mod:`pipeline.data.catalog` re-exports
every name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

__all__ = ["Catalog", "UnknownUserError", "UnknownArmError", "FloatArray"]

FloatArray = NDArray[np.float64]


class UnknownUserError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class UnknownArmError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class Catalog(Protocol):
    name: str
    d: int
    n_units: int
    W: Any  # dense ``N x N``; scipy sparse for every-user graphs

    def unit_of(self, user: str) -> int: ...

    def arm_row(self, arm: str) -> int: ...

    def arm_rows(self, arms: Sequence[str]) -> list[int]: ...

    @property
    def feature_matrix(self) -> FloatArray: ...

    def arm_name(self, arm: str) -> str: ...

    @property
    def default_pool(self) -> Sequence[str]: ...

    @property
    def fingerprint(self) -> str: ...


class _Base:
    """Shared lookups over ``_user_unit``, ``_arm_rows``, ``_features``."""

    name = "base"
    _user_unit: dict[str, int]
    _arm_rows: dict[str, int]
    _arm_ids: Sequence[str]
    _features: FloatArray
    _default_pool_override: list[str] | None = None
    W: Any

    @property
    def d(self) -> int:
        return int(self._features.shape[1])

    @property
    def n_units(self) -> int:
        return int(self.W.shape[0])

    @property
    def feature_matrix(self) -> FloatArray:
        return self._features

    @property
    def users(self) -> Sequence[str]:
        return list(self._user_unit)

    @property
    def arm_ids(self) -> Sequence[str]:
        return self._arm_ids

    def unit_of(self, user: str) -> int:
        try:
            return self._user_unit[user]
        except KeyError:
            raise UnknownUserError(f"unknown user {user!r} in catalog {self.name!r}") from None

    def arm_row(self, arm: str) -> int:
        try:
            return self._arm_rows[arm]
        except KeyError:
            raise UnknownArmError(f"unknown arm {arm!r} in catalog {self.name!r}") from None

    def arm_rows(self, arms: Sequence[str]) -> list[int]:
        """``arm_row`` of each arm, in one pass (a 1,000-candidate request); the first unknown one is named."""
        rows = self._arm_rows
        try:
            return [rows[a] for a in arms]
        except KeyError:
            for a in arms:
                self.arm_row(a)
            raise

    def with_default_pool(self, arms: Sequence[str]) -> None:
        """Rank ``arms`` (known arm ids) when a request names no candidates."""
        for a in arms:
            self.arm_row(a)
        self._default_pool_override = list(arms)

    def features_of(self, arms: Sequence[str]) -> FloatArray:
        out: FloatArray = self._features[[self.arm_row(a) for a in arms]]
        return out

    @cached_property
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(self.name.encode())
        h.update(np.ascontiguousarray(self._features).tobytes())
        if sp.issparse(self.W):
            W = sp.csr_matrix(self.W)
            for part in (W.data, W.indices, W.indptr):
                h.update(np.ascontiguousarray(part).tobytes())
        else:
            h.update(np.ascontiguousarray(self.W).tobytes())
        h.update(repr(sorted(self._user_unit.items())).encode())
        return h.hexdigest()[:16]
