"""Continual-release mechanisms: ``step(state, increment) -> (release, state, event)``.

A continual-release mechanism publishes, after every tick, a noisy prefix sum
of a stream of vector increments. Every mechanism here releases

    release_t = prefix_t + eta_t,

where ``prefix_t`` is the exact running sum and ``eta_t`` is noise that
depends only on the secret key and the tick count, never on the data. Node
noise is *keyed* (:mod:`models.noise`): a pure function of
``(seed, stream, epoch, level, index)``, so a restored state can never draw
different noise for a node that was already released.

Streams have no known end: a tree covers ``capacity = 2**levels - 1`` ticks
(one *epoch*), then a new tree starts; the noise of the closed epoch's last
release is frozen into ``carry``. Each increment belongs to exactly one
epoch, so the per-increment privacy cost is that of one tree.

Verbs (STYLE.md): ``init_state()``, ``step(state, increment)``,
``step_to(state, prefix)`` (the caller holds the exact prefix) and
``reset_state(state)`` (start a new epoch). States are frozen dataclasses
with ``to_mapping()`` / ``from_mapping()`` codecs.

Examples
--------
Noise switched off, the release is the exact prefix sum:

>>> import numpy as np
>>> mech = BinaryTreeMechanism(dim=1, levels=3, noise="gaussian", scale=0.0, seed=0)
>>> state = mech.init_state()
>>> for x in [1.0, 2.0, 3.0]:
...     release, state, event = mech.step(state, np.array([x]))
>>> release
array([6.])

References
----------
Dwork, Naor, Pitassi, Rothblum (2010), "Differential privacy under continual
observation"; Chan, Shi, Song (2011), "Private and continual release of
statistics" (the binary mechanism).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from ._codec import decode_arrays, encode_arrays
from .accounting import (
    DpEvent,
    GaussianTreeEvent,
    LaplaceTreeEvent,
    NoNoiseEvent,
    check_delta,
    check_epsilon,
    gdp_mu,
    rho_from_epsilon,
)
from .noise import KeyedNoise

__all__ = [
    "Mechanism",
    "TreeState",
    "BinaryTreeMechanism",
    "levels_for_horizon",
    "make_mechanism",
    "MECHANISMS",
]

FloatArray = NDArray[np.float64]


def levels_for_horizon(horizon: int) -> int:
    """``h = bitlength(horizon)``: levels of a binary tree over ``horizon`` leaves (ERRATA §1).

    >>> [levels_for_horizon(T) for T in (1, 7, 8, 1024, 10_000)]
    [1, 3, 4, 11, 14]
    """
    if int(horizon) < 1:
        raise ValueError(f"`horizon` must be a positive number of ticks, got {horizon}.")
    return int(horizon).bit_length()


class Mechanism(Protocol):
    """What every continual-release mechanism offers."""

    dim: int

    @property
    def event(self) -> DpEvent: ...

    def init_state(self) -> TreeState: ...

    def step(self, state: TreeState, increment: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]: ...

    def step_to(self, state: TreeState, prefix: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]: ...

    def noise(self, state: TreeState) -> FloatArray: ...

    def reset_state(self, state: TreeState) -> TreeState: ...

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState: ...


@dataclass(frozen=True, slots=True)
class TreeState:
    """State of a tree mechanism between ticks.

    Attributes
    ----------
    step
        Ticks released in the current epoch (0 right after a reset).
    epoch
        Index of the current tree.
    prefix
        Exact running sum of all increments so far (trusted data).
    carry
        Noise of the last release of every closed epoch, summed (frozen).
    nodes
        ``(levels, dim)``: per level, the noise state of the live node (for
        the binary mechanism: the node's noise where bit ``level`` of
        ``step`` is set, zeros elsewhere; other mechanisms document theirs).
    """

    step: int
    epoch: int
    prefix: FloatArray
    carry: FloatArray
    nodes: FloatArray

    SCHEMA = "privrec.TreeState/1"

    def to_mapping(self) -> dict[str, bytes]:
        return encode_arrays(
            {"prefix": self.prefix, "carry": self.carry, "nodes": self.nodes},
            scalars={"step": self.step, "epoch": self.epoch},
            schema=self.SCHEMA,
        )

    @classmethod
    def from_mapping(cls, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        arrays, scalars = decode_arrays(mapping, schema=cls.SCHEMA)  # type: ignore[arg-type]
        return cls(
            step=int(scalars["step"]),  # type: ignore[arg-type]
            epoch=int(scalars["epoch"]),  # type: ignore[arg-type]
            prefix=arrays["prefix"].astype(np.float64),
            carry=arrays["carry"].astype(np.float64),
            nodes=arrays["nodes"].astype(np.float64),
        )


NoiseKind = Literal["laplace", "gaussian"]


class BinaryTreeMechanism:
    """The binary (tree) mechanism with i.i.d. Laplace or Gaussian node noise.

    At tick ``t`` (1-based within an epoch) the node at level ``i = ctz(t)``
    completes; it gets fresh keyed noise, and the nodes below it are retired.
    The release is the exact prefix plus the noise of the nodes at the set
    bits of ``t``: ``Var(eta_t) = popcount(t) * Var(node)`` per coordinate.

    Parameters
    ----------
    dim
        Length of the released vector.
    levels
        ``h``; an epoch holds ``2**h - 1`` ticks and every tick lies in at
        most ``h`` nodes.
    noise
        ``"laplace"`` or ``"gaussian"``.
    scale
        Per-node, per-coordinate Laplace scale ``b`` or Gaussian std
        ``sigma``; ``0`` switches noise off.
    seed, stream
        Secret key of the node noise (see :class:`models.noise.KeyedNoise`).
    event
        The privacy event this calibration spends (built by the factories).

    Privacy
    -------
    Event-level, replace-one. One increment lies in at most ``levels`` nodes of
    its epoch's tree and in no other epoch. With Gaussian noise ``sigma`` and
    L2 sensitivity ``Delta`` this is ``GaussianTreeEvent(sigma/Delta, levels)``;
    with Laplace it is ``LaplaceTreeEvent(b/Delta, levels, norm)`` — pure DP
    only if ``Delta`` is the L1 sensitivity. Use the factories
    :meth:`paper`, :meth:`laplace_l1`, :meth:`gaussian` to calibrate.

    Examples
    --------
    The same key gives the same noise; a restored state continues identically:

    >>> import numpy as np
    >>> mech = BinaryTreeMechanism.gaussian(dim=2, sensitivity=1.0, epsilon=2.0,
    ...                                     delta=1e-5, horizon=8, seed=3)
    >>> s = mech.init_state()
    >>> r1, s, _ = mech.step(s, np.ones(2))
    >>> s2 = TreeState.from_mapping(s.to_mapping())
    >>> bool((mech.step(s, np.ones(2))[0] == mech.step(s2, np.ones(2))[0]).all())
    True
    """

    name = "binary"

    def __init__(
        self,
        *,
        dim: int,
        levels: int,
        noise: NoiseKind,
        scale: float,
        seed: int | None,
        stream: int = 0,
        event: DpEvent | None = None,
    ) -> None:
        if int(dim) < 1:
            raise ValueError(f"`dim` must be a positive integer, got {dim}.")
        if int(levels) < 1:
            raise ValueError(f"`levels` must be a positive integer, got {levels}.")
        if noise not in ("laplace", "gaussian"):
            raise ValueError(f"`noise` must be 'laplace' or 'gaussian', got {noise!r}.")
        if not (scale >= 0 and math.isfinite(scale)):
            raise ValueError(f"`scale` must be finite and non-negative, got {scale}.")
        if seed is None:
            raise ValueError("`seed` must be an integer: keyed noise needs a secret seed for exact restore.")
        self.dim = int(dim)
        self.levels = int(levels)
        self.noise_kind: NoiseKind = noise
        self.scale = float(scale)
        self.seed = int(seed)
        self.stream = int(stream)
        self._source = KeyedNoise(self.seed, self.stream)
        if event is None:
            event = NoNoiseEvent() if self.scale == 0 else (
                GaussianTreeEvent(self.scale, self.levels) if noise == "gaussian"
                else LaplaceTreeEvent(self.scale, self.levels, "l1"))
        self._event = event

    # ------------------------------------------------------------------ calibration

    @classmethod
    def paper(
        cls, *, dim: int, sensitivity: float, epsilon: float, horizon: int, seed: int | None, stream: int = 0
    ) -> BinaryTreeMechanism:
        """The papers' calibration: per-node ``Laplace(Delta_2 * h / epsilon)``.

        ``sensitivity`` is the **L2** sensitivity, as in the collaborative
        paper (Lemma 1). Labelled "paper": not a valid pure-DP guarantee
        (ERRATA §1).
        """
        eps, h, delta2 = check_epsilon(epsilon), levels_for_horizon(horizon), _check_sens(sensitivity)
        if math.isinf(eps):
            return cls(dim=dim, levels=h, noise="laplace", scale=0.0, seed=seed, stream=stream)
        b = delta2 * h / eps
        return cls(dim=dim, levels=h, noise="laplace", scale=b, seed=seed, stream=stream,
                   event=LaplaceTreeEvent(h / eps, h, "l2"))

    @classmethod
    def laplace_l1(
        cls, *, dim: int, sensitivity_l1: float, epsilon: float, horizon: int, seed: int | None, stream: int = 0
    ) -> BinaryTreeMechanism:
        """Valid pure ``epsilon``-DP: per-node ``Laplace(Delta_1 * h / epsilon)``."""
        eps, h, d1 = check_epsilon(epsilon), levels_for_horizon(horizon), _check_sens(sensitivity_l1, "sensitivity_l1")
        if math.isinf(eps):
            return cls(dim=dim, levels=h, noise="laplace", scale=0.0, seed=seed, stream=stream)
        return cls(dim=dim, levels=h, noise="laplace", scale=d1 * h / eps, seed=seed, stream=stream,
                   event=LaplaceTreeEvent(h / eps, h, "l1"))

    @classmethod
    def gaussian(
        cls,
        *,
        dim: int,
        sensitivity: float,
        epsilon: float,
        delta: float,
        horizon: int,
        seed: int | None,
        stream: int = 0,
        accounting: Literal["zcdp", "exact"] = "zcdp",
    ) -> BinaryTreeMechanism:
        """Gaussian node noise calibrated to ``(epsilon, delta)``-DP over L2 sensitivity.

        ``accounting="zcdp"``: ``sigma = Delta sqrt(h / (2 rho))`` with
        ``rho`` from :func:`~models.accounting.rho_from_epsilon`.
        ``accounting="exact"``: ``sigma = sqrt(h) Delta / mu`` with the exact
        Gaussian-DP ``mu`` (ERRATA §1, "optional improvement"; 12–27 % less
        noise).
        """
        eps, h, d2 = check_epsilon(epsilon), levels_for_horizon(horizon), _check_sens(sensitivity)
        check_delta(delta)
        if math.isinf(eps):
            return cls(dim=dim, levels=h, noise="gaussian", scale=0.0, seed=seed, stream=stream)
        if accounting == "zcdp":
            nm = math.sqrt(h / (2.0 * rho_from_epsilon(eps, delta)))
        elif accounting == "exact":
            nm = math.sqrt(h) / gdp_mu(eps, delta)
        else:
            raise ValueError(f"`accounting` must be 'zcdp' or 'exact', got {accounting!r}.")
        return cls(dim=dim, levels=h, noise="gaussian", scale=d2 * nm, seed=seed, stream=stream,
                   event=GaussianTreeEvent(nm, h))

    # ------------------------------------------------------------------ protocol

    @property
    def event(self) -> DpEvent:
        """What the whole stream spends per contributing interaction."""
        return self._event

    @property
    def capacity(self) -> int:
        """Ticks per epoch: ``2**levels - 1``."""
        return (1 << self.levels) - 1

    def node_variance(self) -> float:
        """Per-coordinate variance of one node's noise."""
        return 2.0 * self.scale**2 if self.noise_kind == "laplace" else self.scale**2

    def init_state(self) -> TreeState:
        z = np.zeros(self.dim)
        return TreeState(step=0, epoch=0, prefix=z, carry=z.copy(), nodes=np.zeros((self.levels, self.dim)))

    def reset_state(self, state: TreeState) -> TreeState:
        """Close the current epoch: freeze its last noise into ``carry``; start a new tree."""
        return replace(state, step=0, epoch=state.epoch + 1, carry=self.noise(state),
                       nodes=np.zeros_like(state.nodes))

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        """Decode a state written by ``state.to_mapping()``, checking it fits this mechanism."""
        state = TreeState.from_mapping(mapping)
        if state.nodes.shape != (self.levels, self.dim):
            raise ValueError(f"state has nodes of shape {state.nodes.shape}, expected {(self.levels, self.dim)}.")
        return state

    def noise(self, state: TreeState) -> FloatArray:
        """``eta`` of the last release: ``carry`` plus the live nodes' noise."""
        out: FloatArray = state.carry + state.nodes.sum(axis=0)
        return out

    def step(self, state: TreeState, increment: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        """Add one tick's increment; return ``(prefix + eta, new_state, event)``."""
        inc = self._check_vector(increment, "increment")
        return self.step_to(state, state.prefix + inc)

    def step_to(self, state: TreeState, prefix: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        """Advance one tick whose exact running sum is ``prefix`` (held by the caller)."""
        prefix = self._check_vector(prefix, "prefix")
        if state.step >= self.capacity:
            state = self.reset_state(state)
        t = state.step + 1
        nodes = self._advance_nodes(state, t)
        new = TreeState(step=t, epoch=state.epoch, prefix=prefix, carry=state.carry, nodes=nodes)
        return prefix + self.noise(new), new, self._event

    # ------------------------------------------------------------------ internals

    def _draw(self, epoch: int, level: int, index: int) -> FloatArray:
        src = self._source
        if self.noise_kind == "gaussian":
            return src.normal(self.scale, (self.dim,), epoch=epoch, level=level, index=index)
        return src.laplace(self.scale, (self.dim,), epoch=epoch, level=level, index=index)

    def _advance_nodes(self, state: TreeState, t: int) -> FloatArray:
        i = (t & -t).bit_length() - 1  # level of the node completing at t
        nodes = state.nodes.copy()
        nodes[:i] = 0.0
        nodes[i] = self._draw(state.epoch, i, t >> i)
        return nodes

    def _check_vector(self, v: FloatArray, name: str) -> FloatArray:
        a = np.asarray(v, dtype=np.float64)
        if a.shape != (self.dim,):
            raise ValueError(f"`{name}` must have shape ({self.dim},), got {a.shape}.")
        return a

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(dim={self.dim}, levels={self.levels}, noise={self.noise_kind!r}, "
                f"scale={self.scale:.6g}, event={self._event})")


def _check_sens(value: float, name: str = "sensitivity") -> float:
    v = float(value)
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"`{name}` must be finite and non-negative, got {value}.")
    return v


# --------------------------------------------------------------------------- registry

MechanismName = Literal["paper", "laplace-l1", "gaussian-zcdp", "gaussian-exact", "honaker-paper", "honaker-zcdp",
                        "honaker-exact", "smooth-zcdp", "smooth-exact", "blt-zcdp", "blt-exact",
                        "user-gaussian-exact", "user-honaker-exact", "user-blt-exact"]

#: Mechanism names accepted by :func:`make_mechanism`, with what they are.
MECHANISMS: dict[str, str] = {
    "paper": "binary tree, Laplace scaled to the L2 sensitivity (the papers' calibration; not a valid pure-DP proof)",
    "laplace-l1": "binary tree, Laplace scaled to the L1 sensitivity (valid pure epsilon-DP)",
    "gaussian-zcdp": "binary tree, Gaussian noise accounted in zCDP, converted to (epsilon, delta)",
    "gaussian-exact": "binary tree, Gaussian noise with exact Gaussian-DP accounting",
    "honaker-paper": "binary tree with Honaker's online estimator, the papers' Laplace-on-L2 calibration "
                     "(same noise as 'paper'; not a valid pure-DP proof)",
    "honaker-zcdp": "binary tree with Honaker's online estimator, Gaussian noise accounted in zCDP",
    "honaker-exact": "binary tree with Honaker's online estimator, Gaussian noise with exact Gaussian-DP accounting",
    "smooth-zcdp": "smooth binary mechanism (Andersson & Pagh 2023), Gaussian noise accounted in zCDP",
    "smooth-exact": "smooth binary mechanism (Andersson & Pagh 2023), Gaussian noise with exact Gaussian-DP accounting",
    "blt-zcdp": "buffered-linear-Toeplitz square-root factorization (4 buffers), Gaussian noise accounted in zCDP",
    "blt-exact": "buffered-linear-Toeplitz square-root factorization (4 buffers), Gaussian noise with exact "
                 "Gaussian-DP accounting on its largest column norm",
    "user-gaussian-exact": "'gaussian-exact' on the users' own statistics b_u (sensitivity Lx), mixed by the "
                           "public V: noise (V ⊗ I) xi shaped like the signal (same as the base for LinUCB)",
    "user-honaker-exact": "'honaker-exact' on the users' own statistics, mixed by V (see 'user-gaussian-exact')",
    "user-blt-exact": "'blt-exact' on the users' own statistics, mixed by V (see 'user-gaussian-exact')",
}


def make_mechanism(
    name: str,
    *,
    dim: int,
    sensitivity: float,
    epsilon: float,
    delta: float,
    horizon: int,
    seed: int,
    stream: int = 0,
    sensitivity_l1: float | None = None,
    mixing: NDArray[np.float64] | None = None,
    block_dim: int | None = None,
) -> Mechanism:
    """Build a calibrated mechanism by name (see :data:`MECHANISMS`).

    ``horizon`` is the number of ticks one epoch covers. ``sensitivity`` is
    the L2 sensitivity of one interaction on the released vector (L1 for
    ``"laplace-l1"``). ``"user-*"`` names also take the public ``mixing``
    matrix ``V`` and the user block length ``block_dim`` (default: identity,
    one block): their inner mechanism runs on the stacked user statistics
    with sensitivity ``sensitivity / max_u ||V[:, u]||_2`` (``= Lx`` when
    ``sensitivity = Lx max_u ||V[:, u]||_2``, as the policies compute it).
    """
    if name.startswith("user-") and name in MECHANISMS:
        from .userspace import UserSpaceMechanism

        V = np.eye(1) if mixing is None else np.asarray(mixing, dtype=np.float64)
        bd = int(dim) if mixing is None else int(block_dim or 0)
        col = float(np.linalg.norm(V, axis=0).max()) if V.size else 0.0
        if not col > 0:
            raise ValueError("`mixing` must have a non-zero column.")
        inner = make_mechanism(name[len("user-"):], dim=dim, sensitivity=float(sensitivity) / col, epsilon=epsilon,
                               delta=delta, horizon=horizon, seed=seed, stream=stream, sensitivity_l1=sensitivity_l1)
        return UserSpaceMechanism(inner, mixing=V, block_dim=bd)
    if name in _EXTRA_FACTORIES:
        return _EXTRA_FACTORIES[name](dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                      horizon=horizon, seed=seed, stream=stream)
    if name == "paper":
        return BinaryTreeMechanism.paper(dim=dim, sensitivity=sensitivity, epsilon=epsilon,
                                         horizon=horizon, seed=seed, stream=stream)
    if name == "laplace-l1":
        if sensitivity_l1 is None:
            raise ValueError("`sensitivity_l1` is required for the 'laplace-l1' mechanism.")
        return BinaryTreeMechanism.laplace_l1(dim=dim, sensitivity_l1=sensitivity_l1, epsilon=epsilon,
                                              horizon=horizon, seed=seed, stream=stream)
    if name in ("gaussian-zcdp", "gaussian-exact"):
        return BinaryTreeMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                            horizon=horizon, seed=seed, stream=stream,
                                            accounting="zcdp" if name == "gaussian-zcdp" else "exact")
    raise ValueError(f"`mechanism` must be one of {sorted(MECHANISMS)}, got {name!r}.")


