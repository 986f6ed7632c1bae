"""The public user-level ledger: one record per user, and what it says about the user's spent budget.

Participations are public (who arrived, and in which release tick, is not protected: DESIGN §2), so the
ledger lives under the ``ledger`` key kind, which serving may read; it never holds a reward or a statistic.
Written by the release tick's fold (:mod:`pipeline.userlevel`), read by ``/budget``, the dashboard and the
metrics (:mod:`pipeline.budget_view`, :mod:`pipeline.metrics`).

Examples
--------
>>> rec = LedgerRecord(epoch=0, k=3, last_version=7)
>>> rec.at(1, lambda k: k / 4).past  # the closed epoch's 3 ticks, in units of B(cap)
0.75
>>> round(spent_mu(rec, 0, 0.5, lambda k: k / 4), 4)  # mu_cap * sqrt(B(3) / B(cap))
0.433
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LedgerRecord", "spent_mu"]


@dataclass
class LedgerRecord:
    """A user's participations: in the current ``epoch`` (``k``), and ``past`` (closed epochs, in units of B(cap))."""

    epoch: int = 0
    k: int = 0
    last_version: int = 0
    past: float = 0.0

    @classmethod
    def loads(cls, raw: bytes | str | None) -> LedgerRecord:
        return cls() if raw is None else cls(**json.loads(raw))

    def dumps(self) -> str:
        return json.dumps({"epoch": self.epoch, "k": self.k, "last_version": self.last_version, "past": self.past})

    def at(self, epoch: int, ratio: Callable[[int], float]) -> LedgerRecord:
        """The record as of ``epoch`` (closing the record's epoch into ``past`` when it is older)."""
        if epoch == self.epoch:
            return self
        return LedgerRecord(epoch, 0, self.last_version, self.past + (ratio(self.k) if self.k else 0.0))


def spent_mu(record: LedgerRecord, epoch: int, mu_cap: float, ratio: Callable[[int], float]) -> float:
    """``mu`` of a user's whole history: ``mu_cap * sqrt(past + B(k) / B(cap))`` (GDP composes over epochs)."""
    r = record.at(epoch, ratio)
    return mu_cap * math.sqrt(r.past + (ratio(r.k) if r.k else 0.0))
