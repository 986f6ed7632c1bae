"""Privacy events, accountants and noise calibration.

A mechanism describes what it spends with a frozen *event* (its
hyperparameters, nothing else); an *accountant* turns events into a
guarantee. Mechanisms never compute guarantees themselves, and accountants
never touch mechanisms (after google/differential-privacy's ``dp_accounting``).

Neighbouring relation throughout: **event level, replace-one** — two streams
differ in the reward (and, for algorithms that protect contexts, the
context) of one interaction. A continual-release tree of ``h`` levels puts
every leaf in at most ``h`` nodes, so one interaction touches at most ``h``
node releases (ERRATA §1).

Conversions (ERRATA §1, §5):

* zCDP: a Gaussian tree with per-node noise ``sigma`` and L2 sensitivity
  ``Delta`` is ``rho = h * Delta**2 / (2 sigma**2)``-zCDP, which implies
  ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP.
* Exact (Gaussian DP): the ``h`` Gaussian node releases compose to one
  ``mu``-GDP mechanism with ``mu = sqrt(h) * Delta / sigma``, which is
  ``(epsilon, delta)``-DP exactly when
  ``Phi(-epsilon/mu + mu/2) - e**epsilon Phi(-epsilon/mu - mu/2) <= delta``.
* Laplace: per-node scale ``b = Delta_1 * h / epsilon`` gives pure
  ``epsilon``-DP only when ``Delta_1`` is the **L1** sensitivity. The
  papers calibrate with the L2 sensitivity ("paper" calibration): that is
  *not* an ``epsilon``-DP guarantee; its real pure-DP level is
  ``epsilon * Delta_1 / Delta_2``.

Examples
--------
>>> round(rho_from_epsilon(2.0, 1e-5), 4)
0.08
>>> round(epsilon_from_rho(rho_from_epsilon(2.0, 1e-5), 1e-5), 9)
2.0
>>> ev = GaussianTreeEvent(noise_multiplier=9.35, max_nodes_per_leaf=14)
>>> g = ZCDPAccountant().compose(ev).guarantee(1e-5)
>>> (round(g.epsilon, 2), g.delta, g.valid)
(2.0, 1e-05, True)
"""

from .accountants import (
    GDPAccountant,
    Guarantee,
    LaplaceAccountant,
    UnsupportedEventError,
    ZCDPAccountant,
    describe,
    group_guarantee,
)
from .conversions import (
    check_delta,
    check_epsilon,
    epsilon_from_rho,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    rho_from_epsilon,
    split_epsilon,
)
from .events import (
    DGSEvent,
    DiscreteGaussianTreeEvent,
    DpEvent,
    FactorizationEvent,
    GaussianTreeEvent,
    LaplaceTreeEvent,
    NoNoiseEvent,
    WishartTreeEvent,
    event_from_dict,
    event_to_dict,
    register_event_type,
)

__all__ = [
    "DpEvent",
    "NoNoiseEvent",
    "LaplaceTreeEvent",
    "GaussianTreeEvent",
    "FactorizationEvent",
    "WishartTreeEvent",
    "DGSEvent",
    "DiscreteGaussianTreeEvent",
    "Guarantee",
    "ZCDPAccountant",
    "GDPAccountant",
    "LaplaceAccountant",
    "UnsupportedEventError",
    "describe",
    "group_guarantee",
    "event_to_dict",
    "event_from_dict",
    "register_event_type",
    "rho_from_epsilon",
    "epsilon_from_rho",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "check_epsilon",
    "check_delta",
    "split_epsilon",
]