def _honaker(calibration: str) -> Callable[..., Mechanism]:
    def build(*, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int, seed: int,
              stream: int) -> Mechanism:
        from .honaker import HonakerTreeMechanism

        if calibration == "paper":
            return HonakerTreeMechanism.paper(dim=dim, sensitivity=sensitivity, epsilon=epsilon, horizon=horizon,
                                              seed=seed, stream=stream)
        return HonakerTreeMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                             horizon=horizon, seed=seed, stream=stream,
                                             accounting=calibration)  # type: ignore[arg-type]
    return build


def _smooth(accounting: str) -> Callable[..., Mechanism]:
    def build(*, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int, seed: int,
              stream: int) -> Mechanism:
        from .smooth import SmoothBinaryMechanism

        return SmoothBinaryMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                              horizon=horizon, seed=seed, stream=stream,
                                              accounting=accounting)  # type: ignore[arg-type]
    return build


def _blt(accounting: str) -> Callable[..., Mechanism]:
    def build(*, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int, seed: int,
              stream: int) -> Mechanism:
        from .factorization import BLTMechanism

        return BLTMechanism.gaussian(dim=dim, sensitivity=sensitivity, epsilon=epsilon, delta=delta,
                                     horizon=horizon, seed=seed, stream=stream,
                                     accounting=accounting)  # type: ignore[arg-type]
    return build


