"""Leader-only release and solve: one release tick per ``tick_seconds``, then a solve.

Both stages do blocking Redis I/O and numpy work, so they run in a worker
thread, never on the event loop that feeds ingest.
"""

from __future__ import annotations

import asyncio
import logging

import redis

from .app import app, catalog, settings
from .stages import ReleaseStage, SolveStage

log = logging.getLogger("privrec.release")

__all__ = ["release_and_solve"]

_stages: tuple[ReleaseStage, SolveStage] | None = None


def _build() -> tuple[ReleaseStage, SolveStage]:
    global _stages
    if _stages is None:
        client = redis.Redis.from_url(settings.redis_url or "redis://127.0.0.1:6379/0")
        release = ReleaseStage(settings, catalog, client)
        _stages = (release, SolveStage(settings, client, release.statement))
    return _stages


def _tick() -> tuple[int | None, int | None]:
    release, solve = _build()
    version = release.tick()
    solved = solve.run()  # also catches up after a restart
    return version, solved


@app.timer(settings.tick_seconds, on_leader=True)
async def release_and_solve() -> None:
    loop = asyncio.get_running_loop()
    try:
        version, solved = await loop.run_in_executor(None, _tick)
    except Exception:  # keep the timer alive; the next tick retries
        log.exception("release/solve tick failed")
        return
    if version is not None or solved is not None:
        log.info("released version %s, solved %s", version, solved)
