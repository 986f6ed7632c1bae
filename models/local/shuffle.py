"""The shuffler of local mode: batches of one report per distinct user, stripped and shuffled.

A batch belongs to one model unit (the server must know which unit's statistic a report adds to;
the unit is public, and within the batch every report shares it). It closes when ``n`` distinct
users of that unit have reported; a user's next report waits for the unit's next batch (one report
per user per batch: the condition of the amplification theorem). What leaves the shuffler is the
unit, a sequence number, the multiset of the answered lists' shown items (public, for the Gram) and the report
vectors in a random order — no user, version or request id. The order comes from the operating
system's randomness (:class:`random.SystemRandom`), never from a seeded generator.

Examples
--------
>>> from models.local import LocalConfig, LocalReport
>>> cfg = LocalConfig(algorithm="round", d=1, epsilon=2.0, shuffle_batch=2)
>>> sh = Shuffler(cfg)
>>> sh.add(LocalReport("a", 1, "round", "r1", [0.5], ("i1",)), unit=0)
[]
>>> sh.add(LocalReport("a", 2, "round", "r2", [0.7], ("i1",)), unit=0)  # "a" is in the open batch: waits
[]
>>> [b.n for b in sh.add(LocalReport("b", 1, "round", "r3", [0.1], ("i2",)), unit=0)]
[2]
>>> sh.open_users(0)                                                     # a's second report opened the next
['a']
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import LocalConfig
from .reports import LocalReport

__all__ = ["ShuffledBatch", "Shuffler", "BATCH_SCHEMA", "POPULATION"]

BATCH_SCHEMA = "privrec.ShuffledBatch/1"
#: Batch label of population-wide statistics (no model unit): unit 0 of a one-unit aggregate.
POPULATION = 0
_RNG = random.SystemRandom()


@dataclass(frozen=True)
class ShuffledBatch:
    """What the aggregator receives: no identities, the vectors in a random order."""

    unit: int
    seq: int
    items: list[str]
    vectors: list[list[float]]
    epsilon: float
    delta: float
    bound: str = ""
    #: item reports' messages of every report of the batch (catalog rows, the real items and the blanket's fakes),
    #: shuffled together: the analyzer sees only their multiset (models.local.items)
    messages: list[int] = field(default_factory=list)
    #: which analysis ``epsilon`` / ``delta`` come from: ``"amplification"`` (Laplace reports) or ``"blanket"``
    #: (codewords: :meth:`Shuffler.guarantee`); ``""`` in batches written before the field
    analysis: str = ""

    @property
    def n(self) -> int:
        return len(self.vectors)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {"schema": BATCH_SCHEMA, "unit": self.unit, "seq": self.seq, "items": self.items,
                                "m": self.vectors, "epsilon": self.epsilon, "delta": self.delta, "bound": self.bound}
        if self.messages:
            body["msgs"] = self.messages
        if self.analysis:
            body["analysis"] = self.analysis
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes, *, d: int) -> ShuffledBatch:
        """Parse a batch; ``ValueError`` naming what is wrong."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
            raise ValueError(f"batch: not JSON ({e})") from None
        if not isinstance(body, dict) or body.get("schema") != BATCH_SCHEMA:
            raise ValueError(f"batch: must be a JSON object with schema {BATCH_SCHEMA!r}")
        unit, seq, items, m = body.get("unit"), body.get("seq"), body.get("items"), body.get("m")
        if not isinstance(unit, int) or not isinstance(seq, int) or unit < 0 or seq < 1:
            raise ValueError("batch: unit and seq must be integers (unit >= 0, seq >= 1)")
        if isinstance(unit, bool) or isinstance(seq, bool):
            raise ValueError("batch: unit and seq must be integers, not booleans")
        if not isinstance(items, list) or not isinstance(m, list) or len(items) < len(m) or not m:
            raise ValueError("batch: items and m must be non-empty lists, items at least as long as m (every item "
                             "of every answered list)")
        if not all(isinstance(i, str) and i for i in items):
            raise ValueError("batch: items must be non-empty strings")
        if not all(isinstance(row, list) and len(row) == d and all(isinstance(v, (int, float)) and
                                                                    not isinstance(v, bool) for v in row) for row in m):
            raise ValueError(f"batch: m must be {len(m)} lists of {d} numbers")
        try:
            arr = np.asarray(m, dtype=np.float64)
        except OverflowError:  # a JSON integer too large for a float
            raise ValueError(f"batch: m must be {len(m)} finite vectors of length {d}") from None
        if not np.isfinite(arr).all():
            raise ValueError(f"batch: m must be {len(m)} finite vectors of length {d}")
        eps, delta = body.get("epsilon", 0.0), body.get("delta", 0.0)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (eps, delta)):
            raise ValueError("batch: epsilon and delta must be numbers")
        try:
            eps, delta = float(eps), float(delta)
        except OverflowError:  # a JSON integer too large for a float
            raise ValueError("batch: epsilon and delta must be numbers a float can hold") from None
        if not (eps >= 0.0 and 0.0 <= delta <= 1.0):  # NaN fails every comparison
            raise ValueError(f"batch: epsilon must be >= 0 and delta in [0, 1], got {eps!r} and {delta!r}")
        msgs = body.get("msgs", [])
        if not isinstance(msgs, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in msgs):
            raise ValueError("batch: msgs must be a list of catalog rows (integers >= 0)")
        return cls(unit, seq, list(items), arr.tolist(), eps, delta, str(body.get("bound", "")), list(msgs),
                   str(body.get("analysis", "")))


