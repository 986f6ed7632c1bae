"""The ground floor of every continual-release mechanism: the protocol, the state, helpers.

Every mechanism in this package implements :class:`Mechanism` over a
:class:`TreeState` (the binary tree's state, reused by the other mechanisms:
``nodes`` holds whatever noise buffers they keep). :func:`noise_std` reads the
public noise level of a release from the calibration and the tick count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from models.accounting import DpEvent
from models.ground.codec import decode_arrays, encode_arrays
from models.ground.graphs import column_norms

__all__ = ["Mechanism", "TreeState", "NoiseKind", "levels_for_horizon", "check_sensitivity", "noise_std"]

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


class IncrementSteps:
    """``step`` / ``step_to`` for a mechanism that works on the tick's *increment* (``_advance(state, prefix, inc)``):
    the discrete mechanisms round the increment to their grid, so both entry points pass it explicitly."""

    def step(self, state: TreeState, increment: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        """Add one tick's increment, used as given (the form the privacy proof covers)."""
        inc = self._check_vector(increment, "increment")  # type: ignore[attr-defined]
        return self._advance(state, state.prefix + inc, inc)  # type: ignore[attr-defined,no-any-return]

    def step_to(self, state: TreeState, prefix: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        """Advance one tick whose exact running sum is ``prefix`` (increment ``prefix - state.prefix``)."""
        prefix = self._check_vector(prefix, "prefix")  # type: ignore[attr-defined]
        return self._advance(state, prefix, prefix - state.prefix)  # type: ignore[attr-defined,no-any-return]


def state_with_nodes(mapping: dict[str, bytes] | dict[bytes, bytes], shape: tuple[int, int]) -> TreeState:
    """Decode a state written by ``state.to_mapping()``, checking its ``nodes`` have the mechanism's ``shape``."""
    state = TreeState.from_mapping(mapping)
    if state.nodes.shape != shape:
        raise ValueError(f"state has nodes of shape {state.nodes.shape}, expected {shape}.")
    return state


def check_sensitivity(value: float, name: str = "sensitivity") -> float:
    v = float(value)
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"`{name}` must be finite and non-negative, got {value}.")
    return v



def noise_std(mechanism: Mechanism, state: TreeState) -> float:
    """Largest per-coordinate standard deviation of the noise in the last release from ``state``.

    A function of the calibration and the tick count only (public), so the
    serving side may use it — e.g. to scale a regularizer — as post-processing.
    Closed epochs add their last release's variance (frozen in ``carry``).

    >>> from models.mechanisms import BinaryTreeMechanism
    >>> mech = BinaryTreeMechanism(dim=1, levels=3, noise="gaussian", scale=2.0, seed=0)
    >>> s = mech.init_state()
    >>> for _ in range(3):  # t = 3 = 11b: two live nodes
    ...     _, s, _ = mech.step(s, np.zeros(1))
    >>> noise_std(mech, s) == 2.0 * 2 ** 0.5
    True
    """
    inner = getattr(mechanism, "inner", None)
    if inner is not None:  # user-space noise (V ⊗ I) xi: coordinate j has std ||V[j, :]|| std(xi)
        return noise_std(inner, state) * float(column_norms(getattr(mechanism, "mixing").T).max())
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
