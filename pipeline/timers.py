"""Leader-only release and solve: one release tick per ``tick_seconds``, then a solve.

Both stages do blocking Redis I/O and numpy work, so they run in a worker
thread, never on the event loop that feeds ingest. :func:`register` adds the
timer to an app built by :mod:`pipeline.app` (this module never imports it).
"""

from __future__ import annotations

import asyncio
import logging

import faust
import redis

from .catalog import Catalog
from .settings import Settings
from .stages import ReleaseStage, SolveStage

log = logging.getLogger("privrec.release")

__all__ = ["register", "ReleaseTicker"]


class ReleaseTicker:
    """One release tick then a solve (which also catches up after a restart); stages built on first use."""

    def __init__(self, settings: Settings, catalog: Catalog) -> None:
        self.settings, self.catalog = settings, catalog
        self._stages: tuple[ReleaseStage, SolveStage] | None = None

    def _build(self) -> tuple[ReleaseStage, SolveStage]:
        if self._stages is None:
            client = redis.Redis.from_url(self.settings.redis_url or "redis://127.0.0.1:6379/0")
            release = ReleaseStage(self.settings, self.catalog, client)
            self._stages = (release, SolveStage(self.settings, client, release.statement))
        return self._stages

    def tick(self) -> tuple[int | None, int | None]:
        release, solve = self._build()
        version = release.tick()
        solved = solve.run()
        return version, solved


def register(app: faust.App, settings: Settings, catalog: Catalog) -> None:
    """Run a :class:`ReleaseTicker` every ``tick_seconds`` on the leader of ``app``."""
    ticker = ReleaseTicker(settings, catalog)

    @app.timer(settings.tick_seconds, on_leader=True)
    async def release_and_solve() -> None:
        loop = asyncio.get_running_loop()
        try:
            version, solved = await loop.run_in_executor(None, ticker.tick)
        except Exception:  # keep the timer alive; the next tick retries
            log.exception("release/solve tick failed")
            return
        if version is not None or solved is not None:
            log.info("released version %s, solved %s", version, solved)
