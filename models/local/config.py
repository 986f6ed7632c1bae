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

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.accounting.conversions import check_delta, check_epsilon, gdp_epsilon, gdp_mu
from models.accounting.statement import Party, Plain, StatementFacts, render, render_plain
from models.mechanisms import MECHANISMS, Mechanism, make_mechanism
from models.mechanisms.base import TreeState, noise_std
from models.mechanisms.participation import USER_LEVEL_MECHANISMS

__all__ = ["ALGORITHMS", "UNITS", "LocalConfig", "LocalConfigError", "DEVICE_MECHANISMS", "REPORT_SENSITIVITY",
           "DEFAULT_CAP", "DEFAULT_EPOCH_SECONDS", "LocalVariant", "VARIANTS", "DEFAULT_VARIANT", "variant_of"]

#: L2 sensitivity of one interaction's ``r x`` under *replace* neighbours (another reward, and another item of the
#: list — the user's choice is protected): ``||r x - r' x'|| <= 2`` for ``||x|| <= 1``, ``r in [0, 1]``.
REPORT_SENSITIVITY = 2.0

#: ``tree``: per-user continual release of ``b_u`` (LDP-CoLin / LDP-GOBLin); ``round``: one noisy
#: ``r x`` per interaction (the LDP bandits paper's reduction, public contexts).
ALGORITHMS = ("tree", "round")

#: Mechanisms a device may run for ``tree`` (one user's own ``d``-vector; no mixing: the server mixes).
DEVICE_MECHANISMS = tuple(m for m in MECHANISMS if not m.startswith("user-"))

#: ``user``: everything one device reports is protected (a cap of reports per epoch, noise calibrated to the
#: cap, a lifetime budget over the device's whole history); ``event``: each interaction alone.
UNITS = ("user", "event")
#: Reports per epoch a device may make at user level (the global mode's ``user_cap``).
DEFAULT_CAP = 8
#: Length of a user-level epoch: the global mode's epoch of ``2**14 - 1`` one-second release ticks.
DEFAULT_EPOCH_SECONDS = float((1 << 14) - 1)

_ZERO = np.zeros(1)


