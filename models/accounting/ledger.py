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

    @property
    def class_field(self) -> str:
        """The record's *class*: ``epoch:k:past``, all that a user's figures depend on (spent budget, at the cap, at
        the budget; never ``last_version``). The ledger keeps how many users each class holds
        (:attr:`pipeline.config.keys.PublicKeys.ledger_classes`), so its figures cost the number of classes, not of
        users.

        >>> LedgerRecord(2, 1, 40, 0.5).class_field, LedgerRecord.of_class("2:1:0.5")
        ('2:1:0.5', LedgerRecord(epoch=2, k=1, last_version=0, past=0.5))
        """
        return f"{self.epoch}:{self.k}:{self.past!r}"

    @classmethod
    def of_class(cls, field: bytes | str) -> LedgerRecord:
        """A record of the class ``field`` (``last_version`` 0: a class does not keep it)."""
        epoch, k, past = (field.decode() if isinstance(field, bytes) else field).split(":")
        return cls(int(epoch), int(k), 0, float(past))

    def at(self, epoch: int, ratio: Callable[[int], float]) -> LedgerRecord:
        """The record as of ``epoch`` (closing the record's epoch into ``past`` when it is older)."""
        if epoch == self.epoch:
            return self
        return LedgerRecord(epoch, 0, self.last_version, self.past + (ratio(self.k) if self.k else 0.0))
