"""Privacy events: what a mechanism spent, as frozen data (after ``dp_accounting``).

A mechanism describes what it spends with a frozen *event* (its
hyperparameters, nothing else); accountants (:mod:`models.accounting.accountants`)
turn events into guarantees. Events are append-only: add a type, never change
the meaning of a field. :func:`event_to_dict` / :func:`event_from_dict` give
the JSON form the pipeline publishes beside each release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = ["DpEvent", "NoNoiseEvent", "LaplaceTreeEvent", "GaussianTreeEvent", "FactorizationEvent",
           "WishartTreeEvent", "DGSEvent", "DiscreteGaussianTreeEvent", "event_to_dict", "event_from_dict", "register_event_type",
           "gaussian_mu_squared"]


# --------------------------------------------------------------------------- events


@runtime_checkable
class DpEvent(Protocol):
    """What a mechanism spent; frozen, append-only (add types, never change fields)."""

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True, slots=True)
class NoNoiseEvent:
    """A release without noise (``epsilon = inf``): no privacy."""

    kind: str = field(default="none", init=False)


@dataclass(frozen=True, slots=True)
class LaplaceTreeEvent:
    """A continual-release tree with i.i.d. Laplace node noise.

    Attributes
    ----------
    noise_multiplier
        Per-node, per-coordinate Laplace scale divided by the sensitivity it
        was calibrated to.
    max_nodes_per_leaf
        ``h``: the most node releases one leaf (one interaction) touches.
    sensitivity_norm
        ``"l1"`` (a valid pure-DP calibration) or ``"l2"`` (the papers'
        calibration, not a valid pure-DP guarantee).
    """

    noise_multiplier: float
    max_nodes_per_leaf: int
    sensitivity_norm: Literal["l1", "l2"] = "l1"
    kind: str = field(default="laplace_tree", init=False)


@dataclass(frozen=True, slots=True)
class GaussianTreeEvent:
    """A continual-release tree with i.i.d. Gaussian node noise.

    Attributes
    ----------
    noise_multiplier
        Per-node, per-coordinate std divided by the L2 sensitivity of a leaf.
    max_nodes_per_leaf
        ``h``: the most node releases one leaf touches.
    """

    noise_multiplier: float
    max_nodes_per_leaf: int
    kind: str = field(default="gaussian_tree", init=False)


@dataclass(frozen=True, slots=True)
class DiscreteGaussianTreeEvent:
    """A continual-release tree with i.i.d. *discrete* Gaussian node noise on a grid (no float artefacts).

    The discrete Gaussian satisfies ``rho = Delta**2 / (2 sigma**2)`` zCDP (Canonne, Kamath & Steinke 2020,
    Thm 14 for the multivariate product), not the continuous Gaussian's exact privacy profile: it is
    accounted in zCDP only. ``noise_multiplier`` is relative to the rounded increment's sensitivity
    (``Delta + grid sqrt(d)``), so it already covers the rounding to the grid.
    """

    noise_multiplier: float
    max_nodes_per_leaf: int
    grid: float
    kind: str = field(default="discrete_gaussian_tree", init=False)


@dataclass(frozen=True, slots=True)
class FactorizationEvent:
    """A matrix-factorization mechanism ``A x + B z`` with ``A = B C`` and Gaussian ``z``.

    The release is a post-processing (by ``B``) of the Gaussian mechanism
    ``C x + z``; one increment (L2 sensitivity ``Delta``) changes ``C x`` by at
    most ``Delta * column_norm`` (the largest column norm of ``C`` over one
    epoch), so the whole stream is ``mu``-GDP with
    ``mu = column_norm / noise_multiplier`` (Denisov et al. 2022, Thm 2.1:
    this also holds for adaptively chosen increments, ``C`` lower-triangular).

    Attributes
    ----------
    noise_multiplier
        Per-coordinate std of ``z`` divided by the L2 sensitivity ``Delta``.
    column_norm
        ``max_j ||C[:, j]||_2`` over one epoch.
    """

    noise_multiplier: float
    column_norm: float
    kind: str = field(default="factorization", init=False)


@dataclass(frozen=True, slots=True)
class WishartTreeEvent:
    """Shariff & Sheffet's Wishart tree: per-node ``(epsilon_node, delta_node)`` by Sheffet (2015, Thm 4.1).

    The guarantee is the paper's (advanced composition over
    ``max_nodes_per_leaf`` nodes; spec tree-dp A.2), taken as stated: the
    per-node Wishart bound is a published theorem that no accountant here
    re-derives. ``epsilon`` and ``delta`` are the totals the calibration
    targeted (for replace-one neighbours the calibration runs at ``epsilon/2``,
    ERRATA §6 / spec D.5).
    """

    degrees_of_freedom: int
    max_nodes_per_leaf: int
    epsilon: float
    delta: float
    kind: str = field(default="wishart_tree", init=False)


@dataclass(frozen=True, slots=True)
class DGSEvent:
    """Dynamic global sensitivity (Wang, Zhao, Wang 2022): tree noise on ``theta`` with shrinking scale.

    Recorded so that ledgers see the release, but **not a valid DP proof**:
    one reward changes every later tree leaf, not ``max_nodes_per_leaf`` of
    them (spec tree-dp B.5-1), and the sensitivity bound holds only with
    probability ``1 - delta`` under an i.i.d.-context assumption (B.5-2).
    ``epsilon``/``delta`` are the paper's claimed totals.
    """

    noise: str
    epsilon: float
    delta: float
    max_nodes_per_leaf: int
    kind: str = field(default="dgs_tree", init=False)


def gaussian_mu_squared(event: GaussianTreeEvent | FactorizationEvent) -> float:
    """``mu**2`` of one Gaussian event (``inf`` without noise)."""
    nm = event.noise_multiplier
    if nm == 0:
        return math.inf
    if isinstance(event, FactorizationEvent):
        return (event.column_norm / nm) ** 2
    return event.max_nodes_per_leaf / nm**2


_EVENT_TYPES: dict[str, type] = {"none": NoNoiseEvent, "laplace_tree": LaplaceTreeEvent,
                                 "gaussian_tree": GaussianTreeEvent, "factorization": FactorizationEvent,
                                 "wishart_tree": WishartTreeEvent, "dgs_tree": DGSEvent,
                                 "discrete_gaussian_tree": DiscreteGaussianTreeEvent}


def event_to_dict(event: DpEvent) -> dict[str, object]:
    """A JSON-able description of an event (``kind`` plus its fields).

    >>> event_from_dict(event_to_dict(GaussianTreeEvent(2.0, 5))) == GaussianTreeEvent(2.0, 5)
    True
    """
    fields = {f: getattr(event, f) for f in getattr(event, "__dataclass_fields__", {}) if f != "kind"}
    return {"kind": event.kind, **fields}


def event_from_dict(data: dict[str, object]) -> DpEvent:
    """Inverse of :func:`event_to_dict`."""
    kind = data.get("kind")
    cls = _EVENT_TYPES.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; known: {sorted(_EVENT_TYPES)}.")
    out: DpEvent = cls(**{k: v for k, v in data.items() if k != "kind"})
    return out


def register_event_type(kind: str, cls: type) -> None:
    """Make :func:`event_from_dict` know a new event type (append-only)."""
    if kind in _EVENT_TYPES and _EVENT_TYPES[kind] is not cls:
        raise ValueError(f"event kind {kind!r} is already registered.")
    _EVENT_TYPES[kind] = cls