@dataclass
class _Open:
    reports: OrderedDict[str, LocalReport] = field(default_factory=OrderedDict)
    waiting: deque[LocalReport] = field(default_factory=deque)
    messages: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # (user, version) -> item messages


class Shuffler:
    """Per unit, collect one report per distinct user; emit a shuffled batch every ``shuffle_batch`` users."""

    def __init__(self, config: LocalConfig) -> None:
        if not config.shuffled:
            raise ValueError("the shuffler needs `shuffle_batch` > 0.")
        self.config = config
        self.n = config.shuffle_batch
        self._open: dict[int, _Open] = {}
        self.seq: dict[int, int] = {}
        self._guarantee: tuple[float, float, str] | None = None

    def guarantee(self) -> tuple[float, float, str]:
        """``(epsilon, delta, bound)`` of one full batch alone, central (against whoever sees only batches).

        Laplace reports: the amplification by shuffling of their ``epsilon0`` (Feldman, McMillan & Talwar).
        Codewords: the blanket's exact analysis of one batch of ``n`` users at the calibrated ``p``
        (:func:`models.local.items.blanket_epsilon` at ``delta``; bound ``"blanket-exact"``): the reports carry no
        Laplace noise, and any ``cap`` batches of one user together are the calibration's ``(epsilon, delta)``.
        """
        if self._guarantee is None:
            if self.config.codewords:
                from .items import blanket_epsilon

                eps = blanket_epsilon(self.n, self.config.blanket.p, self.config.delta)
                self._guarantee = (float(eps), float(self.config.delta), "blanket-exact")
            else:
                from models.accounting.shuffling import shuffled_epsilon

                g = shuffled_epsilon(self.config.epsilon0, self.n, self.config.delta)
                self._guarantee = (float(g.epsilon), float(g.delta), str(g.bound))
        return self._guarantee

    @property
    def analysis(self) -> str:
        """The analysis of :meth:`guarantee` (a batch's ``analysis`` field): ``"blanket"`` or ``"amplification"``."""
        return "blanket" if self.config.codewords else "amplification"

    def open_users(self, unit: int) -> list[str]:
        o = self._open.get(unit)
        return [] if o is None else list(o.reports)

    def add(self, report: LocalReport, *, unit: int, messages: Sequence[int] = ()) -> list[ShuffledBatch]:
        """Add one report (with its item ``messages``, if any); return the batches it completed (zero or more).

        ``unit`` is the batch label: a model unit, or :data:`POPULATION` for population-wide statistics (the item
        term, a shared model): such batches take distinct users of every unit and fill at the whole stream's pace.
        """
        o = self._open.setdefault(unit, _Open())
        if messages:
            o.messages[(report.user, report.version)] = [int(m) for m in messages]
        if report.user in o.reports:
            o.waiting.append(report)
            return []
        o.reports[report.user] = report
        out: list[ShuffledBatch] = []
        while len(o.reports) >= self.n:
            out.append(self._close(unit, o))
            pending, o.waiting = list(o.waiting), deque()
            for rep in pending:  # the waiting reports open the next batch, one per user, in arrival order
                if rep.user in o.reports:
                    o.waiting.append(rep)
                else:
                    o.reports[rep.user] = rep
        return out

    def _close(self, unit: int, o: _Open) -> ShuffledBatch:
        reports = list(o.reports.values())
        o.reports = OrderedDict()
        vectors = [r.vector.tolist() for r in reports]
        items = [a for r in reports for a in r.shown]  # every shown item (public): the batch's Gram rows
        messages = [m for r in reports for m in o.messages.pop((r.user, r.version), [])]
        _RNG.shuffle(vectors)
        _RNG.shuffle(items)
        _RNG.shuffle(messages)  # every message on its own: the real item and the fakes are indistinguishable
        self.seq[unit] = self.seq.get(unit, 0) + 1
        eps, delta, bound = self.guarantee()
        return ShuffledBatch(unit, self.seq[unit], items, vectors, eps, delta, bound, messages, self.analysis)

    def state(self) -> dict[str, Any]:
        """What is held (for persistence by the caller): open reports per unit and sequence numbers."""
        return {"seq": dict(self.seq),
                "open": {u: [r.to_dict() for r in [*o.reports.values(), *o.waiting]] for u, o in self._open.items()},
                "messages": {u: {f"{user}\n{version}": m for (user, version), m in o.messages.items()}
                             for u, o in self._open.items() if o.messages}}
