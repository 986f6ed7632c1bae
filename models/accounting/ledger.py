"""A user's record in the user-level ledger (pure: the global fold and the local analyzer both keep it).

Re-exported by :mod:`pipeline.config.ledger`, which says what the ledger is and how the budget reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LedgerRecord"]


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
