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

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "DpEvent",
    "NoNoiseEvent",
    "LaplaceTreeEvent",
    "GaussianTreeEvent",
    "FactorizationEvent",
    "WishartTreeEvent",
    "DGSEvent",
    "Guarantee",
    "ZCDPAccountant",
    "GDPAccountant",
    "LaplaceAccountant",
    "UnsupportedEventError",
    "describe",
    "group_guarantee",
    "event_to_dict",
    "event_from_dict",
    "rho_from_epsilon",
    "epsilon_from_rho",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "check_epsilon",
    "check_delta",
]


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """Validate a privacy parameter: ``epsilon > 0`` (``inf`` = no privacy)."""
    eps = float(epsilon)
    if math.isnan(eps) or eps <= 0:
        raise ValueError(f"`{name}` must be positive (use inf for no noise), got {epsilon}.")
    return eps


def check_delta(delta: float, name: str = "delta") -> float:
    """Validate ``0 < delta < 1``."""
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {delta}.")
    return d


def rho_from_epsilon(epsilon: float, delta: float) -> float:
    """Largest zCDP ``rho`` whose conversion gives ``(epsilon, delta)``-DP.

    ``rho = (sqrt(epsilon + ln(1/delta)) - sqrt(ln(1/delta)))**2``; the exact
    inverse of :func:`epsilon_from_rho`.
    """
    eps, dl = check_epsilon(epsilon), check_delta(delta)
    if math.isinf(eps):
        return math.inf
    L = math.log(1.0 / dl)
    return (math.sqrt(eps + L) - math.sqrt(L)) ** 2


def epsilon_from_rho(rho: float, delta: float) -> float:
    """``epsilon = rho + 2 sqrt(rho ln(1/delta))`` (Bun & Steinke 2016, Prop. 1.3)."""
    if rho < 0:
        raise ValueError(f"`rho` must be non-negative, got {rho}.")
    dl = check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / dl))


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """Exact ``delta`` of a ``mu``-GDP mechanism at ``epsilon`` (Dong, Roth, Su 2019, Cor. 2.13)."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    # e^eps * Phi(b) computed in log space to avoid overflow at large eps
    tail = 0.0 if _phi(b) == 0.0 else math.exp(epsilon + math.log(_phi(b)))
    return max(0.0, _phi(a) - tail)


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ``epsilon`` with ``gdp_delta(mu, epsilon) <= delta`` (bisection)."""
    check_delta(delta)
    if mu <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gdp_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu`` whose ``mu``-GDP mechanism is ``(epsilon, delta)``-DP (bisection)."""
    eps, dl = check_epsilon(epsilon), check_delta(delta)
    if math.isinf(eps):
        return math.inf
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, eps) <= dl:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gdp_delta(mid, eps) <= dl:
            lo = mid
        else:
            hi = mid
    return lo


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


def _gaussian_mu_squared(event: GaussianTreeEvent | FactorizationEvent) -> float:
    """``mu**2`` of one Gaussian event (``inf`` without noise)."""
    nm = event.noise_multiplier
    if nm == 0:
        return math.inf
    if isinstance(event, FactorizationEvent):
        return (event.column_norm / nm) ** 2
    return event.max_nodes_per_leaf / nm**2


# --------------------------------------------------------------------------- accountants


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
        return isinstance(event, (GaussianTreeEvent, FactorizationEvent, NoNoiseEvent))

    def compose(self, event: DpEvent, count: int = 1) -> ZCDPAccountant:
        if count < 1:
            raise ValueError(f"`count` must be positive, got {count}.")
        if not self.supports(event):  # check first, commit second
            raise UnsupportedEventError("ZCDPAccountant", event)
        if isinstance(event, NoNoiseEvent):
            self.rho = math.inf
        elif isinstance(event, (GaussianTreeEvent, FactorizationEvent)):
            # a mu-GDP Gaussian mechanism is (mu**2 / 2)-zCDP
            self.rho += count * _gaussian_mu_squared(event) / 2
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
            self.mu_squared += count * _gaussian_mu_squared(event)
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
        mu = k * math.sqrt(_gaussian_mu_squared(event))
        return Guarantee(gdp_epsilon(mu, delta), delta, True, f"group of {k}: GDP mu={mu:.6g}")
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


_EVENT_TYPES: dict[str, type] = {"none": NoNoiseEvent, "laplace_tree": LaplaceTreeEvent,
                                 "gaussian_tree": GaussianTreeEvent, "factorization": FactorizationEvent,
                                 "wishart_tree": WishartTreeEvent, "dgs_tree": DGSEvent}


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
