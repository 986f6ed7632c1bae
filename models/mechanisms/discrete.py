"""The binary tree with discrete Gaussian node noise on a grid: continual release without float artefacts.

Each tick's increment is rounded to the grid ``gamma`` (a power of two, so grid values are exact
doubles), the rounded increments are summed exactly on the grid, and every node's noise is ``gamma``
times a discrete Gaussian integer (:mod:`models.ground.discrete`, driven by the keyed Philox source:
restorable, never redrawn). A release is therefore a multiple of ``gamma`` whose value does not depend
on how a floating-point sampler rounds.

Privacy: neighbouring streams differ in one tick's exact increment by at most ``Delta``, so its rounded
increment differs by at most ``Delta + gamma sqrt(d)`` (each coordinate's rounding moves by at most
``gamma``); that is the sensitivity the noise is calibrated to. The discrete Gaussian with variance
parameter ``sigma^2`` is ``Delta'^2 / (2 sigma^2)``-zCDP per node (Canonne, Kamath & Steinke 2020,
Thm 14); a leaf touches ``h`` nodes: ``rho = h Delta'^2 / (2 sigma^2)``, converted to (epsilon, delta).
The released sum is the sum of rounded increments: it is off the exact prefix by at most
``t gamma sqrt(d) / 2`` after ``t`` ticks (2e-5 at ``gamma = 2^-30``, 16,383 ticks, ``d = 25``).

The node noise is ``gamma Z`` with ``Z ~ N_Z(0, s^2)``, ``s = ceil(sigma / gamma)`` (never less than the
calibrated ``sigma``), drawn by :meth:`models.ground.noise.KeyedNoise.discrete_gaussian_integers`. Adaptive
increments: per tick the rounded increment is a fixed function of the data given the history, so the zCDP
bound composes adaptively (Bun & Steinke 2016), as for the float tree.

Inputs: :meth:`step` rounds the caller's increment itself. :meth:`step_to` rounds ``prefix - state.prefix``,
which equals the exact increment only when that float subtraction is exact (e.g. prefixes that are sums of grid
values, or integers); otherwise float error in the caller's prefixes can move the rounding of *other* ticks too,
which the sensitivity bound above does not cover (it would need ``|error| << gamma``, true unless an increment
lies within an ulp of a grid midpoint).

Cost: the exact sampler runs in Python on integers — see ``privrec bench noise``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from models.accounting import DiscreteGaussianTreeEvent, DpEvent, NoNoiseEvent
from models.accounting.conversions import check_delta, check_epsilon, rho_from_epsilon
from models.ground.noise import check_grid, grid_units

from .base import IncrementSteps, TreeState, check_sensitivity, levels_for_horizon, state_with_nodes
from .tree import BinaryTreeMechanism

__all__ = ["DiscreteTreeMechanism", "DEFAULT_GRID"]

FloatArray = NDArray[np.float64]

#: The grid of the released values: fine enough that rounding costs nothing measurable, coarse enough that
#: sums of 2**14 grid values stay exact doubles.
DEFAULT_GRID = 2.0**-30


class DiscreteTreeMechanism(IncrementSteps, BinaryTreeMechanism):
    """Binary tree, discrete Gaussian nodes on the grid ``grid`` (see the module docstring).

    State: ``nodes`` has ``levels + 1`` rows: the live nodes' noise (as the binary tree) and, last, the
    exact sum of the rounded increments.

    >>> m = DiscreteTreeMechanism.calibrate(dim=3, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=7, seed=1)
    >>> s = m.init_state()
    >>> r, s, _ = m.step_to(s, np.array([0.3, -0.7, 0.5]))
    >>> bool(np.all(r / m.grid == np.round(r / m.grid)))   # on the grid
    True
    """

    name = "discrete-binary"

    def __init__(self, *, dim: int, levels: int, scale: float, seed: int | None, grid: float = DEFAULT_GRID,
                 stream: int = 0, event: DpEvent | None = None) -> None:
        super().__init__(dim=dim, levels=levels, noise="gaussian", scale=scale, seed=seed, stream=stream, event=event)
        if not (grid > 0 and math.log2(grid).is_integer()):
            raise ValueError(f"`grid` must be a power of two, got {grid}.")
        self.grid = check_grid(grid)
        self.units = grid_units(scale, self.grid)  # the discrete Gaussian's parameter in grid units: ceil(sigma/grid)

    @classmethod
    def calibrate(cls, *, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int,
                  seed: int | None, stream: int = 0, grid: float = DEFAULT_GRID) -> DiscreteTreeMechanism:
        """(epsilon, delta)-DP through zCDP, for the rounded increment's sensitivity ``Delta + grid sqrt(d)``."""
        eps, h = check_epsilon(epsilon), levels_for_horizon(horizon)
        check_delta(delta)
        sens = check_sensitivity(sensitivity) + grid * math.sqrt(dim)
        if math.isinf(eps):
            return cls(dim=dim, levels=h, scale=0.0, seed=seed, grid=grid, stream=stream, event=NoNoiseEvent())
        nm = math.sqrt(h / (2.0 * rho_from_epsilon(eps, delta)))
        return cls(dim=dim, levels=h, scale=sens * nm, seed=seed, grid=grid, stream=stream,
                   event=DiscreteGaussianTreeEvent(nm, h, grid))

    def node_variance(self) -> float:
        """An upper bound on one node's per-coordinate variance: ``(grid ceil(sigma / grid))^2`` (CKS Prop. 16)."""
        return (self.grid * self.units) ** 2

    def init_state(self) -> TreeState:
        z = np.zeros(self.dim)
        return TreeState(step=0, epoch=0, prefix=z, carry=z.copy(), nodes=np.zeros((self.levels + 1, self.dim)))

    def reset_state(self, state: TreeState) -> TreeState:
        nodes = np.zeros_like(state.nodes)
        nodes[-1] = state.nodes[-1]  # the running sum of rounded increments continues
        return replace(state, step=0, epoch=state.epoch + 1, carry=self.noise(state), nodes=nodes)

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        return state_with_nodes(mapping, (self.levels + 1, self.dim))

    def noise(self, state: TreeState) -> FloatArray:
        out: FloatArray = state.carry + state.nodes[:-1].sum(axis=0)
        return out


    def _advance(self, state: TreeState, prefix: FloatArray, inc: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        if state.step >= self.capacity:
            state = self.reset_state(state)
        t = state.step + 1
        rounded = inc if self.scale == 0 else self.grid * np.round(inc / self.grid)  # noise off: nothing to harden
        nodes = state.nodes.copy()
        nodes[:-1] = self._advance_nodes(replace(state, nodes=state.nodes[:-1]), t)
        nodes[-1] = state.nodes[-1] + rounded
        new = TreeState(step=t, epoch=state.epoch, prefix=prefix, carry=state.carry, nodes=nodes)
        return nodes[-1] + self.noise(new), new, self._event

    def _draw(self, epoch: int, level: int, index: int) -> FloatArray:
        if self.scale == 0:
            return np.zeros(self.dim)
        return self._source.discrete_gaussian(self.scale, (self.dim,), epoch=epoch, level=level, index=index,
                                              gamma=self.grid)
