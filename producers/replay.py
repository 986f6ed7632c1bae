"""Replay logged events through the live HTTP API, as real users would.

For each logged event the replayer asks ``/recommend`` for the top item of
that event's pool, gives reward 1 iff it is the logged item (the replay
method of Li et al.; the papers' LastFM protocol), and posts ``/feedback``.
Rewards are compared with uniformly random play, whose expected reward per
event is ``1 / len(pool)`` exactly; the papers report the ratio.

Each logged event is also the user's own listen of the logged item: with ``listens`` it is posted to
``/listen`` after the feedback, **for every event**, whatever the reward (:func:`event_requests`). Which
requests arrive, and when, is public (the ledger counts arrivals); a listen sent only when the
recommendation missed would publish every reward.

Requests go through the API's client (:class:`producers.client.AsyncClient`: typed answers, a 503
retried after its ``Retry-After``). Events are sent in order at a capped rate, with a few requests in flight so
that network latency does not bound the rate; a user's events are never
reordered against each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from models.local import ReportRefused

from .client import APIError, AsyncClient, RecommendedItem
from .devices import Devices

__all__ = ["ReplayEvent", "ReplayResult", "ReplayError", "replay", "event_requests", "replay_schedule"]


@dataclass(frozen=True, slots=True)
class ReplayEvent:
    """What the replay needs of a logged event."""

    user: str
    arm: str
    pool: tuple[str, ...]
    #: the logged (listened) item's public features: what a device with codewords reports (its listen)
    listened: tuple[float, ...] | None = None


@dataclass
class ReplayResult:
    events: int = 0
    reward: float = 0.0
    random_reward: float = 0.0
    errors: int = 0
    seconds: float = 0.0
    cumulative: list[tuple[int, float, float]] = field(default_factory=list)  # (events, reward, random)
    first_model_version: int | None = None
    last_model_version: int | None = None
    versions: list[int] = field(default_factory=list)  # the model version each event was ranked with, in order

    def versions_per_1000(self) -> list[int]:
        """Distinct model versions seen in each window of 1,000 events: whether the model could follow."""
        return [len(set(self.versions[i:i + 1000])) for i in range(0, len(self.versions), 1000)]

    @property
    def ratio(self) -> float:
        return self.reward / self.random_reward if self.random_reward > 0 else float("nan")


class ReplayError(RuntimeError):
    """The API refused a request the replay cannot recover from."""


def event_requests(ev: ReplayEvent, reward: float, *, listens: bool = True) -> tuple[str, ...]:
    """The endpoints the replay calls for one logged event, in order (global mode).

    ``reward`` is the feedback's reward, and it changes nothing: arrivals are public, so no request may exist
    because of a reward or a choice. The logged event is the user's listen of ``ev.arm``, an organic positive
    that happened whatever the recommendation was, so it is posted after every feedback.

    >>> ev = ReplayEvent(user="2", arm="a", pool=("a", "b"))
    >>> event_requests(ev, 0.0), event_requests(ev, 1.0, listens=False)
    (('/recommend', '/feedback', '/listen'), ('/recommend', '/feedback'))
    """
    return ("/recommend", "/feedback", "/listen") if listens else ("/recommend", "/feedback")


def replay_schedule(events: Iterable[ReplayEvent], rewards: Iterable[float], *,
                    listens: bool = True) -> list[tuple[str, str]]:
    """``(user, endpoint)`` of every request the replay makes for ``events`` and their ``rewards``, in order."""
    return [(ev.user, path) for ev, r in zip(events, rewards) for path in event_requests(ev, r, listens=listens)]


async def _one(api: AsyncClient, ev: ReplayEvent, listens: bool = True,
               devices: Devices | None = None) -> tuple[float, int]:
    try:
        rec = await api.recommend(ev.user, k=1, candidates=ev.pool)
    except APIError as exc:
        raise ReplayError(f"/recommend for user {ev.user}: {exc}") from None
    top = rec.top
    reward = 1.0 if top.item == ev.arm else 0.0
    if devices is not None:  # local mode: the user's device turns the reward into a report; only that is sent
        await _send_report(api, devices, ev.user, rec.rec_id, top, reward, ev.listened)
        return reward, rec.model_version
    try:
        await api.feedback(rec.rec_id, top.item, reward)
    except APIError as exc:
        raise ReplayError(f"/feedback for {rec.rec_id}: {exc}") from None
    if "/listen" in event_requests(ev, reward, listens=listens):
        # the logged event is a listen the user chose: an organic positive (POST /listen), sent whatever the reward
        try:
            await api.listen(ev.user, ev.arm)
        except APIError as exc:
            raise ReplayError(f"/listen for user {ev.user}: {exc}") from None
    return reward, rec.model_version


async def _send_report(api: AsyncClient, devices: Devices, user: str, rec_id: str, item: RecommendedItem,
                       reward: float, listened: tuple[float, ...] | None = None) -> None:
    """Send the device's pending reports (an earlier one first, as it was), then forget them.

    With codewords the report answers the list and carries the logged listen (the user's choice: the offline twin's
    organic listen, ``models.local.policy.LocalItemUCB``), whether or not it was the recommended item."""
    assert item.x is not None, "local mode's /recommend gives each item's x"
    x, r = (list(listened), 1.0) if devices.config.codewords and listened is not None else (list(item.x), reward)
    try:
        devices.report(user, rec_id=rec_id, x=x, reward=r)
    except ReportRefused:  # user level: past the device's cap or budget, nothing new leaves it (pending ones do)
        pass
    for rep in devices.client(user).pending():
        try:
            url, body = devices.outgoing(rep)
            await (api.report(rep) if url is None else api.submit(url, body))
        except APIError as exc:
            # 409: the server already has this list's report (sent before a crash): it counts as delivered
            if exc.status != 409:
                raise ReplayError(f"/report for user {user}: {exc}") from None
        devices.acknowledge(rep)


async def _replay(base: str, events: Iterable[ReplayEvent], total: int, rate: float | None, concurrency: int,
                  progress: Callable[[int, ReplayResult], None] | None, checkpoints: int,
                  listens: bool = True, devices: Devices | None = None) -> ReplayResult:
    result = ReplayResult()
    busy_users: dict[str, asyncio.Future[None]] = {}
    sem = asyncio.Semaphore(concurrency)
    every = max(1, total // max(1, checkpoints))
    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        api = AsyncClient(base, session=session)
        # wait for a model
        deadline = time.monotonic() + 120
        while True:
            try:
                if (await api.health()).ok:
                    break
            except aiohttp.ClientError as exc:
                raise ReplayError(f"cannot reach the API at {base}: {exc}") from None
            except APIError:  # the model store restarting: wait as for a model
                pass
            if time.monotonic() > deadline:
                raise ReplayError(f"{base}/healthz did not report a model within 120 s")
            await asyncio.sleep(0.5)
        tasks: list[asyncio.Task[None]] = []

        async def run(i: int, ev: ReplayEvent, before: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
            try:
                if before is not None:
                    await before  # keep each user's events in order
                reward, version = await _one(api, ev, listens, devices)
                result.reward += reward
                result.events += 1
                result.random_reward += 1.0 / len(ev.pool)
                if result.first_model_version is None:
                    result.first_model_version = version
                result.last_model_version = version
                result.versions.append(version)
                if result.events % every == 0 or result.events == total:
                    result.cumulative.append((result.events, result.reward, result.random_reward))
                if progress is not None:
                    progress(result.events, result)
            finally:
                done.set_result(None)
                sem.release()

        loop = asyncio.get_running_loop()
        for i, ev in enumerate(events):
            if rate is not None:
                ahead = i / rate - (time.monotonic() - t0)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await sem.acquire()
            done: asyncio.Future[None] = loop.create_future()
            before = busy_users.get(ev.user)
            busy_users[ev.user] = done
            tasks.append(asyncio.create_task(run(i, ev, before, done)))
            if len(tasks) > 4 * concurrency:
                finished = [t for t in tasks if t.done()]
                for t in finished:
                    t.result()  # surface the first error
                tasks = [t for t in tasks if not t.done()]
        for t in tasks:
            await t
    result.seconds = time.monotonic() - t0
    return result


def replay(base_url: str, events: Iterable[ReplayEvent], *, total: int, rate: float | None = None,
           concurrency: int = 8, progress: Callable[[int, ReplayResult], None] | None = None,
           checkpoints: int = 200, listens: bool = True, devices: Devices | None = None) -> ReplayResult:
    """Replay ``events`` against the API at ``base_url`` (e.g. ``http://127.0.0.1:8080``).

    With ``listens`` (default), a logged listen that was not the recommended item is also sent as an
    organic positive (``POST /listen``): the information the popularity counter uses. With ``devices``
    (local mode) each user's device builds a report instead and nothing else is sent (no listens: a
    raw positive never leaves a device).
    """
    if rate is not None and rate <= 0:
        raise ValueError(f"`rate` must be positive events/s, got {rate}.")
    if concurrency < 1:
        raise ValueError(f"`concurrency` must be at least 1, got {concurrency}.")
    return asyncio.run(_replay(base_url.rstrip("/"), events, total, rate, concurrency, progress, checkpoints,
                               listens and devices is None, devices))


def summary(result: ReplayResult) -> dict[str, Any]:
    return {"events": result.events, "reward": result.reward, "random_reward": result.random_reward,
            "ratio": result.ratio, "seconds": result.seconds,
            "events_per_second": result.events / result.seconds if result.seconds else None,
            "first_model_version": result.first_model_version, "last_model_version": result.last_model_version,
            "model_versions_per_1000_events": result.versions_per_1000()}
