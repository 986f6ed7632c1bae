"""Accountants: events in, an ``(epsilon, delta)`` guarantee out.

Accountants compose events and never touch mechanisms. ``describe`` gives the
guarantee of one event with the tightest accountant we have; ``group_guarantee``
the (loose) group-privacy bound over ``k`` interactions of one contributor.

Examples
--------
>>> ev = GaussianTreeEvent(noise_multiplier=9.35, max_nodes_per_leaf=14)
>>> g = ZCDPAccountant().compose(ev).guarantee(1e-5)
>>> (round(g.epsilon, 2), g.delta, g.valid)
(2.0, 1e-05, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .conversions import epsilon_from_rho, gdp_epsilon
from .events import (DGSEvent, DiscreteGaussianTreeEvent, DpEvent, FactorizationEvent, GaussianTreeEvent,
                     LaplaceTreeEvent, NoNoiseEvent, WishartTreeEvent, gaussian_mu_squared)

__all__ = ["Guarantee", "ZCDPAccountant", "GDPAccountant", "LaplaceAccountant", "UnsupportedEventError",
           "describe", "group_guarantee"]


class UnsupportedEventError(TypeError):
    """An accountant was given an event it cannot account for."""

    def __init__(self, accountant: str, event: object) -> None:
        super().__init__(f"{accountant} does not support event {event!r}.")
        self.accountant = accountant
        self.event = event


@dataclass(frozen=True, slots=True)
class Guarantee:
    """An ``(epsilon, delta)`` statement and whether it is a valid DP proof."""

    epsilon: float
    delta: float
    valid: bool
    note: str


class ZCDPAccountant:
    """Composes Gaussian events in zero-concentrated DP; converts to ``(epsilon, delta)``.

    Examples
    --------
    >>> acc = ZCDPAccountant().compose(GaussianTreeEvent(2.0, 4))
    >>> acc.rho
    0.5
    """

    def __init__(self) -> None:
        self.rho = 0.0
        self.ledger: list[DpEvent] = []

    def supports(self, event: DpEvent) -> bool:
        return isinstance(event, (GaussianTreeEvent, FactorizationEvent, DiscreteGaussianTreeEvent, NoNoiseEvent))

    def compose(self, event: DpEvent, count: int = 1) -> ZCDPAccountant:
        if count < 1:
            raise ValueError(f"`count` must be positive, got {count}.")
        if not self.supports(event):  # check first, commit second
            raise UnsupportedEventError("ZCDPAccountant", event)
        if isinstance(event, NoNoiseEvent):
            self.rho = math.inf
        elif isinstance(event, (GaussianTreeEvent, FactorizationEvent)):
            # a mu-GDP Gaussian mechanism is (mu**2 / 2)-zCDP
            self.rho += count * gaussian_mu_squared(event) / 2
        elif isinstance(event, DiscreteGaussianTreeEvent):
            # h nodes, each Delta^2 / (2 sigma^2)-zCDP (Canonne, Kamath & Steinke 2020, Thm 14)
            self.rho += count * event.max_nodes_per_leaf / (2 * event.noise_multiplier**2)
        self.ledger.append(event)
        return self

    def epsilon(self, delta: float) -> float:
        return math.inf if math.isinf(self.rho) else epsilon_from_rho(self.rho, delta)

    def guarantee(self, delta: float) -> Guarantee:
        eps = self.epsilon(delta)
        return Guarantee(eps, delta, not math.isinf(eps), f"zCDP rho={self.rho:.6g}")


class GDPAccountant:
    """Composes Gaussian events exactly in Gaussian DP (``mu`` adds in quadrature)."""

    def __init__(self) -> None:
        self.mu_squared = 0.0
        self.ledger: list[DpEvent] = []

    def supports(self, event: DpEvent) -> bool:
        return isinstance(event, (GaussianTreeEvent, FactorizationEvent, NoNoiseEvent))

    def compose(self, event: DpEvent, count: int = 1) -> GDPAccountant:
        if count < 1:
            raise ValueError(f"`count` must be positive, got {count}.")
        if not self.supports(event):
            raise UnsupportedEventError("GDPAccountant", event)
        if isinstance(event, NoNoiseEvent):
            self.mu_squared = math.inf
        elif isinstance(event, (GaussianTreeEvent, FactorizationEvent)):
            self.mu_squared += count * gaussian_mu_squared(event)
        self.ledger.append(event)
        return self

    @property
    def mu(self) -> float:
        return math.sqrt(self.mu_squared)

    def epsilon(self, delta: float) -> float:
        return math.inf if math.isinf(self.mu_squared) else gdp_epsilon(self.mu, delta)

    def guarantee(self, delta: float) -> Guarantee:
        eps = self.epsilon(delta)
        return Guarantee(eps, delta, not math.isinf(eps), f"GDP mu={self.mu:.6g}")


class LaplaceAccountant:
    """Basic composition of Laplace tree events (pure DP).

    An ``"l2"``-calibrated event yields the papers' *claimed* epsilon with
    ``valid=False``: it is not a differential-privacy guarantee.
    """

    def __init__(self) -> None:
        self.epsilon_sum = 0.0
        self.valid = True
        self.ledger: list[DpEvent] = []

    def supports(self, event: DpEvent) -> bool:
        return isinstance(event, (LaplaceTreeEvent, NoNoiseEvent))

    def compose(self, event: DpEvent, count: int = 1) -> LaplaceAccountant:
        if count < 1:
            raise ValueError(f"`count` must be positive, got {count}.")
        if not self.supports(event):
            raise UnsupportedEventError("LaplaceAccountant", event)
        if isinstance(event, NoNoiseEvent) or (isinstance(event, LaplaceTreeEvent) and event.noise_multiplier == 0):
            self.epsilon_sum = math.inf
        elif isinstance(event, LaplaceTreeEvent):
            self.epsilon_sum += count * event.max_nodes_per_leaf / event.noise_multiplier
            if event.sensitivity_norm != "l1":
                self.valid = False
        self.ledger.append(event)
        return self

    def guarantee(self, delta: float = 0.0) -> Guarantee:
        if self.valid:
            return Guarantee(self.epsilon_sum, 0.0, not math.isinf(self.epsilon_sum), "pure DP (L1)")
        return Guarantee(
            self.epsilon_sum,
            0.0,
            False,
            "paper calibration: Laplace noise scaled to the L2 sensitivity; "
            "not an epsilon-DP guarantee (real level epsilon*Delta_1/Delta_2)",
        )


def describe(event: DpEvent, delta: float) -> Guarantee:
    """The guarantee one event gives on its own, with the tightest accountant we have."""
    if isinstance(event, (GaussianTreeEvent, FactorizationEvent)):
        return GDPAccountant().compose(event).guarantee(delta)
    if isinstance(event, DiscreteGaussianTreeEvent):
        g = ZCDPAccountant().compose(event).guarantee(delta)
        return Guarantee(g.epsilon, g.delta, g.valid, f"discrete Gaussian tree on a grid of {event.grid:g}, {g.note} "
                                                      f"(Canonne, Kamath & Steinke 2020)")
    if isinstance(event, WishartTreeEvent):
        return Guarantee(event.epsilon, event.delta, True,
                         f"Wishart tree (Shariff & Sheffet 2018): per-node Sheffet (2015) Thm 4.1 with k = "
                         f"{event.degrees_of_freedom}, advanced composition over {event.max_nodes_per_leaf} nodes "
                         "(the paper's proof, not re-derived here)")
    if isinstance(event, DGSEvent):
        return Guarantee(event.epsilon, event.delta, False,
                         "dynamic global sensitivity (Wang et al. 2022): claimed (epsilon, delta) only; not a valid "
                         "DP proof (one reward changes every later leaf; the sensitivity bound is probabilistic)")
    if isinstance(event, LaplaceTreeEvent):
        return LaplaceAccountant().compose(event).guarantee(delta)
    if isinstance(event, NoNoiseEvent):
        return Guarantee(math.inf, 1.0, False, "no noise")
    raise UnsupportedEventError("describe", event)


def group_guarantee(event: DpEvent, k: int, delta: float) -> Guarantee:
    """The guarantee for *all* ``k`` interactions of one contributor (group privacy).

    One user's ``k`` interactions can share tree nodes. At each of the ``h``
    levels their counts ``n_j`` per node satisfy ``sum n_j**2 <= k**2``, so
    the user's combined sensitivity is at most ``k`` times one interaction's:
    Gaussian ``mu_k <= k mu``; Laplace ``epsilon_k <= k epsilon``.

    Examples
    --------
    >>> ev = GaussianTreeEvent(noise_multiplier=10.0, max_nodes_per_leaf=4)
    >>> round(group_guarantee(ev, 1, 1e-5).epsilon, 3) == round(describe(ev, 1e-5).epsilon, 3)
    True
    >>> group_guarantee(ev, 0, 1e-5).epsilon
    0.0
    """
    if k < 0:
        raise ValueError(f"`k` must be non-negative, got {k}.")
    if k == 0:
        return Guarantee(0.0, 0.0, True, "no interactions")
    if isinstance(event, (GaussianTreeEvent, FactorizationEvent)):
        # factorizations too: k columns of C sum to at most k times the largest column norm
        if event.noise_multiplier == 0:
            return Guarantee(math.inf, delta, False, "no noise")
        mu = k * math.sqrt(gaussian_mu_squared(event))
        return Guarantee(gdp_epsilon(mu, delta), delta, True, f"group of {k}: GDP mu={mu:.6g}")
    if isinstance(event, DiscreteGaussianTreeEvent):  # k times the sensitivity: k**2 times rho
        rho = k**2 * event.max_nodes_per_leaf / (2 * event.noise_multiplier**2)
        return Guarantee(epsilon_from_rho(rho, delta), delta, True, f"group of {k}: zCDP rho={rho:.6g}")
    if isinstance(event, (WishartTreeEvent, DGSEvent)):
        g = describe(event, delta)
        return Guarantee(k * g.epsilon, k * math.exp((k - 1) * g.epsilon) * g.delta, g.valid,
                         f"group of {k} (group privacy of the claimed guarantee): {g.note}")
    if isinstance(event, LaplaceTreeEvent):
        g = describe(event, delta)
        return Guarantee(k * g.epsilon, 0.0, g.valid, f"group of {k}: {g.note}")
    if isinstance(event, NoNoiseEvent):
        return Guarantee(math.inf, 1.0, False, "no noise")
    raise UnsupportedEventError("group_guarantee", event)
