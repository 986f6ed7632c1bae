"""Replay pools of any ``events.csv``: LastFM's protocol on anyone's log.

For each logged positive (``reward > 0``), in time order (ties: file order), the pool is the logged item
plus ``pool - 1`` other catalog items drawn uniformly without replacement by a public seed, the logged one
at a uniformly drawn slot: the draw depends only on ``(seed, event index)``, so every run and every policy
sees the same pools. Reward 1 iff the policy's top item is the logged one; random play earns
``1 / pool`` per event in expectation.

Examples
--------
>>> from producers.catalog.format import EventRows
>>> ev = EventRows(["u", "v", "u"], ["a", "b", "zz"], np.array([2.0, 1.0, 3.0]), np.ones(3), [2, 3, 4])
>>> plan = replay_plan(ev, ["a", "b", "c", "d"], pool=3, seed=0)
>>> [(p.user, p.item) for p in plan.events], plan.skipped_unknown_item
([('v', 'b'), ('u', 'a')], 1)
>>> all(len(set(p.pool)) == 3 and p.item in p.pool for p in plan.events)
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .format import EventRows

__all__ = ["PlannedEvent", "ReplayPlan", "replay_plan"]


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    """One logged positive and its pool (item ids); ``slot`` is the logged item's position in ``pool``."""

    user: str
    item: str
    pool: tuple[str, ...]
    slot: int
    line: int


@dataclass(frozen=True)
class ReplayPlan:
    """The events to replay, in order, and what was left out (and why)."""

    events: list[PlannedEvent]
    skipped_unknown_item: int
    skipped_not_positive: int
    first_unknown: tuple[int, str] | None  # (line, item) of the first event naming an item outside the catalog


def replay_plan(ev: EventRows, item_ids: Sequence[str], *, pool: int = 25, seed: int = 0) -> ReplayPlan:
    """Order the positives of ``ev`` by time and draw each one's pool over ``item_ids`` (see the module docstring).

    Raises
    ------
    ValueError
        If ``pool`` is below 2 or above the number of items.
    """
    n = len(item_ids)
    if not 2 <= pool <= n:
        raise ValueError(f"`pool` must be in [2, {n}] (the catalog's items), got {pool}.")
    row = {a: i for i, a in enumerate(item_ids)}
    order = np.argsort(ev.times, kind="stable")
    out: list[PlannedEvent] = []
    unknown = negative = 0
    first: tuple[int, str] | None = None
    for i in order.tolist():
        if ev.rewards[i] <= 0:
            negative += 1
            continue
        j = row.get(ev.items[i])
        if j is None:
            unknown += 1
            if first is None:
                first = (ev.lines[i], ev.items[i])
            continue
        rng = np.random.default_rng([seed, len(out)])
        others: list[int] = []
        seen = {j}
        while len(others) < pool - 1:
            for c in rng.integers(0, n, 2 * pool).tolist():
                if c not in seen:
                    seen.add(c)
                    others.append(c)
                    if len(others) == pool - 1:
                        break
        slot = int(rng.integers(0, pool))
        others.insert(slot, j)
        out.append(PlannedEvent(ev.users[i], ev.items[i], tuple(item_ids[c] for c in others), slot, ev.lines[i]))
    return ReplayPlan(out, unknown, negative, first)
