"""Local mode's analyzer, pure: one fold from decoded reports (or shuffled batches) to per-unit sums.

The worker's ingest (:mod:`pipeline.modes.local.ingest`), the offline twin (:class:`models.local.LocalUCB`) and the
experiments all run this fold, so what ``privrec experiment modes`` measures is the code the worker runs. In the
style of TF Privacy's tree aggregation: a frozen state (:class:`AnalyzerState`, one partition's sums, with its codec
to the Redis hash the worker stores), a frozen configuration (:class:`Analyzer`) and ``step(state, batch) ->
(state, dead_letters)``, where ``batch`` is :class:`Reports` (decoded reports, each with its user's unit) or
:class:`Batches` (shuffled batches, opened). A refused input is a :class:`DeadLetter` naming the reason; the rest
counts. :func:`merge` sums partitions' states into what the release publishes, :func:`released_stats` makes it
the released statistics.

The server never holds an exact per-user value. Per model unit it keeps the public Gram ``sum x x^T`` of every
item of the answered lists (never the item a user chose), the count, and the sum of the noisy report vectors: for
``tree`` each user's *latest* noisy running sum (a new report replaces the user's previous one, so the unit sum
moves by the difference), for ``round`` every report. It also keeps the public noise variance of each unit's sum,
a function of the calibration and the report versions only. Noise off (``vector`` = the exact value), the unit
sums equal the global mode's exact statistics of the same interactions.

Examples
--------
>>> import numpy as np
>>> from models.local import LocalConfig, LocalReport
>>> an = Analyzer(LocalConfig(algorithm="tree", d=2, epsilon=2.0), n_units=1, contexts=lambda items: np.eye(2)[:1])
>>> st = an.init_state()
>>> st, dead = an.step(st, Reports([(0, LocalReport("u", 1, "tree", "r1", [1.1, 0.2], ("a",)), 0),
...                                 (1, LocalReport("u", 2, "tree", "r2", [1.9, -0.1], ("a",)), 0)]))
>>> st.b[0].tolist(), int(st.count[0]), dead   # version 2 replaced version 1
([1.9, -0.1], 2, [])
>>> st, dead = an.step(st, Reports([(2, LocalReport("u", 2, "tree", "r3", [5.0, 5.0], ("a",)), 0)]))
>>> dead
[DeadLetter(key=2, reason="local report: stale or repeated version 2 of user 'u' (latest 2)", counter=None)]
>>> AnalyzerState.from_mapping(st.to_mapping(), n_units=1, d=2).to_mapping() == st.to_mapping()
True
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from models.accounting.ledger import LedgerRecord
from models.accounting.events import NoNoiseEvent
from models.streaming import ReleasedStats, UnitStats

from .aggregate import StaleReport, check_version, clip_context, unit_noise_std
from .config import LocalConfig
from .items import ItemBlanket
from .reports import LocalReport, ReportError
from .shuffle import ShuffledBatch

__all__ = ["Analyzer", "AnalyzerState", "Reports", "Batches", "DeadLetter", "BeyondLimit", "Counted",
           "check_user_level", "merge", "released_stats"]

FloatArray = NDArray[np.float64]
Latest = Mapping[str, tuple[int, FloatArray | None]]


@dataclass(frozen=True, slots=True)
class AnalyzerState:
    """One partition's sums of reports (never mutated: :meth:`Analyzer.step` returns a new state).

    Attributes
    ----------
    gram, b, count, var
        Per unit: the Gram of the shown lists' public contexts ``(n_units, d, d)``, the sum of the noisy report
        vectors ``(n_units, d)``, the reports counted, and the public noise variance of each unit's ``b``.
    latest
        Each user's latest version, and (``tree``) their latest noisy running sum.
    seqs
        Shuffled batches: each unit's last counted batch sequence number.
    ledger
        User level: each user's record (epoch, reports in it, last version), checked by :func:`check_user_level`.
    items, items_var, items_n
        Item reports: the sum of the batches' unbiased estimates ``h - n p`` (noisy), its public noise variance per
        item (the sum of ``n p (1 - p)``) and the item reports counted; ``items`` is ``None`` before any.
    """

    gram: FloatArray
    b: FloatArray
    count: NDArray[np.int64]
    var: FloatArray
    latest: Latest = field(default_factory=dict)
    seqs: Mapping[int, int] = field(default_factory=dict)
    ledger: Mapping[str, LedgerRecord] = field(default_factory=dict)
    items: FloatArray | None = None
    items_var: float = 0.0
    items_n: int = 0

    @classmethod
    def zeros(cls, n_units: int, d: int) -> AnalyzerState:
        return cls(np.zeros((n_units, d, d)), np.zeros((n_units, d)), np.zeros(n_units, dtype=np.int64),
                   np.zeros(n_units))

    def stats(self) -> UnitStats:
        """The sums as :class:`~models.streaming.UnitStats` (noisy ``b``; copies)."""
        return UnitStats(self.gram.copy(), self.b.copy(), self.count.copy())

    def noise_std(self, V: FloatArray | None = None) -> float:
        """Largest per-coordinate noise std of the (mixed by ``V``) sums."""
        return unit_noise_std(self.var, V)

    # -- codec: the worker's Redis hash, field by field (``g:<u>``, ``b:<u>``, ``n:<u>``, ``v:<u>``, ``s:<u>``,
    # ``l:<user>``, ``e:<user>``, ``i:sums``, ``i:var``, ``i:n``); arrays are little-endian float64 bytes
    def to_mapping(self, units: Iterable[int] | None = None, users: Iterable[str] | None = None,
                   with_items: bool = True) -> dict[str, bytes | str]:
        """The hash fields of ``units`` and ``users`` (default: all) and, ``with_items``, the item sums."""
        out: dict[str, bytes | str] = {}
        for u in sorted(range(len(self.count)) if units is None else units):
            out |= {f"g:{u}": self.gram[u].astype("<f8").tobytes(), f"b:{u}": self.b[u].astype("<f8").tobytes(),
                    f"n:{u}": str(int(self.count[u])), f"v:{u}": repr(float(self.var[u]))}
            if u in self.seqs:
                out[f"s:{u}"] = str(self.seqs[u])
        for user in sorted(self.latest if users is None else users):
            version, vector = self.latest[user]
            head = struct.pack("<q", version)
            out[f"l:{user}"] = head if vector is None else head + vector.astype("<f8").tobytes()
            if user in self.ledger:
                out[f"e:{user}"] = self.ledger[user].dumps()
        if with_items and self.items is not None:
            out |= {"i:sums": self.items.astype("<f8").tobytes(), "i:var": repr(self.items_var),
                    "i:n": str(self.items_n)}
        return out

    @classmethod
    def from_mapping(cls, raw: Mapping[bytes, bytes] | Mapping[str, bytes | str], *, n_units: int, d: int
                     ) -> AnalyzerState:
        """The state a hash written by :meth:`to_mapping` holds (an empty hash: :meth:`zeros`)."""
        z = cls.zeros(n_units, d)
        latest: dict[str, tuple[int, FloatArray | None]] = {}
        seqs: dict[int, int] = {}
        ledger: dict[str, LedgerRecord] = {}
        fields = {(k.decode() if isinstance(k, bytes) else k): (v.encode() if isinstance(v, str) else v)
                  for k, v in raw.items()}
        for k, v in fields.items():
            kind, _, name = k.partition(":")
            if kind == "g":
                z.gram[int(name)] = np.frombuffer(v, dtype="<f8").reshape(d, d)
            elif kind == "b":
                z.b[int(name)] = np.frombuffer(v, dtype="<f8")
            elif kind == "n":
                z.count[int(name)] = int(v)
            elif kind == "v":
                z.var[int(name)] = float(v)
            elif kind == "s":
                seqs[int(name)] = int(v)
            elif kind == "l":
                version = struct.unpack("<q", v[:8])[0]
                latest[name] = (version, np.frombuffer(v[8:], dtype="<f8").copy() if len(v) > 8 else None)
            elif kind == "e":
                ledger[name] = LedgerRecord.loads(v)
        items = None if "i:sums" not in fields else np.frombuffer(fields["i:sums"], dtype="<f8").copy()
        return cls(z.gram, z.b, z.count, z.var, latest, seqs, ledger, items,
                   float(fields["i:var"]) if items is not None else 0.0,
                   int(fields["i:n"]) if items is not None else 0)


# ---------------------------------------------------------------------------------------------- inputs, refusals

@dataclass(frozen=True)
class Reports:
    """Decoded reports of one batch: ``(key, report, unit of its user)``; ``now`` is the server's clock (user level)."""

    entries: Sequence[tuple[int, LocalReport, int]]
    now: float = 0.0