class LocalConfigError(ValueError):
    """A :class:`LocalConfig` parameter is invalid; ``parameter`` names it as spelled in the signature."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter

_MECH_CACHE: dict["LocalConfig", Mechanism] = {}
_PARTICIPATION: dict["LocalConfig", dict[str, Any]] = {}


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
    unit
        ``"event"`` (the default of this class: ``epsilon`` covers one interaction) or ``"user"``: a device
        makes at most ``cap`` reports per epoch of ``epoch_seconds`` and its noise is calibrated so that any
        ``cap`` of its reports together are ``(epsilon, delta)``-DP — ``tree``: the device's mechanism runs
        epochs of ``cap`` reports, calibrated to their multi-participation sensitivity
        (:func:`models.mechanisms.participation.participation_factor`); ``round``: each Gaussian report gets
        ``mu / sqrt(cap)`` (Gaussian DP composes); shuffled: each batch is ``(epsilon / cap, delta / cap)``-DP
        (a user is in at most one report per batch; basic composition over ``cap`` batches). The pipeline's
        default is ``"user"`` (:meth:`pipeline.config.settings.Settings.local_config`).
    cap, epoch_seconds
        User level: reports per epoch, and the epoch's length in seconds (epoch ``floor(t / epoch_seconds)``).
    user_budget
        Lifetime budget of one device: epsilon at ``delta`` over everything it ever reports (``inf``: none).
        A device stops reporting before it would exceed it (:meth:`report_limit`).
    codewords
        ``round`` with shuffling at user level: ``K > 0`` reports each listen as the codeword of its item's
        context in a public codebook of ``K`` codewords (:func:`models.local.items.codebook` of the catalog's
        features), through a blanket of fake messages (:attr:`blanket`, Balcer & Cheu), in population-wide
        batches; the report's ``m`` is then zero (nothing of the data) and the whole budget is on the messages.
        ``0`` (default): Laplace reports ``m`` only.
    """

    algorithm: str
    d: int
    epsilon: float
    delta: float = 1e-5
    mechanism: str = "blt-exact"
    capacity: int = 1023
    shuffle_batch: int = 0
    unit: str = "event"
    cap: int = DEFAULT_CAP
    epoch_seconds: float = DEFAULT_EPOCH_SECONDS
    user_budget: float = math.inf
    codewords: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise LocalConfigError("algorithm", f"`algorithm` must be one of {ALGORITHMS}, got {self.algorithm!r}.")
        if not isinstance(self.d, int) or self.d < 1:
            raise LocalConfigError("d", f"`d` must be a positive integer, got {self.d!r}.")
        for name, check in (("epsilon", check_epsilon), ("delta", check_delta)):
            try:
                check(getattr(self, name))
            except ValueError as e:
                raise LocalConfigError(name, str(e)) from None
        if math.isinf(self.epsilon):
            raise LocalConfigError("epsilon", "`epsilon` must be finite in local mode: a device that adds no noise sends "
                                              "its exact statistic (use the global mode with epsilon = inf for a "
                                              "non-private run).")
        if self.mechanism not in DEVICE_MECHANISMS:
            raise LocalConfigError("mechanism", f"`mechanism` must be one of {DEVICE_MECHANISMS}, got "
                                                f"{self.mechanism!r}.")
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise LocalConfigError("capacity", f"`capacity` must be a positive integer, got {self.capacity!r}.")
        if not isinstance(self.shuffle_batch, int) or self.shuffle_batch < 0:
            raise LocalConfigError("shuffle_batch", f"`shuffle_batch` must be a non-negative integer, got "
                                                    f"{self.shuffle_batch!r}.")
        if self.shuffle_batch and self.algorithm != "round":
            raise LocalConfigError("shuffle_batch", "shuffling applies to per-round reports only (`algorithm` = "
                                                    "'round'): a continual release of b_u is one stream per user, "
                                                    "with no batch of one report per user.")
        if self.unit not in UNITS:
            raise LocalConfigError("unit", f"`unit` must be one of {UNITS}, got {self.unit!r}.")
        if not isinstance(self.cap, int) or self.cap < 1:
            raise LocalConfigError("cap", f"`cap` must be a positive integer, got {self.cap!r}.")
        if not (self.epoch_seconds > 0 and math.isfinite(self.epoch_seconds)):
            raise LocalConfigError("epoch_seconds", f"`epoch_seconds` must be a positive number, got "
                                                    f"{self.epoch_seconds!r}.")
        if not self.user_budget > 0:  # NaN fails too
            raise LocalConfigError("user_budget", f"`user_budget` must be a positive epsilon or inf, got "
                                                  f"{self.user_budget!r}.")
        if isinstance(self.codewords, bool) or not isinstance(self.codewords, int) or not 0 <= self.codewords <= 4096:
            raise LocalConfigError("codewords", f"`codewords` must be an integer in [0, 4096], got {self.codewords!r}.")
        if self.codewords and not (self.shuffled and self.user_level):
            raise LocalConfigError("codewords", "`codewords` needs shuffling (`shuffle_batch` > 0, `algorithm` "
                                                "'round') at user level: the blanket's guarantee is central, over a "
                                                "batch of distinct users' messages.")

    def check_runnable(self) -> None:
        """Raise :class:`LocalConfigError` unless devices can report under this calibration, checked before any does.

        ``tree`` at user level needs a device mechanism with a multi-participation bound
        (:data:`models.mechanisms.participation.USER_LEVEL_MECHANISMS`); ``codewords`` needs batches of
        ``shuffle_batch`` users large enough for a blanket to make ``cap`` batches ``(epsilon, delta)``-DP
        (:func:`models.local.items.blanket_reaches`; else the first report would fail).
        """
        if self.user_level and self.algorithm == "tree" and self.mechanism not in USER_LEVEL_MECHANISMS:
            raise LocalConfigError("unit", f"user level on the device needs a device mechanism with a "
                                           f"multi-participation bound ({', '.join(USER_LEVEL_MECHANISMS)}), got "
                                           f"{self.mechanism!r}; or use event level")
        if self.codewords:
            from .items import MAX_P, blanket_reaches, smallest_batch

            if not blanket_reaches(self.epsilon, self.delta, self.shuffle_batch, compositions=self.cap):
                need = smallest_batch(self.epsilon, self.delta, self.cap)
                raise LocalConfigError("shuffle_batch", f"{self.shuffle_batch} distinct users per batch are too few "
                                                        f"for codewords: no blanket (fakes with probability up to "
                                                        f"{MAX_P:g}) makes {self.cap} batches (user_cap) of a device "
                                                        f"({self.epsilon:g}, {self.delta:g})-DP; the smallest "
                                                        f"workable batch is {need} (or raise epsilon or delta, or "
                                                        f"lower user_cap).")

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

        eps, delta = self.batch_guarantee
        return float(local_epsilon_for_central(eps, self.shuffle_batch, delta))

    @property
    def user_level(self) -> bool:
        return self.unit == "user"

    @property
    def batch_guarantee(self) -> tuple[float, float]:
        """Shuffled: the central ``(epsilon, delta)`` of one batch — ``(epsilon, delta)`` at event level,
        ``(epsilon / cap, delta / cap)`` at user level (``cap`` batches compose to ``(epsilon, delta)``)."""
        if self.user_level:
            return self.epsilon / self.cap, self.delta / self.cap
        return self.epsilon, self.delta

    @property
    def blanket(self) -> Any:
        """``codewords``: the messages' public calibration (:class:`models.local.items.ItemBlanket` over the ``K``
        codes, batches of ``shuffle_batch``, ``cap`` batches per epoch together ``(epsilon, delta)``, exact)."""
        if not self.codewords:
            raise ValueError("`blanket` is defined with `codewords` > 0 only.")
        from .items import ItemBlanket

        return ItemBlanket(n_items=self.codewords, batch=self.shuffle_batch, epsilon=self.epsilon, delta=self.delta,
                           cap=self.cap)

    @property
    def sigma(self) -> float:
        """``round`` without shuffling: std of the Gaussian noise per coordinate (L2 sensitivity 2).

        Event level: one report is ``mu``-GDP (``mu = gdp_mu(epsilon, delta)``); user level: ``mu / sqrt(cap)``,
        so ``cap`` reports compose to ``mu``.
        """
        per_report = REPORT_SENSITIVITY / gdp_mu(self.epsilon, self.delta)
        return per_report * math.sqrt(self.cap) if self.user_level else per_report

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

        def build(scale: float) -> Mechanism:
            return make_mechanism(self.mechanism, dim=self.d, sensitivity=scale * REPORT_SENSITIVITY,
                                  epsilon=self.epsilon, delta=self.delta, horizon=self.mechanism_capacity, seed=seed,
                                  sensitivity_l1=scale * REPORT_SENSITIVITY * math.sqrt(self.d))

        return build(self.participation_factor) if self.user_level else build(1.0)

    @property
    def mechanism_capacity(self) -> int:
        """``tree``: reports per epoch of the device's mechanism — ``capacity``, or ``cap`` at user level (so that
        every mechanism epoch is one block of at most ``cap`` reports, the block its calibration covers)."""
        return self.cap if self.user_level else self.capacity

    @property
    def participation_factor(self) -> float:
        """``tree`` at user level: ``sqrt(B(cap)) / max_t ||c_t||`` of the device's mechanism (how much more noise
        than one report's calibration covers a block of ``cap`` reports; at most ``cap``)."""
        return float(_participation(self, "factor"))

    def participation_ratio(self, k: int) -> float:
        """The share of a capped block's privacy loss (in ``mu**2`` of Gaussian DP, or in epsilon when shuffled)
        that ``k`` reports of one block spend: ``B(k) / B(cap)`` for ``tree``, ``k / cap`` for independent
        reports (``round``). ``k`` in ``[0, cap]``."""
        k = int(k)
        if k <= 0:
            return 0.0
        k = min(k, self.cap)
        if self.algorithm == "tree":
            table: list[float] = _participation(self, "ratios")
            return table[k - 1]
        return k / self.cap

    def spent_fraction(self, reports: int) -> float:
        """User level: the privacy loss of a device's first ``reports`` reports in units of one capped block.

        ``tree``: the device's mechanism restarts every ``cap`` reports (one block: at most ``(epsilon, delta)``
        together), so ``floor(n / cap) + B(n mod cap) / B(cap)`` (in ``mu**2``: Gaussian DP composes over
        blocks); ``round``: ``n / cap``. Which reports fall in which time epoch does not matter: the loss is a
        function of the count only, and at most ``cap`` of them fall in one epoch (by superadditivity of ``B``,
        those cost at most one block).
        """
        n = max(0, int(reports))
        if self.algorithm == "tree":
            full, rest = divmod(n, self.cap)
            return full + self.participation_ratio(rest)
        return n / self.cap

    def spent(self, reports: int) -> tuple[float, float]:
        """``(epsilon, delta)`` of a device's first ``reports`` reports, all of them together (user level), or the
        group bound over them (event level). Gaussian DP for ``tree`` and ``round`` (``mu_block sqrt(fraction)``);
        shuffled: basic composition of the batches' central guarantees (``k`` batches: ``k`` times each)."""
        n = max(0, int(reports))
        if n == 0:
            return 0.0, 0.0
        if self.codewords:  # n batches, grouped by count into blocks of <= cap: each (epsilon, delta), basic composition
            blocks = -(-n // self.cap)
            return blocks * self.epsilon, min(1.0, blocks * self.delta)
        if self.shuffled:
            eps, delta = self.batch_guarantee
            return n * eps, min(1.0, n * delta)
        mu = gdp_mu(self.epsilon, self.delta)
        if self.user_level:
            total = mu * math.sqrt(self.spent_fraction(n))
        elif self.algorithm == "tree":
            total = mu * n  # group privacy: k interactions, k times the sensitivity
        else:
            total = mu * math.sqrt(n)
        return gdp_epsilon(total, self.delta), self.delta

    def report_limit(self) -> int | None:
        """How many reports one device may make within ``user_budget`` (``None``: no budget).

        User level, the largest ``n`` with :meth:`spent` ``(n)`` within the budget (Gaussian DP: ``mu_block
        sqrt(fraction(n)) <= gdp_mu(user_budget, delta)``; shuffled: ``n epsilon / cap <= user_budget``). Event
        level, the group bound: shuffled ``floor(user_budget / epsilon0)`` (pure LDP reports compose), ``round``
        ``floor((mu_budget / mu)**2)``, ``tree`` ``floor(mu_budget / mu)`` (``k`` interactions: ``k mu``; for a
        Laplace device mechanism ``floor(user_budget / epsilon)``).
        """
        budget = self.user_budget
        if not math.isfinite(budget):
            return None
        if self.user_level:
            if self.codewords:
                return math.floor(budget / self.epsilon + 1e-9) * self.cap
            if self.shuffled:
                return math.floor(budget / self.batch_guarantee[0] + 1e-9)
            ratio = (gdp_mu(budget, self.delta) / gdp_mu(self.epsilon, self.delta)) ** 2
            if self.algorithm == "round":
                return math.floor(ratio * self.cap + 1e-9)
            full = math.floor(ratio + 1e-12)
            rest = max((k for k in range(self.cap) if full + self.participation_ratio(k) <= ratio + 1e-12), default=0)
            return full * self.cap + rest
        if self.shuffled:
            return math.floor(budget / self.epsilon0)
        if self.algorithm == "tree" and "laplace" in self.mechanism:
            return math.floor(budget / self.epsilon)
        ratio = gdp_mu(budget, self.delta) / gdp_mu(self.epsilon, self.delta)
        return math.floor(ratio if self.algorithm == "tree" else ratio**2)

    def epoch_at(self, seconds: float) -> int:
        """The user-level epoch of time ``seconds`` (since the Unix epoch)."""
        return int(math.floor(seconds / self.epoch_seconds))

    def report_variance(self, version: int) -> float:
        """Largest per-coordinate noise variance of a device's report number ``version`` (public).

        ``tree``: the noise in the running sum after ``version`` ticks; ``round``: one report's.
        """
        if version < 1:
            return 0.0
        if self.codewords:
            return 0.0  # m is zero: the listen travels as the blanket's messages (their noise: models.local.items)
        if self.algorithm == "round":
            return 2.0 * self.laplace_scale**2 if self.shuffled else self.sigma**2
        mech = self._variance_mechanism()
        epoch, step = divmod(version, self.mechanism_capacity)
        if step == 0:
            epoch, step = epoch - 1, self.mechanism_capacity
        state = TreeState(step=step, epoch=epoch, prefix=_ZERO, carry=_ZERO, nodes=_ZERO)
        return noise_std(mech, state) ** 2

    def _variance_mechanism(self) -> Mechanism:
        cache = _MECH_CACHE.get(self)
        if cache is None:
            cache = _MECH_CACHE[self] = self.device_mechanism(0)
        return cache

    # ------------------------------------------------------------------ what it guarantees

    def guarantee(self, *, shuffler: str = "worker") -> dict[str, Any]:
        """The local guarantee in plain words (``/budget`` and the page state it).

        ``shuffler`` (shuffled reports): ``"worker"``, the shuffler runs in the operator's worker; ``"separate"``, it
        is a service of its own and devices seal each report to the analyzer (docs/local-parties.md). The
        ``statement`` is :func:`models.accounting.statement.render` of this calibration's facts
        (:meth:`statement_facts`), and ``plain`` the same in the page's words
        (:func:`models.accounting.statement.render_plain`); the guarantee against each party, as data, is the pipeline's
        (``pipeline.modes.local.esa.parties``).
        """
        facts = self.statement_facts(shuffler=shuffler)
        assert facts.plain is not None
        common = {"mode": "local", "algorithm": self.algorithm, "delta": self.delta,
                  "trusted": "only the user's own device: it keeps the exact statistic and adds the noise",
                  "protects": "the rewards a user gives and which item of a shown list they acted on (which "
                              "lists were shown and answered is public, as in every mode)",
                  "neighbours": "one interaction replaced: another reward, and another item of the same shown "
                                "list (L2 sensitivity 2 of r x)",
                  "statistics": [self._report_statistic()],
                  "statement": render(facts), "plain": render_plain(facts.plain, facts.parties)}
        if self.user_level:
            return {**common, **self._user_guarantee()}
        if self.algorithm == "tree":
            return {**common, "epsilon": self.epsilon, "valid": True, "mechanism": self.mechanism}
        if not self.shuffled:
            return {**common, "epsilon": self.epsilon, "valid": True, "noise": "gaussian", "sigma": self.sigma}
        from models.accounting.shuffling import shuffled_epsilon

        g = shuffled_epsilon(self.epsilon0, self.shuffle_batch, self.delta)
        return {**common, "epsilon": self.epsilon0, "delta": 0.0, "valid": True, "noise": "laplace",
                "laplace_scale": self.laplace_scale, "shuffle_batch": self.shuffle_batch,
                "central_epsilon": self.epsilon, "central_delta": self.delta,
                "central_bound": {"epsilon": g.epsilon, "delta": g.delta, "bound": g.bound, "amplified": g.amplified,
                                  "note": g.note}}

    def statement_facts(self, *, shuffler: str = "worker") -> StatementFacts:
        """The facts of this calibration's statement (:meth:`guarantee`'s ``shuffler``): what a report releases,
        the guarantee against each party, how reports compose, and at user level the epoch's scope and the
        lifetime budget's stopping rule."""
        if shuffler not in ("worker", "separate"):
            raise ValueError(f"`shuffler` must be 'worker' or 'separate', got {shuffler!r}.")
        eps, delta, cap = self.epsilon, self.delta, self.cap
        mu = gdp_mu(eps, delta)
        scope = limit = ""
        if self.user_level:
            scope = (f"per epoch of {self.epoch_seconds:g} s a device makes at most {cap} reports, and any {cap} of "
                     f"its reports together are ({eps:g}, {delta:g})-DP; its whole history composes")
            n = self.report_limit()
            limit = "" if n is None else (f"the device stops after {n} reports, its lifetime budget "
                                          f"({self.user_budget:g}, {delta:g})")
        parties: tuple[Party, ...] = ()
        if self.codewords:
            b = self.blanket
            release = (f"each report sends its listen as the codeword of the listened item in a public codebook of "
                       f"{self.codewords}, with a blanket of fake codewords (each with probability {b.p:.4g}; Balcer "
                       f"& Cheu), shuffled message by message in population-wide batches of {self.shuffle_batch} "
                       f"distinct users")
            parties = _shuffle_parties(f"{cap} batches of a device together are ({eps:g}, {delta:g})-DP (exact "
                                       f"analysis)", None, shuffler)
            composition = f"n reports spend ceil(n / {cap}) times that"
        elif self.shuffled:
            e0 = self.epsilon0
            release = (f"each report m = r x + Laplace({self.laplace_scale:.3g})^d is pure {e0:.4g}-LDP (L1 "
                       f"sensitivity 2 sqrt(d) over every context and reward)")
            if self.user_level:
                eps_b, delta_b = self.batch_guarantee
                batch = f"each shuffled batch of {self.shuffle_batch} distinct users is ({eps_b:.4g}, {delta_b:.3g})-DP"
                composition = (f"a device's reports are in distinct batches, so {cap} of them compose (basic) to "
                               f"({eps:g}, {delta:g})")
            else:
                batch = (f"batches of {self.shuffle_batch} distinct users stripped of identity make each batch "
                         f"({eps:g}, {delta:g})-DP centrally (Feldman, McMillan & Talwar 2021)")
                composition = "a user's reports in k batches compose"
            parties = _shuffle_parties(batch, e0, shuffler)
        elif self.algorithm == "tree" and self.user_level:
            release = (f"the device releases its running sum b_u = sum r x through '{self.mechanism}', whose epochs "
                       f"are blocks of {cap} reports calibrated to their multi-participation sensitivity (factor "
                       f"{self.participation_factor:.3g} over one report's, at most {cap})")
            composition = (f"blocks compose in Gaussian DP (mu_block = {mu:.3g}: n reports spend mu_block "
                           f"sqrt(floor(n/cap) + B(n mod cap)/B(cap)))")
        elif self.algorithm == "tree":
            release = (f"each device releases its own running sum b_u = sum r x through '{self.mechanism}' "
                       f"({MECHANISMS[self.mechanism]}); the whole report stream of a user is ({eps:g}, {delta:g})-DP "
                       f"with respect to any one of their interactions (local DP, event level)")
            composition = ("a user with k interactions is covered at group level k; everything the server computes "
                           "is post-processing")
        elif self.user_level:
            release = (f"each report m = r x + N(0, {self.sigma:.3g}^2 I) is Gaussian DP mu = {mu / math.sqrt(cap):.3g} "
                       f"(L2 sensitivity 2)")
            composition = f"{cap} reports compose to mu = {mu:.3g}; n reports spend mu sqrt(n / cap)"
        else:
            release = (f"each report m = r x + N(0, {self.sigma:.3g}^2 I) is ({eps:g}, {delta:g})-LDP (Gaussian DP "
                       f"mu = {mu:.3g}, L2 sensitivity 2); each interaction is in one report")
            composition = f"a user's k reports compose to mu sqrt(k) (k = 4: epsilon {gdp_epsilon(2 * mu, delta):.3g})"
        return StatementFacts(release=release, parties=parties, composition=composition, scope=scope, limit=limit,
                              plain=self._plain())

    def _plain(self) -> Plain:
        """The page's words (the page is the device): where the answers stay, and what the bound covers."""
        where = ("Local mode: this page is your device. It keeps your listens and skips, adds the noise itself (from "
                 "your browser's cryptographic random numbers) and sends only the noisy report"
                 + (f", at most {self.cap} reports per epoch" if self.user_level else "")
                 + "; the server, Kafka and Redis never see a raw answer.")
        if self.user_level:
            return Plain(where=where, covers="everything you did in an epoch — every listen, every skip, which items "
                                             "you picked", observer="the shuffled batches" if self.shuffled else
                         "what the server sees", epsilon=self.epsilon, delta=self.delta,
                         total="The ε above adds this up over your whole history.")
        if self.shuffled:
            return Plain(where=where, covers="any one answer of yours", observer="each report",
                         epsilon=self.epsilon0, delta=0.0)
        if self.algorithm == "tree":
            return Plain(where=where, covers="any one of your answers — whether you listened or skipped",
                         observer="everything this browser ever reports", epsilon=self.epsilon, delta=self.delta)
        return Plain(where=where, covers="any one answer of yours", observer="each report", epsilon=self.epsilon,
                     delta=self.delta, total="Your reports add up: the ε above grows with each one.")

    def _user_guarantee(self) -> dict[str, Any]:
        """User level: what a device's whole history gets (the fields of the global mode's user-level statement)."""
        out: dict[str, Any] = {
            "unit": "user", "cap": self.cap, "cap_policy": "device", "epoch_seconds": self.epoch_seconds,
            "epsilon": self.epsilon, "valid": True,
            "ratios": [self.participation_ratio(k) for k in range(1, self.cap + 1)],
            "neighbours": "user level, on the device: two report streams of one device differing in everything the "
                          "user did (every reward and every choice; rewards in [0, 1], contexts clipped to norm 1)",
            "user_budget": {"epsilon": self.user_budget if math.isfinite(self.user_budget) else None,
                            "delta": self.delta, "reports_allowed": self.report_limit()}}
        if self.codewords:
            b = self.blanket
            out.update({"mu_at_cap": None, "noise": "blanket", "codewords": self.codewords, "p": b.p,
                        "shuffle_batch": self.shuffle_batch,
                        "composition": "exact within cap batches (models.local.items); blocks of cap reports: basic"})
        elif self.shuffled:
            eps_b, delta_b = self.batch_guarantee
            out.update({"mu_at_cap": None, "noise": "laplace", "laplace_scale": self.laplace_scale,
                        "epsilon0": self.epsilon0, "shuffle_batch": self.shuffle_batch,
                        "central_per_batch": {"epsilon": eps_b, "delta": delta_b},
                        "composition": "basic: k batches, k times each batch's (epsilon, delta)"})
        elif self.algorithm == "tree":
            out.update({"mu_at_cap": gdp_mu(self.epsilon, self.delta), "mechanism": self.mechanism,
                        "sensitivity": {"rule": "multi-participation sensitivity sqrt(B(cap)) of the device's "
                                                "mechanism over a block of cap reports (models.mechanisms.participation)",
                                        "factor_vs_one_tick": self.participation_factor,
                                        "group_bound_factor": self.cap}})
        else:
            out.update({"mu_at_cap": gdp_mu(self.epsilon, self.delta), "noise": "gaussian", "sigma": self.sigma})
        return out

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
                               "noise": None, "shuffle_batch": self.shuffle_batch, "unit": self.unit,
                               "capacity": self.capacity,
                               "user_budget": self.user_budget if math.isfinite(self.user_budget) else None,
                               "report_limit": self.report_limit()}
        if self.user_level:  # what a device enforces (and the server checks): reports per epoch, and the ledger
            out.update({"cap": self.cap, "epoch_seconds": self.epoch_seconds,
                        "ratios": [self.participation_ratio(k) for k in range(1, self.cap + 1)]})
        if self.algorithm == "tree":
            mech = self._variance_mechanism()
            desc: dict[str, Any] = {"name": self.mechanism, "capacity": self.mechanism_capacity}
            if hasattr(mech, "theta") and hasattr(mech, "w"):  # BLT: what a browser needs to run it
                desc.update({"kind": "blt", "theta": [float(v) for v in getattr(mech, "theta")],
                             "w": [float(v) for v in getattr(mech, "w")], "scale": float(getattr(mech, "scale"))})
            else:
                desc["kind"] = getattr(mech, "name", type(mech).__name__)
            out["mechanism"] = desc
        elif self.codewords:  # the codebook itself (public, from the catalog) is added by the web server
            b = self.blanket
            out["noise"] = {"kind": "blanket", "codewords": self.codewords, "p": b.p, "batch": b.batch,
                            "messages": "privrec.ItemBlanket/1: the listen's codeword with probability r, and each "
                                        "of the codewords independently with probability p"}
            out["codewords"] = self.codewords
        elif self.shuffled:
            out["noise"] = {"kind": "laplace", "scale": self.laplace_scale, "epsilon0": self.epsilon0}
        else:
            out["noise"] = {"kind": "gaussian", "sigma": self.sigma}
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field (``user_budget`` ``None`` for inf: JSON has none); :meth:`from_dict` reads it back."""
        return {"algorithm": self.algorithm, "d": self.d, "epsilon": self.epsilon, "delta": self.delta,
                "mechanism": self.mechanism, "capacity": self.capacity, "shuffle_batch": self.shuffle_batch,
                "unit": self.unit, "cap": self.cap, "epoch_seconds": self.epoch_seconds,
                "user_budget": self.user_budget if math.isfinite(self.user_budget) else None,
                "codewords": self.codewords}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LocalConfig:
        """The config :meth:`to_dict` wrote; a dict written before user level (no ``unit``) is event level."""
        budget = data.get("user_budget")
        return cls(algorithm=str(data["algorithm"]), d=int(data["d"]), epsilon=float(data["epsilon"]),
                   delta=float(data["delta"]), mechanism=str(data.get("mechanism") or "blt-exact"),
                   capacity=int(data.get("capacity") or 1023), shuffle_batch=int(data.get("shuffle_batch") or 0),
                   unit=str(data.get("unit") or "event"), cap=int(data.get("cap") or DEFAULT_CAP),
                   epoch_seconds=float(data.get("epoch_seconds") or DEFAULT_EPOCH_SECONDS),
                   user_budget=math.inf if budget is None else float(budget),
                   codewords=int(data.get("codewords") or 0))


def _participation(config: LocalConfig, what: str) -> Any:
    """``factor`` and ``ratios`` (``B(k) / B(cap)``, ``k = 1..cap``) of a ``tree`` device's mechanism, cached."""
    from models.mechanisms.participation import participation_bound

    key = dataclasses.replace(config, user_budget=math.inf)  # the budget changes neither
    hit = _PARTICIPATION.get(key)
    if hit is None:
        unit_mech = make_mechanism(config.mechanism, dim=1, sensitivity=REPORT_SENSITIVITY, epsilon=config.epsilon,
                                   delta=config.delta, horizon=config.mechanism_capacity, seed=0,
                                   sensitivity_l1=REPORT_SENSITIVITY)
        bounds = [participation_bound(unit_mech, k) for k in range(1, config.cap + 1)]
        hit = _PARTICIPATION[key] = {"factor": math.sqrt(bounds[-1] / bounds[0]),
                                     "ratios": [b / bounds[-1] for b in bounds]}
    return hit[what]




