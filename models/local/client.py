"""One user's device in local mode: their exact statistic, their own noise, nothing else leaves.

:class:`LocalClient` keeps, in storage the device owns (a file, or anything with ``load`` /
``save``), the user's exact running sum ``b_u``, the noise state of their own mechanism, their
secret noise seed, the report counter and the reports not yet acknowledged. Every new report is
saved *before* it is returned, so a device that crashes after sending, or before, re-sends the
same bytes after a restart: released noise is never redrawn.

Examples
--------
>>> import numpy as np
>>> from models.local import LocalConfig
>>> cfg = LocalConfig(algorithm="tree", d=2, epsilon=2.0, capacity=15)
>>> store = MemoryStorage()
>>> dev = LocalClient("7", cfg, store, seed=1)
>>> rep = dev.report(rec_id="r1", x=np.array([0.6, 0.8]), reward=1.0)
>>> rep.version, dev.exact_b.tolist()
(1, [0.6, 0.8])
>>> again = LocalClient("7", cfg, store)          # a restarted device
>>> again.pending()[0] == rep                       # the same report, the same noise
True

At user level (:attr:`LocalConfig.unit` ``"user"``) the device also keeps its ledger — the epoch of its last
report, its reports in that epoch, and (its report counter) everything it ever reported — and refuses a report
past the cap of the epoch or the lifetime budget (:class:`ReportRefused`), persisted like the rest: a restart
forgets nothing.

>>> cfg = LocalConfig(algorithm="round", d=2, epsilon=2.0, unit="user", cap=2, user_budget=4.0)
>>> dev = LocalClient("8", cfg, MemoryStorage(), seed=1, clock=lambda: 0.0)
>>> [dev.report(rec_id=f"r{i}", x=np.array([0.6, 0.8]), reward=1.0).epoch for i in range(2)]
[0, 0]
>>> dev.report(rec_id="r3", x=np.array([0.6, 0.8]), reward=1.0)
Traceback (most recent call last):
...
models.local.client.ReportRefused: cap: this device made its 2 reports of epoch 0 (cap 2 per epoch of 16383 s); the next is allowed in epoch 1
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from models.ground.noise import KeyedNoise
from models.mechanisms.base import TreeState

from .config import LocalConfig
from .reports import LocalReport

__all__ = ["Storage", "MemoryStorage", "FileStorage", "LocalClient", "ReportRefused", "codeword_messages"]

STATE_SCHEMA = "privrec.LocalClientState/2"
#: States written before user level (no ledger): still read, as a device with no report in any epoch yet.
_OLD_SCHEMAS = ("privrec.LocalClientState/1",)
#: Noise stream of per-round reports (the device's mechanism uses stream 0).
ROUND_STREAM = 1


class Storage(Protocol):
    """Where a device keeps its state: ``load`` returns what the last ``save`` wrote (or ``None``)."""

    def load(self) -> bytes | None: ...

    def save(self, data: bytes) -> None: ...


class MemoryStorage:
    """State in memory (tests, simulations)."""

    def __init__(self) -> None:
        self.data: bytes | None = None

    def load(self) -> bytes | None:
        return self.data

    def save(self, data: bytes) -> None:
        self.data = bytes(data)


class FileStorage:
    """State in one file, replaced atomically (write, fsync, rename): a crash leaves the old or the new."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def save(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def codeword_messages(config: LocalConfig, code: int, reward: float, rng: np.random.Generator) -> tuple[int, ...]:
    """A listen's messages (``config.codewords`` = ``K``): the blanket's ``Bin(K + 1, p)`` distinct fake values of
    ``[0, K]`` (the dummy ``K`` is blanketed too), and ``code`` with probability ``reward`` — else the dummy ``K`` in
    its place, so that every report carries ``Bin(K + 1, p) + 1`` messages whatever the data (a shuffler that counts
    sealed messages learns nothing) and a listen against no listen is the blanket's covered pair; the analyzer
    drops the dummies (:meth:`models.local.items.ItemBlanket.randomize` with ``dummy``)."""
    return tuple(config.blanket.randomize(code, reward=reward, rng=rng, dummy=True).tolist())


def _floats(a: NDArray[np.float64]) -> list[Any]:
    out: list[Any] = np.asarray(a, dtype=np.float64).tolist()  # json writes floats with repr: an exact round trip
    return out