@dataclass(frozen=True)
class Batches:
    """Shuffled batches (opened, if they were sealed): ``(key, batch)``."""

    entries: Sequence[tuple[int, ShuffledBatch]]


@dataclass(frozen=True)
class DeadLetter:
    """An input that does not count: its ``key``, the ``reason``, and the public ledger's counter it moves
    (``"dropped"`` / ``"over_budget"``) or ``None``."""

    key: int
    reason: str
    counter: str | None = None


class BeyondLimit(Exception):
    """A report past what its device may send: ``counter`` ``"dropped"`` (beyond the epoch's cap, or an epoch the
    server cannot accept) or ``"over_budget"`` (past the lifetime budget's report limit)."""

    def __init__(self, counter: str, message: str) -> None:
        super().__init__(message)
        self.counter = counter


class Counted(Protocol):
    """What the cap is checked from: a report's (or a sealed envelope's) user, version and epoch."""

    @property
    def user(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def epoch(self) -> int | None: ...


def check_user_level(config: LocalConfig, ledger: Mapping[str, LedgerRecord], rep: Counted, now: float
                     ) -> LedgerRecord:
    """The user's ledger record with ``rep`` counted, or :class:`BeyondLimit` / :class:`ReportError` naming why
    not (user level; ``now``: the server's clock). Checked from the report's version and epoch alone: the
    server never trusts the device to have kept its cap or its budget."""
    limit = config.report_limit()
    if limit is not None and rep.version > limit:
        raise BeyondLimit("over_budget", f"past the lifetime budget: version {rep.version} of user {rep.user!r} is "
                                         f"beyond the {limit} reports user_budget epsilon {config.user_budget:g} "
                                         f"allows a device")
    if rep.epoch is None:
        raise ReportError("epoch", "missing: at user level a report carries its epoch (floor(t / epoch_seconds))")
    now_epoch = config.epoch_at(now)
    if rep.epoch > now_epoch + 1:  # one epoch of clock skew at most
        raise BeyondLimit("dropped", f"epoch {rep.epoch} is ahead of the server's epoch {now_epoch} (a device "
                                     f"cannot open a new epoch early)")
    rec = ledger.get(rep.user, LedgerRecord(epoch=-1))
    if rep.epoch < rec.epoch:
        raise BeyondLimit("dropped", f"epoch {rep.epoch} is before user {rep.user!r}'s last reported epoch "
                                     f"{rec.epoch} (epochs never go back)")
    k = rec.k if rep.epoch == rec.epoch else 0
    if k >= config.cap:
        raise BeyondLimit("dropped", f"beyond the cap: user {rep.user!r} already has {k} reports in epoch "
                                     f"{rep.epoch} (cap {config.cap} per epoch); version {rep.version} refused")
    return LedgerRecord(epoch=rep.epoch, k=k + 1, last_version=rep.version)


# ---------------------------------------------------------------------------------------------- the fold

@dataclass
class _Work:
    """A step's mutable copy of the state (never escapes :meth:`Analyzer.step`)."""

    gram: FloatArray
    b: FloatArray
    count: NDArray[np.int64]
    var: FloatArray
    latest: dict[str, tuple[int, FloatArray | None]]
    seqs: dict[int, int]
    ledger: dict[str, LedgerRecord]
    items: FloatArray | None
    items_var: float
    items_n: int

    @classmethod
    def of(cls, s: AnalyzerState) -> _Work:
        return cls(s.gram.copy(), s.b.copy(), s.count.copy(), s.var.copy(), dict(s.latest), dict(s.seqs),
                   dict(s.ledger), s.items, s.items_var, s.items_n)

    def freeze(self) -> AnalyzerState:
        return AnalyzerState(self.gram, self.b, self.count, self.var, self.latest, self.seqs, self.ledger, self.items,
                             self.items_var, self.items_n)


@dataclass(frozen=True)
class Analyzer:
    """The analyzer's public configuration: the devices' calibration and what the batches may carry.

    Parameters
    ----------
    config
        The namespace's public device calibration (:class:`~models.local.LocalConfig`).
    n_units
        Model units of the catalog.
    contexts
        The clipped public contexts of the named items, one row each (``KeyError`` / ``ValueError`` for an unknown
        item: the input is a dead letter naming it).
    codebook
        ``config.codewords``: the public codebook; a batch's messages are codewords of listens, folded into ``b``.
    item_blanket
        The public calibration of item reports (:class:`~models.local.items.ItemBlanket`): a batch's item messages
        (catalog rows, real items and fakes shuffled together) add their histogram's unbiased estimate ``h - n p``
        to the item sums, with its public variance ``n p (1 - p)``.
    item_term
        With codewords (the codebook is the catalog itself, codeword ``c`` = catalog row ``c``): the same estimate
        of the codewords' histogram is added to the item sums too (post-processing of what ``b`` is made of).
    """

    config: LocalConfig
    n_units: int
    contexts: Callable[[Sequence[str]], FloatArray]
    codebook: FloatArray | None = None
    item_blanket: ItemBlanket | None = None
    item_term: bool = False
    #: ``codewords``: the messages' blanket, and the noise variance one message adds per coordinate of ``b``, per
    #: unit of ``n p (1 - p)`` (derived from the fields above)
    codes: ItemBlanket | None = field(init=False, default=None)
    code_var: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        cfg = self.config
        if cfg.codewords:
            if self.codebook is None or np.shape(self.codebook) != (cfg.codewords, cfg.d):
                raise ValueError(f"`codebook` must be {cfg.codewords} x {cfg.d} with codewords on")
            object.__setattr__(self, "codes", cfg.blanket)  # frozen: derived once here
            object.__setattr__(self, "code_var", float((np.asarray(self.codebook) ** 2).sum(axis=0).max()))

    def init_state(self) -> AnalyzerState:
        return AnalyzerState.zeros(self.n_units, self.config.d)

    def step(self, state: AnalyzerState, batch: Reports | Batches) -> tuple[AnalyzerState, list[DeadLetter]]:
        """Fold ``batch`` into ``state``: the new state and the inputs that do not count, with their reasons."""
        work, dead = _Work.of(state), []
        if isinstance(batch, Reports):
            for key, rep, unit in batch.entries:
                try:
                    self._add_report(work, rep, unit, batch.now)
                except BeyondLimit as e:
                    dead.append(DeadLetter(key, f"local report: {e}", e.counter))
                except (ReportError, StaleReport, KeyError) as e:
                    dead.append(DeadLetter(key, f"local report: {e}"))
        else:
            for key, b in batch.entries:
                try:
                    self._add_batch(work, b)
                except (ValueError, KeyError) as e:
                    dead.append(DeadLetter(key, f"shuffled batch: {e}"))
        return work.freeze(), dead

    def _shown(self, rep: LocalReport) -> FloatArray:
        if not rep.shown:
            raise ReportError("shown", "missing: the server adds the answered list's items before the report is "
                                       "queued (a report written to ldp-reports by anyone else is refused)")
        return self.contexts(list(rep.shown))

    def _add_report(self, w: _Work, rep: LocalReport, unit: int, now: float) -> None:
        """Check then count one report (``tree``: the user's new noisy running sum replaces their previous one;
        ``round``: every report adds; the Gram takes every shown item, never the user's choice)."""
        cfg = self.config
        X = self._shown(rep)
        check_version(w.latest, rep)
        if cfg.user_level:
            w.ledger[rep.user] = check_user_level(cfg, w.ledger, rep, now)
        prev = w.latest.get(rep.user)
        X = np.asarray(X, dtype=np.float64).reshape(-1, cfg.d)
        w.gram[unit] += X.T @ X
        w.count[unit] += 1
        if cfg.algorithm == "tree":
            old_v, old_b = (0, None) if prev is None else prev
            w.b[unit] += rep.vector if old_b is None else rep.vector - old_b
            w.var[unit] += cfg.report_variance(rep.version) - cfg.report_variance(old_v)
            w.latest[rep.user] = (rep.version, rep.vector.copy())
        else:
            w.b[unit] += rep.vector
            w.var[unit] += cfg.report_variance(rep.version)
            w.latest[rep.user] = (rep.version, None)

    def _check_batch(self, w: _Work, b: ShuffledBatch) -> FloatArray:
        """The batch's shown contexts, or ``ValueError`` / ``KeyError`` naming why it does not count."""
        cfg = self.config
        if b.unit >= self.n_units:
            raise ValueError(f"batch: unknown unit {b.unit}")
        if b.seq <= w.seqs.get(b.unit, 0):
            raise ValueError(f"batch: repeated batch {b.seq} of unit {b.unit} (latest {w.seqs[b.unit]})")
        X = self.contexts(list(b.items))
        if cfg.codewords:
            if b.messages and max(b.messages) > cfg.codewords:
                raise ValueError(f"batch: msgs must be codeword indices up to {cfg.codewords} (the dummy)")
        elif b.messages and self.item_blanket is None:
            raise ValueError("batch: item messages, but this namespace has no item reports")
        elif b.messages and self.item_blanket is not None and max(b.messages) >= self.item_blanket.n_items:
            raise ValueError(f"batch: msgs must be catalog rows below {self.item_blanket.n_items}")
        return X

    def _add_batch(self, w: _Work, b: ShuffledBatch) -> None:
        """Check then count one shuffled batch: its Gram, its vectors, its codewords' or item messages' estimates."""
        cfg = self.config
        X = self._check_batch(w, b)
        per_item: tuple[FloatArray, float] | None = None  # the batch's item sums and their public variance
        if cfg.codewords:  # the listens: b = sum_c (h_c - n p) codeword_c
            codes = self.codes
            assert codes is not None and self.codebook is not None
            real = np.asarray([m for m in b.messages if m < cfg.codewords], dtype=np.int64)  # no dummies
            est = codes.estimate(codes.histogram(real), b.n)
            w.b[b.unit] += est @ self.codebook
            w.var[b.unit] += codes.variance(b.n) * self.code_var
            if self.item_term:  # codeword c is catalog row c: the same estimate, per item
                per_item = (est, codes.variance(b.n))
        elif b.messages and self.item_blanket is not None:
            per_item = (self.item_blanket.estimate(self.item_blanket.histogram(np.asarray(b.messages)), b.n),
                        self.item_blanket.variance(b.n))
        if per_item is not None:
            w.items = per_item[0].copy() if w.items is None else w.items + per_item[0]
            w.items_var += per_item[1]
            w.items_n += b.n
        w.gram[b.unit] += X.T @ X
        w.b[b.unit] += np.asarray(b.vectors).sum(axis=0)
        w.count[b.unit] += b.n
        w.var[b.unit] += b.n * cfg.report_variance(1)
        w.seqs[b.unit] = b.seq


# ---------------------------------------------------------------------------------------------- release

def merge(states: Sequence[AnalyzerState], *, n_units: int, d: int, population: bool) -> AnalyzerState:
    """The partitions' states summed (sums, counts, variances, item sums; no per-user field).

    ``population``: codewords' batches are population-wide, so every unit serves the population's model (its
    Gram, ``b`` and variance are the sums over units; counts stay as counted).
    """
    total = _Work.of(AnalyzerState.zeros(n_units, d))
    for s in states:
        total.gram += s.gram
        total.b += s.b
        total.count += s.count
        total.var += s.var
        if s.items is not None:
            total.items = s.items.copy() if total.items is None else total.items + s.items
            total.items_var, total.items_n = total.items_var + s.items_var, total.items_n + s.items_n
    if population:
        total.gram[:], total.b[:], total.var[:] = total.gram.sum(axis=0), total.b.sum(axis=0), total.var.sum()
    total.latest, total.seqs, total.ledger = {}, {}, {}
    return total.freeze()


def released_stats(total: AnalyzerState, structure: str, V: FloatArray, version: int) -> ReleasedStats:
    """The released statistics of summed states (no server noise: the devices added it), mixed by ``V``."""
    b_tilde = total.b.reshape(-1).copy() if structure == "linucb" else (V @ total.b).reshape(-1)
    return ReleasedStats(structure, V, total.gram.copy(), b_tilde, total.count.copy(), version, NoNoiseEvent(),
                         unit_noise_std(total.var, None if structure == "linucb" else V))
