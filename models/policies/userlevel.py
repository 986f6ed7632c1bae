"""The offline twin of ``privacy_unit = user``: per-user per-tick clipping, a contribution cap, calibrated noise.

The pipeline's release tick folds each user's events of the tick into the statistics: their ``b``
summed and clipped to norm ``b_clip``, their item rewards summed and clipped to norm ``item_clip``, at most ``cap`` ticks
per user and epoch (``pipeline.state.userlevel``). :class:`UserLevelUCB` does the same around a
:class:`~models.policies.PopularityUCB` (a bandit with or without the item term), releasing both
statistics once per tick of ``tick`` interactions, with noise calibrated by the mechanisms'
multi-participation factor (:func:`models.mechanisms.participation.participation_factor`): a user
who contributes to ``cap`` ticks gets the configured ``(epsilon, delta)`` for the whole epoch.

Use: ``begin_event(user)`` before each interaction names its user (the replay protocol of
``privrec experiment lastfm`` calls it); ``select`` / ``update`` / ``observe`` as for
:class:`~models.policies.PopularityUCB`.

Examples
--------
>>> import numpy as np
>>> pol = make_user_level_policy("LinUCB", d=2, W=np.eye(1), n_items=2, epsilon=float("inf"), cap=1, tick=2,
...                              weight=0.0)
>>> for r in (1.0, 1.0):  # one user, two events in one tick: b = 2 x, clipped to norm b_clip = 1
...     pol.begin_event(7)
...     pol.update(0, np.array([1.0, 0.0]), r, 0)
>>> pol.inner.base.b_released.tolist()
[1.0, 0.0]
>>> pol.begin_event(7); pol.update(0, np.array([1.0, 0.0]), 1.0, 0)  # over the cap: not learned
>>> pol.begin_event(7); pol.update(0, np.array([1.0, 0.0]), 1.0, 0)
>>> pol.inner.base.b_released.tolist(), pol.dropped
([1.0, 0.0], 2)
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
from numpy.typing import NDArray

from models.mechanisms.participation import B_CLIP, ITEM_CLIP, clip_scale, participation_factor, replace_sensitivity

from .popularity import LISTEN_WEIGHT, PopularityUCB, make_popularity_policy

__all__ = ["UserLevelUCB", "make_user_level_policy"]

FloatArray = NDArray[np.float64]
_NEVER = 1 << 62  # the inner policy's own ticks never come: this wrapper releases


class UserLevelUCB:
    """Per-user per-tick clipping and a cap around a :class:`PopularityUCB` (see the module docstring)."""

    def __init__(self, inner: PopularityUCB, *, tick: int, cap: int, capacity: int, listen_weight: float,
                 b_clip: float = B_CLIP, item_clip: float = ITEM_CLIP) -> None:
        if int(tick) < 1 or int(cap) < 1 or int(capacity) < 1:
            raise ValueError(f"`tick`, `cap` and `capacity` must be positive, got {tick}, {cap}, {capacity}.")
        if not (0 < b_clip <= 1 and 0 < item_clip <= 1):
            raise ValueError(f"`b_clip` and `item_clip` must be in (0, 1], got {b_clip} and {item_clip}.")
        self.inner, self.tick, self.cap, self.capacity = inner, int(tick), int(cap), int(capacity)
        self.b_clip, self.item_clip = float(b_clip), float(item_clip)
        self.listen_scale = math.sqrt(listen_weight)
        self.user: int = 0
        self.buffer: list[tuple[int, int, FloatArray, float, int, bool]] = []
        self.participations: dict[tuple[int, int], int] = defaultdict(int)  # (user, epoch) -> ticks
        self.ticks = 0
        self.seen = 0
        self.dropped = 0

    def begin_event(self, user: int) -> None:
        self.user = int(user)

    def select(self, unit: int, contexts: FloatArray, items: Any = None) -> int:
        return self.inner.select(unit, contexts, np.zeros(len(contexts), dtype=np.int64) if items is None else items)

    def update(self, unit: int, context: FloatArray, reward: float, item: int = -1) -> None:
        self.buffer.append((self.user, int(unit), np.asarray(context, dtype=np.float64), float(reward), int(item), False))
        self.seen += 1
        if self.seen % self.tick == 0:
            self.fold()

    def observe(self, unit: int, item: int, reward: float = 1.0) -> None:
        features = self.inner.features
        x = np.zeros(0) if features is None else features[int(item)]
        self.buffer.append((self.user, int(unit), x, float(reward), int(item), True))

    def fold(self) -> None:
        """One release tick: every user's events of the tick, clipped and capped, then both releases."""
        epoch = self.ticks // self.capacity
        by_user: dict[int, list[tuple[int, int, FloatArray, float, int, bool]]] = defaultdict(list)
        for ev in self.buffer:
            by_user[ev[0]].append(ev)
        self.buffer = []
        inner, base = self.inner, self.inner.base
        for user, events in by_user.items():
            if self.participations[(user, epoch)] >= self.cap:
                self.dropped += len(events)
                continue
            self.participations[(user, epoch)] += 1
            b = np.zeros_like(events[0][2]) if len(events[0][2]) else np.zeros(1)
            item_sums: dict[int, float] = defaultdict(float)
            for _, _, x, r, item, listen in events:
                if listen and base is not None and len(x):
                    w = self.listen_scale
                    b = b + (w * r) * (w * x)
                elif not listen and len(x):
                    b = b + r * x
                if item >= 0:
                    item_sums[item] += r
            scale = clip_scale(float(np.linalg.norm(b)), self.b_clip)
            iscale = clip_scale(math.sqrt(sum(v * v for v in item_sums.values())), self.item_clip)
            for _, unit, x, r, item, listen in events:
                if base is not None and len(x):
                    if listen:  # the user's own choice: its context stays out of the public Gram matrix
                        if self.listen_scale > 0:
                            base.update(unit, self.listen_scale * x, scale * self.listen_scale * r, gram=False)
                    else:
                        base.update(unit, x, scale * r)
            for item, total in item_sums.items():
                inner.sums[item] += iscale * total
        inner.t += self.tick
        if base is not None:
            base.release()
        inner.release_items()
        self.ticks += 1