# The mechanisms of models.honaker / .smooth / .factorization (imported lazily: they import this module).
_EXTRA_FACTORIES: dict[str, Callable[..., Mechanism]] = {
    "honaker-paper": _honaker("paper"),
    "honaker-zcdp": _honaker("zcdp"),
    "honaker-exact": _honaker("exact"),
    "smooth-zcdp": _smooth("zcdp"),
    "smooth-exact": _smooth("exact"),
    "blt-zcdp": _blt("zcdp"),
    "blt-exact": _blt("exact"),
}


def noise_std(mechanism: Mechanism, state: TreeState) -> float:
    """Largest per-coordinate standard deviation of the noise in the last release from ``state``.

    A function of the calibration and the tick count only (public), so the
    serving side may use it — e.g. to scale a regularizer — as post-processing.
    Closed epochs add their last release's variance (frozen in ``carry``).

    >>> mech = BinaryTreeMechanism(dim=1, levels=3, noise="gaussian", scale=2.0, seed=0)
    >>> s = mech.init_state()
    >>> for _ in range(3):  # t = 3 = 11b: two live nodes
    ...     _, s, _ = mech.step(s, np.zeros(1))
    >>> noise_std(mech, s) == 2.0 * 2 ** 0.5
    True
    """
    inner = getattr(mechanism, "inner", None)
    if inner is not None:  # user-space noise (V ⊗ I) xi: coordinate j has std ||V[j, :]|| std(xi)
        V = np.asarray(getattr(mechanism, "mixing"))
        return noise_std(inner, state) * float(np.linalg.norm(V, axis=1).max())
    prefix_variance = getattr(mechanism, "prefix_variance", None)
    if prefix_variance is not None:
        def var(t: int) -> float:
            return float(prefix_variance(t))
    elif hasattr(mechanism, "node_variance"):
        node = float(getattr(mechanism, "node_variance")())

        def var(t: int) -> float:
            return bin(t).count("1") * node
    else:
        raise ValueError(f"{type(mechanism).__name__} does not say its noise variance.")
    capacity = int(getattr(mechanism, "capacity"))
    total = state.epoch * var(capacity) + (var(state.step) if state.step > 0 else 0.0)
    return math.sqrt(total)
