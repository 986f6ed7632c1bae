"""Watching a running worker from outside: its CPU seconds (``/proc``) and its progress in Redis."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["POLL_SECONDS", "Poller", "cpu_seconds"]

POLL_SECONDS = 0.01


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (``/proc/PID/stat`` fields 14 and 15)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Poller:
    """Polls every 10 ms: committed offsets (ingested), released and solved counts, worker CPU.

    A sample is ``(perf_counter, ingested, released, solved, worker_cpu_seconds)``; the
    offsets are the worker's durable counters (written with the statistics, atomically). At user level the
    released and solved counts include the events the fold refused (a user at the cap or past their budget: the
    ledger's ``dropped`` and ``over_budget``, also in :attr:`refused`), so "a solved model covers all N" means every
    event is in it or was refused by design.
    """

    redis_url: str
    namespace: str
    partitions: int
    pid: int | None = None
    samples: list[tuple[float, int, int, int, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        import redis

        from pipeline.config.keys import PublicKeys
        from pipeline.state.trusted import TrustedKeys

        self.client = redis.Redis.from_url(self.redis_url)
        tk, pk = TrustedKeys(self.namespace), PublicKeys(self.namespace)
        self.offset_keys = [tk.offset(p) for p in range(self.partitions)]
        self.summary_keys = [pk.ledger_summary(p) for p in range(self.partitions)]
        #: events the user-level fold refused so far (at the cap, past the budget)
        self.refused = 0
        self.released_key, self.meta_key, self.figures_key = pk.released, pk.model_meta, pk.release_figures
        self._solved = 0
        self.thread = threading.Thread(target=self._run, name="bench-poller", daemon=True)

    def sample(self) -> tuple[float, int, int, int, float]:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.mget(self.offset_keys)
            pipe.hget(self.released_key, "count")
            pipe.hget(self.meta_key, "events")
            pipe.hmget(self.figures_key, "version", "count")
            pipe.hget(self.meta_key, "version")
            for key in self.summary_keys:
                pipe.hmget(key, "dropped", "over_budget")
            offsets, released, solved, (fig_version, fig_count), served, *summaries = pipe.execute()
        self.refused = refused = sum(int(v or 0) for row in summaries for v in row)
        if fig_count is not None:  # add/remove: the exact figures are the operator's (the released count is noisy)
            released = fig_count
            if int(served or 0) >= int(fig_version or 0):
                self._solved = int(fig_count)
            solved = self._solved
        cpu = (cpu_seconds(self.pid) or 0.0) if self.pid is not None else 0.0
        return (time.perf_counter(), sum(int(o) for o in offsets if o is not None), int(released or 0) + refused,
                int(solved or 0) + refused, cpu)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            time.sleep(POLL_SECONDS)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()

    def wait(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.samples and predicate(self.samples[-1]):
                return
            time.sleep(POLL_SECONDS)
        raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}; last sample "
                           f"(t, ingested, released, solved) = {self.samples[-1] if self.samples else None}")

    def first(self, column: int, threshold: int) -> tuple[float, int, float] | None:
        """``(time, value, worker cpu)`` of the first sample whose ``column`` reaches ``threshold``."""
        for s in self.samples:
            if s[column] >= threshold:
                return s[0], int(s[column]), s[4]
        return None

    def timeline(self, t0: float, every: float = 0.25) -> list[list[float]]:
        """Samples about every ``every`` seconds: ``[seconds since t0, ingested, released, solved]``."""
        out: list[list[float]] = []
        for s in self.samples:
            if s[0] >= t0 and (not out or s[0] - t0 - out[-1][0] >= every):
                out.append([round(s[0] - t0, 3), s[1], s[2], s[3]])
        return out