def make_user_level_policy(base: str | None, *, d: int, W: FloatArray, n_items: int, epsilon: float = math.inf,
                           delta: float = 1e-5, cap: int = 8, tick: int = 100, capacity: int = (1 << 14) - 1,
                           weight: float = 1.0, share: float = 0.5, mechanism: str = "user-blt-exact",
                           item_mechanism: str = "blt-exact", features: FloatArray | None = None,
                           listen_weight: float | None = None, seed: int = 0, b_clip: float = B_CLIP,
                           item_clip: float = ITEM_CLIP, **base_kw: Any) -> UserLevelUCB:
    """A :class:`UserLevelUCB` whose releases give a user capped at ``cap`` ticks ``(epsilon, delta)`` per epoch.

    Neighbours replace one user's rewards and choices: the per-tick sensitivities are ``2 b_clip`` (``b``)
    and ``sqrt(2) item_clip`` (the nonnegative item sums), :func:`models.mechanisms.participation.replace_sensitivity`.
    """
    private = not math.isinf(epsilon)
    if listen_weight is None:
        listen_weight = 0.0 if features is None or base is None else LISTEN_WEIGHT["private" if private else "none"]

    def build(scale_b: float, scale_s: float) -> PopularityUCB:
        pol = make_popularity_policy(base, d=d, W=W, n_items=n_items, epsilon=epsilon, delta=delta, share=share,
                                     mechanism=mechanism, item_mechanism=item_mechanism, weight=weight,
                                     item_tick=_NEVER, horizon=capacity * _NEVER, item_horizon=capacity,
                                     features=features, listen_weight=0.0, seed=seed, item_sensitivity_scale=scale_s,
                                     **({"tick": _NEVER, "sensitivity_scale": scale_b} if base else {}), **base_kw)
        pol.features = None if features is None else np.asarray(features, dtype=np.float64)
        return pol

    inner = build(1.0, 1.0)
    if private:
        scale_b = 1.0 if inner.base is None or inner.base.mechanism is None else \
            participation_factor(inner.base.mechanism, cap)
        scale_s = 1.0 if inner.item_mechanism is None else participation_factor(inner.item_mechanism, cap)
        inner = build(scale_b * replace_sensitivity(b_clip, signed=True),
                      scale_s * replace_sensitivity(item_clip, signed=False))
    return UserLevelUCB(inner, tick=tick, cap=cap, capacity=capacity, listen_weight=listen_weight, b_clip=b_clip,
                        item_clip=item_clip)
