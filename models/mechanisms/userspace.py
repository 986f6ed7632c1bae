"""User-space noise: privatise each user's own statistic, then mix with the public ``V``.

CoLin and GOB.Lin release ``b_tilde = (V ⊗ I_d) b``, where ``b`` stacks the
users' own reward-weighted context sums ``b_u = sum r x``. The papers add
isotropic noise to ``b_tilde``, calibrated to one interaction's effect on it,
``Lx max_u ||V[:, u]||_2``. That noise is as large in the directions of user
space that ``V`` barely excites as in the ones it excites strongly; the
estimator ``A^{-1} b_tilde`` amplifies exactly those weak directions (``W``
is ill-conditioned; spec table1-feasibility §6).

The alternative is to privatise ``b`` itself and post-process:

    b_tilde_released = (V ⊗ I_d) (b + xi) = b_tilde + (V ⊗ I_d) xi,

with ``xi`` from any continual-release mechanism over the ``dN`` vector
``b``. One interaction of user ``u`` changes only block ``u`` of ``b``, by
``x (r - r')``: L2 sensitivity ``Lx`` for rewards in ``[0, 1]``. The noise
``(V ⊗ I) xi`` has covariance ``sigma**2 (V V^T ⊗ I)``: shaped like the
signal, small where ``V`` is weak. For LinUCB (``V = I``) nothing changes.

:class:`UserSpaceMechanism` wraps any mechanism of :data:`~models.mechanisms.MECHANISMS`
(calibrated to ``Lx``) and releases ``prefix + (V ⊗ I) xi``; it takes the
``b_tilde`` prefix like every other mechanism, so it drops into
:class:`~models.policies.KroneckerUCB` and the pipeline's ``Releaser``
unchanged. The noise is data-independent, so ``b`` itself is never needed.

Examples
--------
>>> import numpy as np
>>> from models.mechanisms import make_mechanism
>>> W = np.array([[0.8, 0.3], [0.2, 0.7]])
>>> inner = make_mechanism("blt-exact", dim=4, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=8, seed=1)
>>> mech = UserSpaceMechanism(inner, mixing=W, block_dim=2)
>>> release, state, event = mech.step(mech.init_state(), np.zeros(4))
>>> xi = inner.noise(state).reshape(2, 2)  # row u: user u's own noise
>>> bool(np.allclose(release, (W @ xi).reshape(-1)))
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from models.accounting import DpEvent
from models.ground.graphs import is_sparse

from .base import Mechanism, TreeState

__all__ = ["UserSpaceMechanism"]

FloatArray = NDArray[np.float64]


class UserSpaceMechanism:
    """Noise ``(V ⊗ I_d) xi`` on ``b_tilde``, with ``xi`` from ``inner`` over the stacked user statistics.

    Parameters
    ----------
    inner
        A mechanism over ``N * block_dim`` values, calibrated to the L2
        sensitivity of one interaction on the *stacked user statistics*
        (``Lx`` for the bandits' ``b`` with rewards in ``[0, 1]``).
    mixing
        ``V`` (``N x N``, public; dense or scipy sparse): block ``j`` of the release gets
        ``sum_u V[j, u] xi_u``.
    block_dim
        ``d``, the length of one user's block.

    State: the inner mechanism's (its ``prefix`` holds the ``b_tilde``
    prefix; the inner noise never depends on it).

    Privacy
    -------
    The inner mechanism's guarantee, unchanged: event-level, replace-one;
    one interaction of user ``u`` changes only block ``u`` of the stacked
    statistic ``b``, by at most ``Lx`` in L2 norm, and the release
    ``(V ⊗ I)(b + xi)`` is a post-processing (``V`` is public) of the inner
    continual release of ``b``. Event: the inner mechanism's event, with the
    inner accountant.
    """

    def __init__(self, inner: Mechanism, *, mixing: Any, block_dim: int) -> None:
        m: Any = mixing
        V: Any = sp.csr_matrix(m, dtype=np.float64) if is_sparse(m) else np.asarray(m, dtype=np.float64)
        if V.ndim != 2 or V.shape[0] != V.shape[1]:
            raise ValueError(f"`mixing` must be a square N x N matrix, got shape {V.shape}.")
        if not np.isfinite(V.data if is_sparse(V) else V).all():
            raise ValueError("`mixing` must be finite.")
        if int(block_dim) < 1 or inner.dim != V.shape[0] * int(block_dim):
            raise ValueError(f"`block_dim` times N must equal the inner mechanism's dim {inner.dim}, "
                             f"got block_dim={block_dim} and N={V.shape[0]}.")
        self.inner = inner
        self.mixing = V
        self.block_dim = int(block_dim)
        self.dim = inner.dim
        n = int(V.shape[0])
        self.identity = (bool((V != sp.identity(n, format="csr")).nnz == 0) if is_sparse(V)
                         else bool(np.array_equal(V, np.eye(n))))

    @property
    def event(self) -> DpEvent:
        return self.inner.event

    @property
    def capacity(self) -> int:
        return int(getattr(self.inner, "capacity"))

    @property
    def scale(self) -> float:
        return float(getattr(self.inner, "scale", 0.0))

    @property
    def noise_kind(self) -> str:
        return str(getattr(self.inner, "noise_kind", "gaussian"))

    def init_state(self) -> TreeState:
        return self.inner.init_state()

    def reset_state(self, state: TreeState) -> TreeState:
        return self.inner.reset_state(state)

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        return self.inner.state_from_mapping(mapping)

    def noise(self, state: TreeState) -> FloatArray:
        """``(V ⊗ I) xi`` for the inner mechanism's last noise ``xi``."""
        xi = self.inner.noise(state)
        if self.identity:
            return xi
        out: FloatArray = np.asarray(self.mixing @ xi.reshape(self.mixing.shape[0], self.block_dim)).reshape(-1)
        return out

    def step(self, state: TreeState, increment: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        inc = np.asarray(increment, dtype=np.float64)
        if inc.shape != (self.dim,):
            raise ValueError(f"`increment` must have shape ({self.dim},), got {inc.shape}.")
        return self.step_to(state, state.prefix + inc)

    def step_to(self, state: TreeState, prefix: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        _, new, event = self.inner.step_to(state, prefix)
        return new.prefix + self.noise(new), new, event

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r}, N={self.mixing.shape[0]}, block_dim={self.block_dim})"