def _shuffle_parties(batch: str, epsilon0: float | None, shuffler: str) -> tuple[Party, ...]:
    """The parties of a shuffled protocol's statement: ``batch``, the central guarantee of the shuffled batches;
    ``epsilon0``, each report's local guarantee (``None``: none, the blanket); ``shuffler``, who runs the shuffler."""
    local = (f"each report is only its local {epsilon0:.4g}-LDP" if epsilon0 is not None else
             "there is no local guarantee (a device's codeword is among its own fakes)")
    if shuffler == "worker":
        return (Party("the operator of this server, which receives each report with its user id and runs the "
                      "shuffler itself", local),
                Party("anyone who sees only the shuffled batches (the released statistics, the analysts)", batch))
    return (Party("the operator of the analyzer (and of this server)", batch,
                  "while the shuffler, a separate service that sees who reports but no content (reports are sealed "
                  "to the analyzer's key; docs/local-parties.md), is honest"),
            Party("the shuffler's and the analyzer's operators colluding", local))


@dataclass(frozen=True)
class LocalVariant:
    """One named local-mode protocol: what a device reports and who mixes it (docs/local-protocol.md's table).

    Parameters
    ----------
    name
        The one name the CLI, the code, the experiments (row ``local-<name>``) and the docs use.
    about
        One line: what a device sends, and the guarantee's kind.
    algorithm, shuffle_batch, codewords, cap
        The :class:`LocalConfig` fields (and pipeline settings ``local_algorithm``, ``shuffle_batch``,
        ``local_codewords``, ``user_cap``) the variant sets; ``cap`` ``None``: the unit's default cap.
        ``shuffle_batch`` is the smallest batch: a run may need a larger one for its epsilon.
    research
        ``True``: kept for comparison (measured to learn little or nothing on LastFM); ``False``: the default.
    """

    name: str
    about: str
    algorithm: str
    shuffle_batch: int = 0
    codewords: int = 0
    cap: int | None = None
    research: bool = True

    @property
    def settings(self) -> dict[str, int | str]:
        """The pipeline settings this variant stands for (``privrec up --local-variant NAME`` sets them)."""
        out: dict[str, int | str] = {"local_algorithm": self.algorithm, "shuffle_batch": self.shuffle_batch,
                                     "local_codewords": self.codewords}
        if self.cap is not None:
            out["user_cap"] = self.cap
        return out

    def config(self, *, d: int, epsilon: float, delta: float = 1e-5, unit: str = "user", cap: int | None = None,
               shuffle_batch: int | None = None, **kw: Any) -> LocalConfig:
        """The devices' :class:`LocalConfig` of this variant (``cap`` / ``shuffle_batch``: override the table's)."""
        cap = cap if cap is not None else self.cap if self.cap is not None else DEFAULT_CAP
        batch = self.shuffle_batch if shuffle_batch is None else shuffle_batch
        return LocalConfig(algorithm=self.algorithm, d=d, epsilon=epsilon, delta=delta, shuffle_batch=batch, unit=unit,
                           cap=cap, codewords=self.codewords, **kw)


