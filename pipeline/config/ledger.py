"""The public user-level ledger: one record per user, and what it says about the user's spent budget.

Participations are public (who arrived, and in which release tick, is not protected: DESIGN §2), so the
ledger lives under the ``ledger`` key kind, which serving may read; it never holds a reward or a statistic.
Written by the release tick's fold (:mod:`pipeline.state.userlevel`), read by ``/budget``, the dashboard and the
metrics (:mod:`pipeline.serve.budget_view`, :mod:`pipeline.config.metrics`).

Examples
--------
>>> rec = LedgerRecord(epoch=0, k=3, last_version=7)
>>> rec.at(1, lambda k: k / 4).past  # the closed epoch's 3 ticks, in units of B(cap)
0.75
>>> round(spent_mu(rec, 0, 0.5, lambda k: k / 4), 4)  # mu_cap * sqrt(B(3) / B(cap))
0.433
>>> budget = LifetimeBudget(epsilon=1.0, delta=1e-5, mu=0.5, mu_cap=0.5, cap=4, ratio=lambda k: k / 4)
>>> budget.allows(rec, 0), budget.allows(LedgerRecord(0, 3, 7, past=0.5), 0)  # mu 0.5 * sqrt(1): allowed
(True, False)

The lifetime budget (setting ``user_budget``: epsilon at the stack's delta over every epoch) is a ``mu`` of
Gaussian DP, ``mu_budget``; the fold lets a user contribute one more tick only while ``mu_cap * sqrt(past +
B(k + 1) / B(cap)) <= mu_budget`` (:meth:`LifetimeBudget.allows`), so the ledger never shows more than the
budget; the user's later events are counted as ``over_budget`` (not learned (budget)).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from models.accounting.ledger import LedgerRecord  # pure: the local analyzer checks the cap with it too

__all__ = ["LedgerRecord", "LifetimeBudget", "spent_mu", "with_budget", "class_counts", "weighted_upper_median"]


def class_counts(records: Iterable[bytes | str]) -> Counter[str]:
    """How many of ``records`` (stored :class:`LedgerRecord` JSON) each class holds (:attr:`LedgerRecord.class_field`).

    >>> class_counts([LedgerRecord(0, 1, 3).dumps(), LedgerRecord(0, 1, 7).dumps(), LedgerRecord(0, 2, 7).dumps()])
    Counter({'0:1:0.0': 2, '0:2:0.0': 1})
    """
    return Counter(LedgerRecord.loads(raw).class_field for raw in records)


def spent_mu(record: LedgerRecord, epoch: int, mu_cap: float, ratio: Callable[[int], float]) -> float:
    """``mu`` of a user's whole history: ``mu_cap * sqrt(past + B(k) / B(cap))`` (GDP composes over epochs)."""
    r = record.at(epoch, ratio)
    return mu_cap * math.sqrt(r.past + (ratio(r.k) if r.k else 0.0))


@dataclass(frozen=True)
class LifetimeBudget:
    """A user's lifetime budget: ``epsilon`` at ``delta``, i.e. Gaussian DP ``mu``; the mechanism's ``mu_cap``,
    ``cap`` and ``ratio(k) = B(k) / B(cap)``."""

    epsilon: float
    delta: float
    mu: float
    mu_cap: float
    cap: int
    ratio: Callable[[int], float]

    @classmethod
    def of(cls, statement: dict[str, object], ratio: Callable[[int], float] | None) -> LifetimeBudget | None:
        """From a user-level statement with ``user_budget`` (:func:`with_budget`); ``None`` without one or noise."""
        b = statement.get("user_budget")
        mu_cap = statement.get("mu_at_cap")
        if not isinstance(b, dict) or ratio is None or not mu_cap or b.get("mu") is None:
            return None
        return cls(float(b["epsilon"]), float(b["delta"]), float(b["mu"]), float(mu_cap),  # type: ignore[arg-type]
                   int(statement["cap"]), ratio)  # type: ignore[call-overload]

    def allows(self, record: LedgerRecord, epoch: int) -> bool:
        """Whether one more tick of the user (in ``epoch``, below the cap) keeps their spent ``mu`` within budget."""
        r = record.at(epoch, self.ratio)
        return self.mu_cap * math.sqrt(r.past + self.ratio(r.k + 1)) <= self.mu

    def exhausted(self, record: LedgerRecord, epoch: int) -> bool:
        """Whether the user can never contribute again: not even one tick, in this epoch or (at the cap) the next."""
        r = record.at(epoch, self.ratio)
        if r.k >= self.cap:
            r = r.at(epoch + 1, self.ratio)
            epoch += 1
        return not self.allows(r, epoch)


def with_budget(statement: dict[str, object], epsilon: float, delta: float) -> dict[str, object]:
    """The user-level statement with its ``user_budget``: ``{"epsilon", "delta", "mu"}`` (``mu`` ``None`` for
    ``epsilon = inf`` or without noise: no budget is enforced; ``epsilon`` ``None`` for inf: JSON has none)."""
    from models.accounting import gdp_mu

    enforced = math.isfinite(epsilon) and bool(statement.get("mu_at_cap")) and bool(statement.get("private"))
    return {**statement, "user_budget": {"epsilon": epsilon if math.isfinite(epsilon) else None, "delta": delta,
                                         "mu": gdp_mu(epsilon, delta) if enforced else None}}


def weighted_upper_median(values: list[tuple[float, int]]) -> float:
    """The element at index ``len // 2`` of the sorted multiset ``values`` (value, count), 0.0 if empty.

    >>> weighted_upper_median([(1.0, 2), (3.0, 1)]), sorted([1.0, 1.0, 3.0])[3 // 2]
    (1.0, 1.0)
    >>> weighted_upper_median([(1.0, 1), (3.0, 1)]), weighted_upper_median([])
    (3.0, 0.0)
    """
    total = sum(n for _, n in values)
    seen = 0
    for v, n in values:
        seen += n
        if seen > total // 2:
            return v
    return 0.0
