"""Continual-release mechanisms: ``step(state, increment) -> (release, state, event)``.

Layers, bottom to top (``pyproject.toml``'s import contracts check them):

``base``           the :class:`Mechanism` protocol, :class:`TreeState`, :func:`noise_std`
``tree``           the binary tree (Laplace or Gaussian node noise; the papers' mechanism)
``honaker``        Honaker's online estimator on the same tree (42 % less variance)
``smooth``         the smooth binary mechanism (Andersson & Pagh 2023)
``factorization``  the buffered-linear-Toeplitz square-root factorization (log t error)
``userspace``      user-space noise ``(V ⊗ I) xi`` around any of the above
``registry``       :data:`MECHANISMS` and :func:`make_mechanism`: names → calibrated mechanisms

A new mechanism is one module beside ``tree``: it implements :class:`Mechanism`
over a :class:`TreeState`, returns an event of :mod:`models.accounting` from each
``step``, and gets a name in ``registry``. Nothing here imports ``registry``.
"""

from __future__ import annotations

from .base import Mechanism, NoiseKind, TreeState, check_sensitivity, levels_for_horizon, noise_std
from .discrete import DiscreteTreeMechanism
from .factorization import BLTMechanism, DiscreteBLTMechanism
from .honaker import HonakerTreeMechanism
from .registry import MECHANISMS, MechanismName, Sampler, make_mechanism
from .smooth import SmoothBinaryMechanism
from .tree import BinaryTreeMechanism
from .userspace import UserSpaceMechanism

__all__ = [
    "MECHANISMS",
    "BLTMechanism",
    "BinaryTreeMechanism",
    "DiscreteBLTMechanism",
    "DiscreteTreeMechanism",
    "HonakerTreeMechanism",
    "Mechanism",
    "MechanismName",
    "NoiseKind",
    "Sampler",
    "SmoothBinaryMechanism",
    "TreeState",
    "UserSpaceMechanism",
    "check_sensitivity",
    "levels_for_horizon",
    "make_mechanism",
    "noise_std",
]