#: The local mode's variants, by name (one name each, everywhere). ``shuffled-items`` learns and is the default.
VARIANTS: dict[str, LocalVariant] = {v.name: v for v in (
    LocalVariant("shuffled-items", "each listen as the codeword of its item (a public codebook of 64) through a blanket "
                                   "of fake messages, in population-wide shuffled batches of >= 150 distinct users, "
                                   "2 reports per device and epoch; central (epsilon, delta) against the analyzer",
                 algorithm="round", shuffle_batch=150, codewords=64, cap=2, research=False),
    LocalVariant("shuffled-vectors", "a pure epsilon0-LDP Laplace report r x per interaction, shuffled in batches of "
                                     "distinct users of one model unit; central (epsilon, delta) per batch",
                 algorithm="round", shuffle_batch=200),
    LocalVariant("round", "a Gaussian report r x + N(0, sigma^2 I) per interaction, no shuffler; "
                          "(epsilon, delta)-LDP against everyone", algorithm="round"),
    LocalVariant("tree", "each device releases its own b_u through its own continual-release tree (LDP-CoLin); "
                         "(epsilon, delta)-LDP against everyone", algorithm="tree"),
)}
DEFAULT_VARIANT = "shuffled-items"


def variant_of(config: LocalConfig) -> str:
    """The name of ``config``'s variant (:data:`VARIANTS`), whatever its batch size, cap or codebook size.

    >>> variant_of(VARIANTS["shuffled-items"].config(d=4, epsilon=2.0))
    'shuffled-items'
    >>> variant_of(LocalConfig(algorithm="round", d=4, epsilon=2.0, shuffle_batch=3))
    'shuffled-vectors'
    """
    if config.codewords:
        return "shuffled-items"
    if config.shuffled:
        return "shuffled-vectors"
    return config.algorithm
