"""Simulated users' devices for a local-mode replay: each user runs :class:`models.local.LocalClient`.

The replay never sees a user's reward leave the device: the device turns it into a report, and only
the report goes to ``POST /report``. A device's state lives in memory, or with ``state_dir`` in one
file per user (so a replay that is stopped and started again continues each device's versions and
re-sends its pending reports as they were).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from models.local import FileStorage, LocalClient, LocalConfig, LocalReport, MemoryStorage
from models.local.config import DEFAULT_CAP, DEFAULT_EPOCH_SECONDS

__all__ = ["Devices", "config_from_public"]


def config_from_public(public: dict[str, Any]) -> LocalConfig:
    """The device calibration from ``GET /local/config``."""
    if public.get("mode") != "local":
        raise ValueError(f"the stack runs in {public.get('mode')!r} mode, not local")
    mech = public.get("mechanism") or {}
    budget = public.get("user_budget")
    user = public.get("unit") == "user"
    return LocalConfig(algorithm=str(public["algorithm"]), d=int(public["d"]), epsilon=float(public["epsilon"]),
                       delta=float(public["delta"]), mechanism=str(mech.get("name") or "blt-exact"),
                       capacity=int(public.get("capacity") or mech.get("capacity") or 1023),
                       shuffle_batch=int(public.get("shuffle_batch") or 0), unit="user" if user else "event",
                       cap=int(public.get("cap") or DEFAULT_CAP),
                       epoch_seconds=float(public.get("epoch_seconds") or DEFAULT_EPOCH_SECONDS),
                       user_budget=math.inf if budget is None else float(budget),
                       codewords=int(public.get("codewords") or 0))


class Devices:
    """One :class:`LocalClient` per user, created on first use."""

    def __init__(self, config: LocalConfig, state_dir: str | Path | None = None, *,
                 esa: dict[str, Any] | None = None, codebook: Any = None) -> None:
        self.config = config
        self.esa = esa  # a separate shuffler (GET /local/config's "esa"): reports are sealed and sent there
        #: ``config.codewords``: the public codebook (GET /local/config's "codebook")
        self.codebook = None if codebook is None else np.asarray(codebook, dtype=np.float64)
        self.state_dir = None if state_dir is None else Path(state_dir)
        self._clients: dict[str, LocalClient] = {}

    def client(self, user: str) -> LocalClient:
        c = self._clients.get(user)
        if c is None:
            if self.state_dir is None:
                storage: Any = MemoryStorage()
            else:
                safe = re.sub(r"[^A-Za-z0-9_.-]", "_", user)
                storage = FileStorage(self.state_dir / f"device-{safe}.json")
            c = self._clients[user] = LocalClient(user, self.config, storage, codebook=self.codebook)
        return c

    def report(self, user: str, *, rec_id: str, x: list[float], reward: float) -> LocalReport:
        return self.client(user).report(rec_id=rec_id, x=np.asarray(x, dtype=np.float64), reward=reward)

    def outgoing(self, report: LocalReport) -> tuple[str | None, bytes]:
        """Where ``report`` goes and its bytes: ``(None, report)`` for ``/report``, or the shuffler's URL and the
        envelope with the content sealed to the analyzer (:mod:`models.local.esa`)."""
        if self.esa is None:
            return None, report.to_json()
        from models.local.esa import seal_report
        from models.local.seal import b64decode

        return str(self.esa["shuffler"]), seal_report(report, b64decode(self.esa["public_key"])).to_json()

    def acknowledge(self, report: LocalReport) -> None:
        self.client(report.user).acknowledge(report.version)

    def __iter__(self) -> Any:
        return iter(self._clients.values())