class ReportRefused(Exception):
    """The device will not make this report: ``reason`` ``"cap"`` (the epoch's cap is reached) or ``"budget"``
    (the lifetime budget is spent). Nothing changed on the device."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class LocalClient:
    """A user's device.

    Parameters
    ----------
    user
        The user's id (public: who reports is known, as in every mode).
    config
        The namespace's public :class:`~models.local.LocalConfig`.
    storage
        Where the state lives (default: memory only — a real device passes a :class:`FileStorage`).
    seed
        The device's secret noise seed on first use (default: ``secrets.randbits(63)``); ignored when
        the storage already holds a state.
    clock
        Seconds since the Unix epoch (default ``time.time``): at user level, which epoch a report falls in.
    codebook
        ``config.codewords``: the public codebook (``GET /local/config``'s ``codebook``, ``codewords x d``); a
        report's ``x`` is then the listened item's context, sent as its nearest codeword with probability
        ``reward`` among the blanket's fakes (:meth:`models.local.items.ItemBlanket.randomize`), and ``m`` is zero.
    """

    def __init__(self, user: str, config: LocalConfig, storage: Storage | None = None, *,
                 seed: int | None = None, clock: Callable[[], float] = time.time,
                 codebook: NDArray[np.float64] | None = None) -> None:
        if not isinstance(user, str) or not user:
            raise ValueError(f"`user` must be a non-empty string, got {user!r}.")
        self.user = user
        self.config = config
        self.clock = clock
        self.codebook = None if codebook is None else np.asarray(codebook, dtype=np.float64)
        if config.codewords and (self.codebook is None or self.codebook.shape != (config.codewords, config.d)):
            raise ValueError(f"`codebook` must be the public codebook of {config.codewords} x {config.d} codewords "
                             f"(GET /local/config), got {None if self.codebook is None else self.codebook.shape}.")
        #: The ledger (user level): the epoch of the last report and the reports made in it.
        self.epoch, self.in_epoch = -1, 0
        self.storage: Storage = storage if storage is not None else MemoryStorage()
        raw = self.storage.load()
        if raw is None:
            self.seed = int(secrets.randbits(63) if seed is None else seed)
            self.version = 0
            self.mechanism = config.device_mechanism(self.seed) if config.algorithm == "tree" else None
            self.state: TreeState | None = None if self.mechanism is None else self.mechanism.init_state()
            self._pending: list[LocalReport] = []
            self._exact = np.zeros(config.d)
            self._save()
        else:
            self._restore(raw)

    # ------------------------------------------------------------------ state

    def _restore(self, raw: bytes) -> None:
        data = json.loads(raw)
        if data.get("schema") != STATE_SCHEMA and data.get("schema") not in _OLD_SCHEMAS:
            raise ValueError(f"stored state has schema {data.get('schema')!r}, expected {STATE_SCHEMA!r}.")
        if data["user"] != self.user:
            raise ValueError(f"stored state belongs to user {data['user']!r}, not {self.user!r}.")
        stored = LocalConfig.from_dict(data["config"])
        if stored != self.config:
            raise ValueError(f"stored state was made under {stored}, not {self.config}: a device must keep its "
                             f"calibration (a new one would release the same data again).")
        self.seed = int(data["seed"])
        self.version = int(data["version"])
        ledger = data.get("ledger") or {"epoch": -1, "k": 0}
        self.epoch, self.in_epoch = int(ledger["epoch"]), int(ledger["k"])
        self._exact = np.asarray(data["exact"], dtype=np.float64)
        self.mechanism = self.config.device_mechanism(self.seed) if self.config.algorithm == "tree" else None
        st = data.get("state")
        self.state = None if st is None else TreeState(
            step=int(st["step"]), epoch=int(st["epoch"]), prefix=np.asarray(st["prefix"], dtype=np.float64),
            carry=np.asarray(st["carry"], dtype=np.float64), nodes=np.asarray(st["nodes"], dtype=np.float64))
        self._pending = [LocalReport(user=self.user, version=int(p["version"]), algorithm=self.config.algorithm,
                                     rec_id=p["rec_id"], vector=np.asarray(p["vector"]), epoch=p.get("epoch"),
                                     messages=tuple(p.get("msgs", ())))
                         for p in data["pending"]]

    def _save(self) -> None:
        st = None if self.state is None else {"step": self.state.step, "epoch": self.state.epoch,
                                              "prefix": _floats(self.state.prefix),
                                              "carry": _floats(self.state.carry), "nodes": _floats(self.state.nodes)}
        data = {"schema": STATE_SCHEMA, "user": self.user, "config": self.config.to_dict(), "seed": self.seed,
                "version": self.version, "exact": _floats(self._exact), "state": st,
                "ledger": {"epoch": self.epoch, "k": self.in_epoch},
                "pending": [{"version": p.version, "rec_id": p.rec_id, "vector": _floats(p.vector), "epoch": p.epoch,
                             "msgs": list(p.messages)} for p in self._pending]}
        self.storage.save(json.dumps(data, separators=(",", ":")).encode())

    @property
    def exact_b(self) -> NDArray[np.float64]:
        """The device's exact ``b_u = sum r x`` (never leaves the device)."""
        return self._exact.copy()

    # ------------------------------------------------------------------ the ledger

    def spent(self) -> tuple[float, float]:
        """``(epsilon, delta)`` of everything this device has reported (:meth:`LocalConfig.spent`)."""
        return self.config.spent(self.version)

    def check(self) -> int | None:
        """Raise :class:`ReportRefused` if the next report is past the cap or the budget; else its epoch (``None``
        at event level, where there is no cap)."""
        cfg = self.config
        limit = cfg.report_limit()
        if limit is not None and self.version + 1 > limit:
            eps, delta = self.spent()
            raise ReportRefused("budget", f"this device made the {limit} reports its lifetime budget allows "
                                          f"(user_budget epsilon {cfg.user_budget:g}; spent ({eps:.4g}, {delta:.3g}))")
        if not cfg.user_level:
            return None
        epoch = max(self.epoch, cfg.epoch_at(self.clock()))  # a clock that goes back never reopens an epoch
        if epoch == self.epoch and self.in_epoch >= cfg.cap:
            raise ReportRefused("cap", f"this device made its {self.in_epoch} reports of epoch {epoch} (cap {cfg.cap} "
                                       f"per epoch of {cfg.epoch_seconds:g} s); the next is allowed in epoch "
                                       f"{epoch + 1}")
        return epoch

    # ------------------------------------------------------------------ reports

    def report(self, *, rec_id: str, x: NDArray[np.float64], reward: float) -> LocalReport:
        """The report of one interaction: the reward ``reward`` on the item of list ``rec_id`` whose context is ``x``.

        Which item it was stays on the device (inside the noisy vector): the report names only the list.
        Raises :class:`ReportRefused` (and changes nothing) past the epoch's cap or the lifetime budget.

        The new state and the report are saved before the report is returned; send it, then
        :meth:`acknowledge` it. ``x`` is scaled to norm 1 if longer (the sensitivity assumes it).
        """
        r = float(reward)
        if not (math.isfinite(r) and 0.0 <= r <= 1.0):
            raise ValueError(f"`reward` must be a number in [0, 1], got {reward!r}.")
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.config.d,) or not np.isfinite(x).all():
            raise ValueError(f"`x` must be {self.config.d} finite numbers, got shape {x.shape}.")
        norm = float(np.linalg.norm(x))
        if norm > 1.0:
            x = x / norm
        epoch = self.check()
        version = self.version + 1
        messages: tuple[int, ...] = ()
        exact = self._exact + r * x
        if self.config.algorithm == "tree":
            assert self.mechanism is not None and self.state is not None
            vector, state, _ = self.mechanism.step_to(self.state, exact)
        elif self.config.codewords:  # the listen as a codeword among the blanket's fakes; m carries nothing
            from .items import ITEM_STREAM, nearest_code

            assert self.codebook is not None
            rng = np.random.default_rng([self.seed, ITEM_STREAM, version])  # keyed: a re-send never redraws
            code = int(nearest_code(self.codebook, x)[0])
            messages = codeword_messages(self.config, code, r, rng)
            vector, state = np.zeros(self.config.d), None
        else:
            source = KeyedNoise(self.seed, ROUND_STREAM)
            if self.config.shuffled:
                noise = source.laplace(self.config.laplace_scale, (self.config.d,), epoch=0, level=0, index=version)
            else:
                noise = source.normal(self.config.sigma, (self.config.d,), epoch=0, level=0, index=version)
            vector, state = r * x + noise, None
        rep = LocalReport(user=self.user, version=version, algorithm=self.config.algorithm, rec_id=str(rec_id),
                          vector=vector, epoch=epoch, messages=messages)
        self.version, self._exact, self.state = version, exact, state
        if epoch is not None:
            self.in_epoch = self.in_epoch + 1 if epoch == self.epoch else 1
            self.epoch = epoch
        self._pending.append(rep)
        self._save()
        return rep

    def pending(self) -> list[LocalReport]:
        """Reports made but not yet acknowledged, oldest first (re-send them as they are)."""
        return list(self._pending)

    def acknowledge(self, version: int) -> None:
        """The server has report ``version`` (and every earlier one): forget them."""
        kept = [p for p in self._pending if p.version > int(version)]
        if len(kept) != len(self._pending):
            self._pending = kept
            self._save()
