"""A user's record in the user-level ledger (pure: the global fold and the local analyzer both keep it).

Re-exported by :mod:`pipeline.config.ledger`, which says what the ledger is and how the budget reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["LedgerRecord", "LedgerColumns"]


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

    def dumps_many(self, last_versions: Iterable[int]) -> list[str]:
        """:meth:`dumps` of this record with each of ``last_versions`` in turn (the fold writes many users of one
        class at once), the same strings for a fraction of the cost.

        >>> LedgerRecord(2, 1, 0, 0.5).dumps_many([7, 9]) == [LedgerRecord(2, 1, v, 0.5).dumps() for v in (7, 9)]
        True
        """
        head = json.dumps({"epoch": self.epoch, "k": self.k})[:-1]
        tail = json.dumps({"past": self.past})[1:]
        return [f'{head}, "last_version": {int(v)}, {tail}' for v in last_versions]  # json writes int() as repr()

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


#: One record as :meth:`LedgerRecord.dumps` writes it, on a line of its own (``json.dumps``' separators and order).
_DUMPED = re.compile(rb'^\{"epoch": (-?\d+), "k": (-?\d+), "last_version": (-?\d+), "past": ([^,}\s]+)\}$',
                     re.MULTILINE)


@dataclass(frozen=True, eq=False)
class LedgerColumns:
    """Many users' stored records at once, by class (:attr:`LedgerRecord.class_field`): the fold decides per class,
    not per user, what a record's epoch, cap and budget say.

    ``classes`` are the distinct ``(epoch, k, past)`` of the records (each with ``last_version`` 0); per user,
    ``class_of`` is the index of their class (``-1``: no record stored) and ``last_version`` their own.

    >>> cols = LedgerColumns.loads([LedgerRecord(0, 1, 3).dumps(), None, LedgerRecord(0, 1, 7).dumps()])
    >>> cols.classes, cols.class_of.tolist(), cols.last_version.tolist()
    ([LedgerRecord(epoch=0, k=1, last_version=0, past=0.0)], [0, -1, 0], [3, 0, 7])
    >>> cols.record(2) == LedgerRecord.loads(LedgerRecord(0, 1, 7).dumps()), cols.record(1) == LedgerRecord()
    (True, True)
    """

    classes: list[LedgerRecord]
    class_of: NDArray[np.int64]
    last_version: NDArray[np.int64]

    @classmethod
    def loads(cls, raws: Sequence[bytes | str | None]) -> LedgerColumns:
        """The records ``raws`` (:meth:`LedgerRecord.dumps` JSON, ``None`` where a user has none), the same records
        as :meth:`LedgerRecord.loads` of each.

        Records exactly as :meth:`LedgerRecord.dumps` writes them are read by one regular expression over them all
        (a class is then its fields' text: ``json.dumps`` writes a number as its ``repr``, which is what
        :attr:`LedgerRecord.class_field` prints); any other JSON by one ``json.loads`` of them all.

        >>> raws = [b'{"epoch": 1, "k": 2, "last_version": 9, "past": 0.5}', None]
        >>> LedgerColumns.loads(raws) == LedgerColumns.loads([b'{"past": 0.5, "k": 2, "epoch": 1, "last_version": 9}',
        ...                                                    None])
        True
        """
        stored = [raw.encode() if isinstance(raw, str) else raw for raw in raws if raw is not None]
        present = np.fromiter((raw is not None for raw in raws), dtype=bool, count=len(raws))
        found = _DUMPED.findall(b"\n".join(stored)) if stored else []
        if len(found) == len(stored):
            texts: dict[tuple[bytes, bytes, bytes], int] = {}
            of_stored = [texts.setdefault((epoch, k, past), len(texts)) for epoch, k, _, past in found]
            versions = [int(v) for _, _, v, _ in found]
            classes = [LedgerRecord(int(epoch), int(k), 0, json.loads(past)) for epoch, k, past in texts]
        else:  # the fields a record left out have LedgerRecord's defaults, as in LedgerRecord.loads
            ids: dict[tuple[object, ...], int] = {}
            rows = json.loads(b"[" + b",".join(stored) + b"]")
            values = [(row.get("epoch", 0), row.get("k", 0), row.get("past", 0.0)) for row in rows]
            # a class is its values and their types (0 and 0.0 print differently in class_field)
            of_stored = [ids.setdefault((epoch, k, past, type(past)), len(ids)) for epoch, k, past in values]
            versions = [row.get("last_version", 0) for row in rows]
            classes = [LedgerRecord(epoch, k, 0, past) for epoch, k, past, _ in ids]  # type: ignore[arg-type]
        class_of = np.full(len(raws), -1, dtype=np.int64)
        last_version = np.zeros(len(raws), dtype=np.int64)
        class_of[present] = of_stored
        last_version[present] = versions
        return cls(classes, class_of, last_version)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, LedgerColumns) and self.classes == other.classes
                and np.array_equal(self.class_of, other.class_of) and np.array_equal(self.last_version,
                                                                                     other.last_version))

    def record(self, user: int) -> LedgerRecord:
        """User ``user``'s record (the default record when none is stored)."""
        at = int(self.class_of[user])
        if at < 0:
            return LedgerRecord()
        c = self.classes[at]
        return LedgerRecord(c.epoch, c.k, int(self.last_version[user]), c.past)
