"""Release's math: exact :class:`~models.streaming.stats.UnitStats` → :class:`ReleasedStats`, one tick per call.

The Gram matrices depend only on public contexts and are released as they
are; the reward-dependent vector ``b_tilde = vec(B V^T)`` (``(V ⊗ I_d) b``)
goes through a continual-release mechanism, one tick at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from models.accounting import DpEvent, NoNoiseEvent
from models.ground.codec import decode_arrays, encode_arrays
from models.mechanisms import Mechanism, TreeState, noise_std

from .stats import UnitStats

__all__ = ["ReleasedStats", "Releaser"]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ReleasedStats:
    """What may leave the trusted boundary: exact Grams, the noisy ``b_tilde``, and ``V``.

    Attributes
    ----------
    structure
        ``"linucb"`` (block-diagonal) or ``"kron"`` (dense ``dN x dN`` Gram).
    V
        ``N x N`` mixing matrix (public).
    gram
        ``(N, d, d)`` per-unit Gram matrices of chosen contexts (public data).
    b_tilde
        ``(N*d,)`` released ``(V ⊗ I_d) b`` (noisy unless the mechanism is off).
    count
        ``(N,)`` interactions per unit (public).
    version
        Release tick that produced it.
    noise_std
        Largest per-coordinate std of the noise in ``b_tilde``
        (:func:`models.mechanisms.noise_std`; public: it depends on the
        calibration and the tick count only). ``0`` without noise.
    """

    structure: str
    V: FloatArray
    gram: FloatArray
    b_tilde: FloatArray
    count: NDArray[np.int64]
    version: int = 0
    event: DpEvent = field(default_factory=NoNoiseEvent)
    noise_std: float = 0.0

    SCHEMA = "privrec.ReleasedStats/1"

    def to_mapping(self) -> dict[str, bytes]:
        return encode_arrays({"V": self.V, "gram": self.gram, "b_tilde": self.b_tilde, "count": self.count},
                             scalars={"structure": self.structure, "version": self.version,
                                      "noise_std": self.noise_std}, schema=self.SCHEMA)

    @classmethod
    def from_mapping(cls, mapping: dict[str, bytes] | dict[bytes, bytes]) -> ReleasedStats:
        a, s = decode_arrays(mapping, schema=cls.SCHEMA)  # type: ignore[arg-type]
        return cls(str(s["structure"]), a["V"].astype(np.float64), a["gram"].astype(np.float64),
                   a["b_tilde"].astype(np.float64), a["count"].astype(np.int64), int(s["version"]),  # type: ignore[arg-type]
                   noise_std=float(s.get("noise_std") or 0.0))


class Releaser:
    """Release stage: exact :class:`UnitStats` → :class:`ReleasedStats`, one tick per call.

    Parameters
    ----------
    structure
        ``"linucb"`` (``V = I``: the private vector is ``B`` itself) or
        ``"kron"`` (CoLin / GOB.Lin: ``b_tilde = vec(V B)`` row-blocks).
    V
        ``N x N`` mixing matrix.
    d
        Context dimension.
    mechanism
        Continual-release mechanism over the ``N*d`` vector (calibrated to
        ``max_u Lx ||V[:, u]||``), or ``None`` for no noise.

    Privacy
    -------
    Event-level: one interaction of unit ``u`` changes ``b_tilde`` by
    ``kron(V[:, u], x) * (r - r')``, of L2 norm at most ``Lx ||V[:, u]||_2``
    for rewards in ``[0, 1]`` (the pipeline rejects rewards outside it).
    Grams and counts depend on public data only.
    """

    def __init__(self, *, structure: str, V: FloatArray, d: int, mechanism: Mechanism | None) -> None:
        if structure not in ("linucb", "kron"):
            raise ValueError(f"`structure` must be 'linucb' or 'kron', got {structure!r}.")
        V = np.asarray(V, dtype=np.float64)
        if structure == "linucb" and not np.array_equal(V, np.eye(V.shape[0])):
            raise ValueError("`V` must be the identity for structure 'linucb'.")
        if mechanism is not None and mechanism.dim != V.shape[0] * d:
            raise ValueError(f"`mechanism` must release {V.shape[0] * d} values, got dim {mechanism.dim}.")
        self.structure, self.V, self.d, self.mechanism = structure, V, int(d), mechanism

    def init_state(self) -> TreeState | None:
        return None if self.mechanism is None else self.mechanism.init_state()

    def exact_b_tilde(self, stats: UnitStats) -> FloatArray:
        """``(V ⊗ I_d) vec(B)``: block ``j`` is ``sum_u V[j, u] b_u`` (exact, trusted)."""
        if self.structure == "linucb":
            return stats.b.reshape(-1).copy()
        out: FloatArray = (self.V @ stats.b).reshape(-1)
        return out

    def release(self, stats: UnitStats, state: TreeState | None, version: int = 0
                ) -> tuple[ReleasedStats, TreeState | None]:
        """One tick: noisy prefix of ``b_tilde`` plus the public Grams. Persist the new state *first*."""
        exact = self.exact_b_tilde(stats)
        event: DpEvent = NoNoiseEvent()
        std = 0.0
        if self.mechanism is not None:
            if state is None:
                raise ValueError("`state` is required when a mechanism is set.")
            exact, state, event = self.mechanism.step_to(state, exact)
            std = noise_std(self.mechanism, state)
        rel = ReleasedStats(self.structure, self.V, stats.gram.copy(), exact, stats.count.copy(), version, event,
                            std)
        return rel, state
