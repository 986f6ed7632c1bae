"""CoLin / GOB.Lin with user-space noise: the policy side of :mod:`models.mechanisms.userspace`.

``make_policy`` returns :class:`UserSpaceKroneckerUCB` for the global ``"user-*"``
mechanisms, whose noise ``(V ⊗ I) xi`` needs the policy's ``V`` at construction.
"""

from __future__ import annotations

from models.mechanisms import make_mechanism

from .kronecker import KroneckerUCB

__all__ = ["UserSpaceKroneckerUCB"]


class UserSpaceKroneckerUCB(KroneckerUCB):
    """:class:`~models.policies.KroneckerUCB` whose global ``"user-*"`` mechanism gets the mixing ``V``.

    ``KroneckerUCB`` builds its mechanism by name without ``V``; this subclass
    rebuilds a global ``"user-*"`` mechanism with ``mixing=V`` and
    ``block_dim=d`` (everything else, including the state codecs, is
    inherited). Local mode is unchanged: each user's tree already sees only
    that user's data. ``make_policy`` returns this class for ``"user-*"``
    mechanisms.
    """

    def _build_mechanisms(self) -> None:
        super()._build_mechanisms()
        p = self.privacy
        if p.mode == "global" and p.mechanism.startswith("user-"):
            ticks = -(-p.horizon // p.tick)
            self.mechanism = make_mechanism(
                p.mechanism, dim=self.dim, sensitivity=p.sensitivity_scale * float(self.user_sensitivity.max()),
                epsilon=p.epsilon,
                delta=p.delta, horizon=ticks, seed=p.seed, stream=0, mixing=self.V, block_dim=self.d)
