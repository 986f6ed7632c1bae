"""Release's math: exact :class:`~models.streaming.stats.UnitStats` → :class:`ReleasedStats`, one tick per call.

The Gram matrices depend only on public contexts and are released as they
are; the reward-dependent vector ``b_tilde = vec(B V^T)`` (``(V ⊗ I_d) b``)
goes through a continual-release mechanism, one tick at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from models.accounting import DpEvent, NoNoiseEvent
from models.ground.codec import decode_arrays, encode_arrays
from models.ground.graphs import is_sparse
from models.mechanisms import Mechanism, TreeState, noise_std

from .stats import UnitStats

__all__ = ["ReleasedStats", "Releaser", "STRUCTURES", "SPARSE_STRUCTURES"]

FloatArray = NDArray[np.float64]
#: ``linucb``: block-diagonal; ``kron``: CoLin / GOB.Lin over units, a dense ``dN x dN`` solve; ``sparse-kron``:
#: CoLin over every user with a sparse ``V``; ``laplacian``: GOB.Lin over every user (``V = I``, sparse ``Q = I + L``).
#: The last two are solved matrix-free (:mod:`models.streaming.sparse`).
STRUCTURES = ("linucb", "kron", "sparse-kron", "laplacian")
SPARSE_STRUCTURES = ("sparse-kron", "laplacian")


def _encode_sparse(name: str, M: Any) -> dict[str, NDArray[Any]]:
    C = sp.csr_matrix(M)
    return {f"{name}_data": C.data.astype(np.float64), f"{name}_indices": C.indices.astype(np.int64),
            f"{name}_indptr": C.indptr.astype(np.int64), f"{name}_shape": np.array(C.shape, dtype=np.int64)}


def _decode_sparse(name: str, a: dict[str, NDArray[Any]]) -> Any:
    rows, cols = (int(v) for v in a[f"{name}_shape"])
    shape = (rows, cols)
    return sp.csr_matrix((a[f"{name}_data"].astype(np.float64), a[f"{name}_indices"], a[f"{name}_indptr"]),
                         shape=shape)


@dataclass(frozen=True, slots=True)
class ReleasedStats:
    """What may leave the trusted boundary: exact Grams, the noisy ``b_tilde``, and ``V``.

    Attributes
    ----------
    structure
        One of :data:`STRUCTURES`.
    V
        ``N x N`` mixing matrix (public): dense, or a scipy sparse matrix when it is sparse (every-user graphs:
        stored as CSR, never densified).
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
    #: ``laplacian``: the sparse regulariser ``Q = I + L`` (public); ``None`` otherwise.
    Q: Any = None

    SCHEMA = "privrec.ReleasedStats/1"

    def to_mapping(self) -> dict[str, bytes]:
        arrays: dict[str, NDArray[Any]] = {"gram": self.gram, "b_tilde": self.b_tilde, "count": self.count}
        if is_sparse(self.V):
            arrays |= _encode_sparse("V", self.V)
        else:
            arrays["V"] = self.V
        if self.Q is not None:
            arrays |= _encode_sparse("Q", self.Q)
        return encode_arrays(arrays, scalars={"structure": self.structure, "version": self.version,
                                              "noise_std": self.noise_std}, schema=self.SCHEMA)

    @classmethod
    def from_mapping(cls, mapping: dict[str, bytes] | dict[bytes, bytes]) -> ReleasedStats:
        a, s = decode_arrays(mapping, schema=cls.SCHEMA)  # type: ignore[arg-type]
        V = a["V"].astype(np.float64) if "V" in a else _decode_sparse("V", a)
        Q = _decode_sparse("Q", a) if "Q_data" in a else None
        return cls(str(s["structure"]), V, a["gram"].astype(np.float64),
                   a["b_tilde"].astype(np.float64), a["count"].astype(np.int64), int(s["version"]),  # type: ignore[arg-type]
                   noise_std=float(s.get("noise_std") or 0.0), Q=Q)


class Releaser:
    """Release stage: exact :class:`UnitStats` → :class:`ReleasedStats`, one tick per call.

    Parameters
    ----------
    structure
        ``"linucb"`` (``V = I``: the private vector is ``B`` itself),
        ``"kron"`` (CoLin / GOB.Lin: ``b_tilde = vec(V B)`` row-blocks), ``"sparse-kron"`` (the same with a
        sparse ``V``) or ``"laplacian"`` (GOB.Lin over every user: ``V = I``, ``Q = I + L``).
    V
        ``N x N`` mixing matrix (dense or scipy sparse).
    Q
        ``laplacian`` only: the sparse regulariser ``I + L``, published with every release.
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

    def __init__(self, *, structure: str, V: Any, d: int, mechanism: Mechanism | None, Q: Any = None) -> None:
        if structure not in STRUCTURES:
            raise ValueError(f"`structure` must be one of {STRUCTURES}, got {structure!r}.")
        raw: Any = V
        V = sp.csr_matrix(raw, dtype=np.float64) if is_sparse(raw) else np.asarray(raw, dtype=np.float64)
        if structure in ("linucb", "laplacian") and not _is_identity(V):
            raise ValueError(f"`V` must be the identity for structure {structure!r}.")
        if (structure == "laplacian") != (Q is not None):
            raise ValueError("`Q` is required for structure 'laplacian' and only there.")
        if mechanism is not None and mechanism.dim != V.shape[0] * d:
            raise ValueError(f"`mechanism` must release {V.shape[0] * d} values, got dim {mechanism.dim}.")
        self.structure, self.V, self.d, self.mechanism = structure, V, int(d), mechanism
        self.Q = None if Q is None else sp.csr_matrix(Q, dtype=np.float64)

    def init_state(self) -> TreeState | None:
        return None if self.mechanism is None else self.mechanism.init_state()

    def exact_b_tilde(self, stats: UnitStats) -> FloatArray:
        """``(V ⊗ I_d) vec(B)``: block ``j`` is ``sum_u V[j, u] b_u`` (exact, trusted)."""
        if self.structure in ("linucb", "laplacian"):
            return stats.b.reshape(-1).copy()
        out: FloatArray = np.asarray(self.V @ stats.b).reshape(-1)
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
                            std, self.Q)
        return rel, state


def _is_identity(V: Any) -> bool:
    n = int(V.shape[0])
    if is_sparse(V):
        C: Any = sp.csr_matrix(V)
        return bool(n == int(V.shape[1]) and (C != sp.identity(n, format="csr")).nnz == 0)
    return bool(np.array_equal(V, np.eye(V.shape[0])))
