"""The public calibration of local mode: every device of a namespace perturbs with the same rules.

A :class:`LocalConfig` is public (the server hands it out at ``GET /local/config``); a device adds
its own secret seed. It says what one report costs and how much noise a sum of reports carries,
which the server uses (as post-processing) to scale the serving ridge.

Examples
--------
>>> cfg = LocalConfig(algorithm="round", d=25, epsilon=2.0, delta=1e-5)
>>> round(cfg.sigma, 3)                      # N(0, sigma^2) per coordinate, L2 sensitivity 2
3.988
>>> cfg.report_variance(7) == cfg.sigma ** 2  # one report per interaction: the same every time
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.accounting.conversions import check_delta, check_epsilon, gdp_epsilon, gdp_mu
from models.mechanisms import MECHANISMS, Mechanism, make_mechanism
from models.mechanisms.base import TreeState, noise_std

__all__ = ["ALGORITHMS", "LocalConfig", "DEVICE_MECHANISMS", "REPORT_SENSITIVITY"]

#: L2 sensitivity of one interaction's ``r x`` under *replace* neighbours (another reward, and another item of the
#: list — the user's choice is protected): ``||r x - r' x'|| <= 2`` for ``||x|| <= 1``, ``r in [0, 1]``.
REPORT_SENSITIVITY = 2.0

#: ``tree``: per-user continual release of ``b_u`` (LDP-CoLin / LDP-GOBLin); ``round``: one noisy
#: ``r x`` per interaction (the LDP bandits paper's reduction, public contexts).
ALGORITHMS = ("tree", "round")

#: Mechanisms a device may run for ``tree`` (one user's own ``d``-vector; no mixing: the server mixes).
DEVICE_MECHANISMS = tuple(m for m in MECHANISMS if not m.startswith("user-"))

_ZERO = np.zeros(1)
_MECH_CACHE: dict["LocalConfig", Mechanism] = {}


@dataclass(frozen=True)
class LocalConfig:
    """What every device of a namespace uses (public).

    Parameters
    ----------
    algorithm
        ``"tree"`` or ``"round"`` (:data:`ALGORITHMS`).
    d
        Context dimension.
    epsilon, delta
        ``tree``: the (epsilon, delta) of a user's whole report stream per interaction; ``round``
        without shuffling: of one report; ``round`` with shuffling: the *central* guarantee of one
        shuffled batch (each report is then pure ``epsilon0``-LDP, :attr:`epsilon0`).
    mechanism
        ``tree`` only: the device's continual-release mechanism (a name of
        ``models.mechanisms.MECHANISMS`` without ``user-``), default ``blt-exact``.
    capacity
        ``tree`` only: reports per epoch of a device's mechanism.
    shuffle_batch
        ``round`` only: ``n > 0`` turns shuffling on; a batch holds ``n`` distinct users' reports.
    """

    algorithm: str
    d: int
    epsilon: float
    delta: float = 1e-5
    mechanism: str = "blt-exact"
    capacity: int = 1023
    shuffle_batch: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"`algorithm` must be one of {ALGORITHMS}, got {self.algorithm!r}.")
        if not isinstance(self.d, int) or self.d < 1:
            raise ValueError(f"`d` must be a positive integer, got {self.d!r}.")
        check_epsilon(self.epsilon)
        check_delta(self.delta)
        if math.isinf(self.epsilon):
            raise ValueError("`epsilon` must be finite in local mode: a device that adds no noise sends its "
                             "exact statistic (use the global mode with epsilon = inf for a non-private run).")
        if self.mechanism not in DEVICE_MECHANISMS:
            raise ValueError(f"`mechanism` must be one of {DEVICE_MECHANISMS}, got {self.mechanism!r}.")
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"`capacity` must be a positive integer, got {self.capacity!r}.")
        if not isinstance(self.shuffle_batch, int) or self.shuffle_batch < 0:
            raise ValueError(f"`shuffle_batch` must be a non-negative integer, got {self.shuffle_batch!r}.")
        if self.shuffle_batch and self.algorithm != "round":
            raise ValueError("shuffling applies to per-round reports only (`algorithm` = 'round'): a continual "
                             "release of b_u is one stream per user, with no batch of one report per user.")

    # ------------------------------------------------------------------ noise of one report

    @property
    def shuffled(self) -> bool:
        return self.shuffle_batch > 0

    @property
    def epsilon0(self) -> float:
        """The pure LDP level of one shuffled report, chosen so a batch of ``shuffle_batch`` is ``epsilon``-DP."""
        if not self.shuffled:
            raise ValueError("`epsilon0` is defined with shuffling only.")
        from models.accounting.shuffling import local_epsilon_for_central

        return float(local_epsilon_for_central(self.epsilon, self.shuffle_batch, self.delta))

    @property
    def sigma(self) -> float:
        """``round`` without shuffling: std of the Gaussian noise per coordinate (L2 sensitivity 2)."""
        return REPORT_SENSITIVITY / gdp_mu(self.epsilon, self.delta)

    @property
    def laplace_scale(self) -> float:
        """``round`` with shuffling: Laplace scale per coordinate, ``2 sqrt(d) / epsilon0``.

        ``2 sqrt(d)`` bounds the L1 distance between ``r x`` and ``r' x'`` over the whole domain
        (``||x||_2 <= 1``, ``r in [0, 1]``): each report is pure ``epsilon0``-LDP even for a
        different context, which the amplification theorem needs (one randomizer for all users).
        """
        return 2.0 * math.sqrt(self.d) / self.epsilon0

    def device_mechanism(self, seed: int) -> Mechanism:
        """``tree``: the device's mechanism over its own ``d``-vector ``b_u`` (L2 sensitivity 2: replace)."""
        if self.algorithm != "tree":
            raise ValueError("a device mechanism exists for `algorithm` = 'tree' only.")
        return make_mechanism(self.mechanism, dim=self.d, sensitivity=REPORT_SENSITIVITY, epsilon=self.epsilon,
                              delta=self.delta, horizon=self.capacity, seed=seed,
                              sensitivity_l1=REPORT_SENSITIVITY * math.sqrt(self.d))

    def report_variance(self, version: int) -> float:
        """Largest per-coordinate noise variance of a device's report number ``version`` (public).

        ``tree``: the noise in the running sum after ``version`` ticks; ``round``: one report's.
        """
        if version < 1:
            return 0.0
        if self.algorithm == "round":
            return 2.0 * self.laplace_scale**2 if self.shuffled else self.sigma**2
        mech = self._variance_mechanism()
        epoch, step = divmod(version, self.capacity)
        if step == 0:
            epoch, step = epoch - 1, self.capacity
        state = TreeState(step=step, epoch=epoch, prefix=_ZERO, carry=_ZERO, nodes=_ZERO)
        return noise_std(mech, state) ** 2

    def _variance_mechanism(self) -> Mechanism:
        cache = _MECH_CACHE.get(self)
        if cache is None:
            cache = _MECH_CACHE[self] = self.device_mechanism(0)
        return cache

    # ------------------------------------------------------------------ what it guarantees

    def guarantee(self) -> dict[str, Any]:
        """The local guarantee in plain words (``/budget`` and the page state it)."""
        common = {"mode": "local", "algorithm": self.algorithm, "delta": self.delta,
                  "trusted": "only the user's own device: it keeps the exact statistic and adds the noise",
                  "protects": "the rewards a user gives and which item of a shown list they acted on (which "
                              "lists were shown and answered is public, as in every mode)",
                  "neighbours": "one interaction replaced: another reward, and another item of the same shown "
                                "list (L2 sensitivity 2 of r x)",
                  "statistics": [self._report_statistic()]}
        if self.algorithm == "tree":
            return {**common, "epsilon": self.epsilon, "valid": True, "mechanism": self.mechanism,
                    "statement": f"each device releases its own running sum b_u = sum r x through "
                                 f"'{self.mechanism}' ({MECHANISMS[self.mechanism]}); the whole report stream of a "
                                 f"user is ({self.epsilon:g}, {self.delta:g})-DP with respect to any one of their "
                                 f"interactions (local DP, event level); a user with k interactions is covered "
                                 f"at group level k; everything the server computes is post-processing"}
        if not self.shuffled:
            mu = gdp_mu(self.epsilon, self.delta)
            return {**common, "epsilon": self.epsilon, "valid": True, "noise": "gaussian", "sigma": self.sigma,
                    "statement": f"each report m = r x + N(0, {self.sigma:.3g}^2 I) is ({self.epsilon:g}, "
                                 f"{self.delta:g})-LDP (Gaussian DP mu = {mu:.3g}, L2 sensitivity 2); each "
                                 f"interaction is in one report; a user's k reports compose to mu sqrt(k) "
                                 f"(k = 4: epsilon {gdp_epsilon(2 * mu, self.delta):.3g})"}
        e0 = self.epsilon0
        from models.accounting.shuffling import shuffled_epsilon

        g = shuffled_epsilon(e0, self.shuffle_batch, self.delta)
        return {**common, "epsilon": e0, "delta": 0.0, "valid": True, "noise": "laplace",
                "laplace_scale": self.laplace_scale, "shuffle_batch": self.shuffle_batch,
                "central_epsilon": self.epsilon, "central_delta": self.delta,
                "central_bound": {"epsilon": g.epsilon, "delta": g.delta, "bound": g.bound, "amplified": g.amplified,
                                  "note": g.note},
                "against_operator": {"epsilon": e0, "delta": 0.0,
                                     "why": "the shuffler runs inside the operator's worker and POST /report hands it "
                                            "each report with its user id: against the operator each report is only "
                                            "its local guarantee"},
                "statement": f"each report m = r x + Laplace({self.laplace_scale:.3g})^d is pure {e0:.4g}-LDP "
                             f"(L1 sensitivity 2 sqrt(d) over every context and reward): that is the guarantee "
                             f"against the operator of this server, which receives each report with its user id and "
                             f"runs the shuffler itself; against anyone who sees only the shuffled batches (the "
                             f"released statistics, the analysts), batches of {self.shuffle_batch} distinct users "
                             f"stripped of identity make each batch ({self.epsilon:g}, {self.delta:g})-DP centrally "
                             f"(Feldman, McMillan & Talwar 2021); a user's reports in k batches compose"}

    def _report_statistic(self) -> dict[str, Any]:
        """What one report releases, its bound and its sensitivity under the stated relation (``/budget``)."""
        what = {"tree": "b_u = sum r x, the device's running sum (one tick per interaction)",
                "round": "m = r x, one interaction"}[self.algorithm]
        out: dict[str, Any] = {"name": "report", "what": what, "released": "through the device's noise",
                               "clip": 1.0, "clip_of": "r x per interaction (r in [0, 1], ||x|| <= 1)"}
        if self.shuffled:
            out.update({"sensitivity_per_tick": 2.0 * math.sqrt(self.d), "norm": "L1",
                        "sensitivity_rule": "L1: r x and r' x' anywhere in the domain, 2 sqrt(d)"})
        else:
            out.update({"sensitivity_per_tick": REPORT_SENSITIVITY, "norm": "L2",
                        "sensitivity_rule": "2 x clip: another reward and another item of the list"})
        return out

    def to_public(self) -> dict[str, Any]:
        """``GET /local/config``: everything a device needs (all public)."""
        out: dict[str, Any] = {"mode": "local", "algorithm": self.algorithm, "d": self.d, "epsilon": self.epsilon,
                               "delta": self.delta, "schema": "privrec.LocalReport/2", "mechanism": None,
                               "noise": None, "shuffle_batch": self.shuffle_batch}
        if self.algorithm == "tree":
            mech = self._variance_mechanism()
            desc: dict[str, Any] = {"name": self.mechanism, "capacity": self.capacity}
            if hasattr(mech, "theta") and hasattr(mech, "w"):  # BLT: what a browser needs to run it
                desc.update({"kind": "blt", "theta": [float(v) for v in getattr(mech, "theta")],
                             "w": [float(v) for v in getattr(mech, "w")], "scale": float(getattr(mech, "scale"))})
            else:
                desc["kind"] = getattr(mech, "name", type(mech).__name__)
            out["mechanism"] = desc
        elif self.shuffled:
            out["noise"] = {"kind": "laplace", "scale": self.laplace_scale, "epsilon0": self.epsilon0}
        else:
            out["noise"] = {"kind": "gaussian", "sigma": self.sigma}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "d": self.d, "epsilon": self.epsilon, "delta": self.delta,
                "mechanism": self.mechanism, "capacity": self.capacity, "shuffle_batch": self.shuffle_batch}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LocalConfig:
        return cls(algorithm=str(data["algorithm"]), d=int(data["d"]), epsilon=float(data["epsilon"]),
                   delta=float(data["delta"]), mechanism=str(data.get("mechanism") or "blt-exact"),
                   capacity=int(data.get("capacity") or 1023), shuffle_batch=int(data.get("shuffle_batch") or 0))

