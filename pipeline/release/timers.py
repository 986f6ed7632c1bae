"""Leader-only release and solve: one release tick per ``tick_seconds``, then a solve.

Both stages do blocking Redis I/O and numpy work, so they run in a worker
thread, never on the event loop that feeds ingest. :func:`register` adds the
timer to an app built by :mod:`pipeline.apps.worker_app` (this module never imports it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import faust

from ..config.keys import TICK_LOG_LENGTH, PublicKeys
from ..config.redisconn import connect
from ..data.catalog import Catalog
from ..config.settings import Settings
from ..config.metrics import WorkerMetrics
from ..state.foldround import FOLD_POLL_S, OwnedPartitions
from .stages import ReleaseStage, SolveStage

log = logging.getLogger("privrec.release")

__all__ = ["register", "ReleaseTicker"]


class ReleaseTicker:
    """One release tick then a solve (which also catches up after a restart); stages built on first use."""

    def __init__(self, settings: Settings, catalog: Catalog, metrics: WorkerMetrics | None = None,
                 release: Callable[..., Any] = ReleaseStage, owned: OwnedPartitions | None = None) -> None:
        self.settings, self.catalog, self.metrics = settings, catalog, metrics
        self._release = release  # the mode's release stage (local mode: pipeline.modes.local.release.LocalReleaseStage)
        self.owned = owned  # the partitions this worker's ingest owns (it folds them: pipeline.state.foldround)
        self._stages: tuple[Any, SolveStage] | None = None
        self._client: Any = None
        self._building = threading.Lock()  # the tick and the fold answer run in executor threads
        #: held by the tick (the leader folds its own partitions itself) and by a fold answer: one at a time
        self._folding = threading.Lock()

    def _build(self) -> tuple[Any, SolveStage]:
        with self._building:
            if self._stages is None:
                client = connect(self.settings.redis_url or "redis://127.0.0.1:6379/0")
                self._client = client
                release = self._release(self.settings, self.catalog, client)
                rounds = getattr(release, "fold_rounds", None)
                if rounds is not None:
                    rounds.owned = self.owned
                self._stages = (release, SolveStage(self.settings, client, release.statement, self.catalog))
        return self._stages

    def answer_fold(self) -> int:
        """Every worker: fold the partitions it owns that the leader's fold request waits for (user level)."""
        if self.owned is None or not self.owned.partitions:
            return 0
        rounds = getattr(self._build()[0], "fold_rounds", None)
        if rounds is None or not self._folding.acquire(blocking=False):  # this process's tick folds them itself
            return 0
        try:
            return int(rounds.answer())
        finally:
            self._folding.release()

    def tick(self) -> tuple[int | None, int | None]:
        release, solve = self._build()
        t0 = time.perf_counter()
        with self._folding:
            version = release.tick()
        t1 = time.perf_counter()
        solved = solve.run()
        t2 = time.perf_counter()
        if self.metrics is not None:
            if version is not None:
                self.metrics.releases.inc()
                self.metrics.release_seconds.observe(t2 - t0)
            self._ledger_metrics(release)
        self._log_tick(release, version, solved, t1 - t0, t2 - t1)
        return version, solved

    def _log_tick(self, release: Any, version: int | None, solved: int | None, release_s: float,
                  solve_s: float) -> None:
        """Push this tick's wall times and fold counters to the bounded tick log (newest first)."""
        fold = getattr(release, "last_fold", None) or {}
        entry = json.dumps({"version": version, "solved": solved, "release_s": round(release_s, 6),
                            "solve_s": round(solve_s, 6), "tick_s": round(release_s + solve_s, 6),
                            "at_ms": int(time.time() * 1000), **fold})
        key = PublicKeys(self.settings.namespace).tick_log
        with self._client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, entry)
            pipe.ltrim(key, 0, TICK_LOG_LENGTH - 1)
            pipe.execute()

    def _ledger_metrics(self, release: Any) -> None:
        """Users at the cap and the spent budget, from the ledger figures of the last release (user level)."""
        figures = getattr(release, "last_figures", None)
        if figures is None or self.metrics is None:
            return
        self.metrics.users_at_cap.set(figures["users_at_cap"])
        self.metrics.dropped.set(figures["capped_events"])
        self.metrics.users_at_budget.set(figures["users_at_budget"])
        self.metrics.budget_events.set(figures["budget_events"])
        self.metrics.spent_max.set(figures["spent_max"] if math.isfinite(figures["spent_max"]) else -1)
        self.metrics.spent_median.set(figures["spent_median"] if math.isfinite(figures["spent_median"]) else -1)


def register(app: faust.App, settings: Settings, catalog: Catalog, metrics: WorkerMetrics | None = None,
             release: Callable[..., Any] = ReleaseStage, owned: OwnedPartitions | None = None,
             interval: float | None = None) -> None:
    """Run a :class:`ReleaseTicker` every ``interval`` seconds (default ``tick_seconds``) on the leader of ``app``
    (``release``: the mode's stage); with ``owned`` (user level), every worker also answers the leader's fold rounds
    for the partitions it owns."""
    ticker = ReleaseTicker(settings, catalog, metrics, release, owned)
    every = settings.tick_seconds if interval is None else float(interval)
    if not (every > 0 and math.isfinite(every)):
        raise ValueError(f"`interval` must be a positive number of seconds, got {interval!r}.")

    if owned is not None and settings.user_level:
        @app.task
        async def answer_fold_rounds() -> None:  # a loop, not a faust timer: those warn when a run outlasts 50 ms
            loop = asyncio.get_running_loop()
            while True:
                await asyncio.sleep(FOLD_POLL_S)
                try:
                    await loop.run_in_executor(None, ticker.answer_fold)
                except Exception:  # keep answering: the leader folds what no owner folded after its grace
                    log.exception("fold round not answered")
                    await asyncio.sleep(1.0)

    @app.timer(every, on_leader=True)
    async def release_and_solve() -> None:
        loop = asyncio.get_running_loop()
        try:
            version, solved = await loop.run_in_executor(None, ticker.tick)
        except Exception:  # keep the timer alive; the next tick retries
            log.exception("release/solve tick failed")
            return
        if version is not None or solved is not None:
            log.info("released version %s, solved %s", version, solved)
