"""The logged event stream: one event per positive (user, artist) pair, each with a pool.

Protocol (spec collaborative-dp-bandits §8 "LastFM and Delicious", G17):

- one event per distinct positive (user, artist) pair whose artist has
  features, in an order shuffled with a fixed seed;
- the pool is the positive plus ``pool_size - 1`` distinct artists drawn
  uniformly (fixed seed) from the artists with features that the user neither
  tagged nor listened to, so no negative is a positive of that user under
  either definition;
- the positive sits at a uniformly random position in the pool (BanditLib puts
  it first, which rewards any policy that breaks ties by taking the first arm);
- ``ts`` is the first day the user tagged the artist, as local midnight in
  Madrid (where the dataset was built; it reproduces BanditLib's timestamps),
  in ms since the epoch, or NaN if the pair was never tagged.

Examples
--------
>>> madrid_midnight_ms(2011, 3, 1)  # CET, UTC+1
1298934000000
>>> madrid_midnight_ms(2009, 4, 1)  # CEST, UTC+2
1238536800000
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

__all__ = ["Positives", "EventArrays", "madrid_midnight_ms", "positive_pairs", "build_events"]

Positives = Literal["tagged", "listened"]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class EventArrays:
    """The event stream in columnar form, already in replay order.

    Attributes
    ----------
    users
        ``(n,)`` original user id of each event.
    arms
        ``(n,)`` artist id of the logged positive.
    pools
        ``(n, pool_size)`` artist ids shown; each row holds ``arms[i]`` once.
    ts
        ``(n,)`` first-tag time in ms since the epoch (NaN if untagged).
    n_dropped_no_features
        Positive pairs left out because their artist has no features.
    """

    users: IntArray
    arms: IntArray
    pools: IntArray
    ts: NDArray[np.float64]
    n_dropped_no_features: int


def _last_sunday(year: int, month: int) -> dt.date:
    last = dt.date(year, month + 1, 1) - dt.timedelta(days=1)
    return last - dt.timedelta(days=(last.weekday() + 1) % 7)


@functools.lru_cache(maxsize=65536)
def madrid_midnight_ms(year: int, month: int, day: int) -> int:
    """Milliseconds since the epoch of 00:00 local time in Madrid on that day.

    Uses the EU rule (CET = UTC+1; CEST = UTC+2 from the last Sunday of March
    to the last Sunday of October), in force since 1996. Midnight is never
    inside a transition hour, so the day decides the offset.
    """
    day_ = dt.date(year, month, day)
    summer = _last_sunday(year, 3) < day_ <= _last_sunday(year, 10)
    utc = dt.datetime(year, month, day, tzinfo=dt.timezone.utc)
    return int(utc.timestamp()) * 1000 - (2 if summer else 1) * 3_600_000


def _pair_keys(users: IntArray, artists: IntArray) -> IntArray:
    return (users.astype(np.int64) << 32) | artists.astype(np.int64)


def positive_pairs(
    listened: IntArray, tagged: IntArray, positives: Positives
) -> tuple[IntArray, IntArray, NDArray[np.float64]]:
    """Distinct positive (user, artist) pairs, sorted, with their first-tag time.

    Parameters
    ----------
    listened
        ``user_artists.dat`` rows (user, artist, play count).
    tagged
        ``user_taggedartists.dat`` rows (user, artist, tag, day, month, year).
    positives
        ``"tagged"``: the user tagged the artist; ``"listened"``: the user
        played the artist at least once.

    Returns
    -------
    users, artists : ndarray of int64
        The pairs, sorted by user then artist.
    ts : ndarray of float64
        First-tag time of each pair (ms, Madrid midnight), NaN if never tagged.
    """
    if positives == "tagged":
        keys = np.unique(_pair_keys(tagged[:, 0], tagged[:, 1]))
    elif positives == "listened":
        rows = listened[listened[:, 2] > 0]
        keys = np.unique(_pair_keys(rows[:, 0], rows[:, 1]))
    else:
        raise ValueError(f"`positives` must be 'tagged' or 'listened', got {positives!r}.")
    # Earliest tag date per tagged pair.
    tag_keys = _pair_keys(tagged[:, 0], tagged[:, 1])
    date_code = tagged[:, 5] * 10_000 + tagged[:, 4] * 100 + tagged[:, 3]
    order = np.lexsort((date_code, tag_keys))
    first = np.ones(len(order), dtype=bool)
    first[1:] = tag_keys[order][1:] != tag_keys[order][:-1]
    uniq_keys, first_code = tag_keys[order][first], date_code[order][first]
    code_ms = {
        int(c): float(madrid_midnight_ms(int(c) // 10_000, int(c) // 100 % 100, int(c) % 100))
        for c in np.unique(first_code)
    }
    ts = np.full(len(keys), np.nan)
    pos = np.searchsorted(uniq_keys, keys)
    pos_ok = pos < len(uniq_keys)
    hit = np.zeros(len(keys), dtype=bool)
    hit[pos_ok] = uniq_keys[pos[pos_ok]] == keys[pos_ok]
    ts[hit] = [code_ms[int(c)] for c in first_code[pos[hit]]]
    return keys >> 32, keys & 0xFFFFFFFF, ts


def build_events(
    listened: IntArray,
    tagged: IntArray,
    artist_ids: IntArray,
    positives: Positives,
    pool_size: int,
    seed: int,
) -> EventArrays:
    """Build the shuffled event stream with one ``pool_size``-arm pool per event.

    Parameters
    ----------
    listened, tagged
        The raw rows (see :func:`positive_pairs`).
    artist_ids
        Sorted ids of the artists that have features: the only artists that
        may appear in a pool.
    positives
        ``"tagged"`` or ``"listened"`` (see :func:`positive_pairs`).
    pool_size
        Arms per pool, the positive included (the papers use 25).
    seed
        Seed of the negatives, of the positive's slot and of the event order.

    Returns
    -------
    EventArrays
        The stream, in replay order.

    Raises
    ------
    ValueError
        If ``pool_size < 2`` or some user has fewer than ``pool_size - 1``
        artists with features that are not theirs.

    Examples
    --------
    >>> listened = np.array([[1, 10, 5], [2, 11, 3]])
    >>> tagged = np.array([[1, 12, 7, 1, 4, 2009]])
    >>> ev = build_events(listened, tagged, np.arange(10, 16), "listened", pool_size=3, seed=0)
    >>> ev.users.tolist(), ev.arms.tolist(), ev.pools.shape
    ([1, 2], [10, 11], (2, 3))
    >>> pool_of_user_1 = ev.pools[ev.users == 1][0]
    >>> sorted(set(pool_of_user_1.tolist()) & {10, 12})  # 12 (tagged by user 1) is never a negative
    [10]
    """
    if pool_size < 2:
        raise ValueError(f"`pool_size` must be at least 2, got {pool_size}.")
    artist_ids = np.asarray(artist_ids, dtype=np.int64)
    n_art = len(artist_ids)
    users, arms, ts = positive_pairs(listened, tagged, positives)
    has_feat = np.isin(arms, artist_ids)
    n_dropped = int((~has_feat).sum())
    users, arms, ts = users[has_feat], arms[has_feat], ts[has_feat]
    n = len(users)
    m = pool_size - 1

    # Excluded[user, artist]: the user tagged or listened to the artist (artists with features only).
    ex_users = np.concatenate([listened[:, 0], tagged[:, 0]])
    ex_arts = np.concatenate([listened[:, 1], tagged[:, 1]])
    uniq_users = np.unique(np.concatenate([ex_users, users]))
    feat = np.isin(ex_arts, artist_ids)
    excluded = np.zeros((len(uniq_users), n_art), dtype=bool)
    excluded[np.searchsorted(uniq_users, ex_users[feat]), np.searchsorted(artist_ids, ex_arts[feat])] = True
    n_free = n_art - excluded.sum(axis=1)
    short = uniq_users[n_free < m]
    if short.size:
        raise ValueError(
            f"`pool_size` {pool_size} needs {m} negatives per user, but user(s) "
            f"{short[:10].tolist()} have fewer than {m} artists with features that are not theirs "
            f"({n_art} artists have features)."
        )

    rng = np.random.default_rng(seed)
    row_user = np.searchsorted(uniq_users, users)
    neg = rng.integers(0, n_art, size=(n, m))
    rows = np.arange(n)
    while rows.size:
        sub = neg[rows]
        bad = excluded[row_user[rows, None], sub]
        order = np.argsort(sub, axis=1, kind="stable")
        srt = np.take_along_axis(sub, order, axis=1)
        dup_sorted = np.zeros_like(bad)
        dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]
        dup = np.zeros_like(bad)
        np.put_along_axis(dup, order, dup_sorted, axis=1)
        bad |= dup
        rows = rows[bad.any(axis=1)]
        bad = bad[bad.any(axis=1)]
        redraw = neg[rows]
        redraw[bad] = rng.integers(0, n_art, size=int(bad.sum()))
        neg[rows] = redraw
    slot = rng.integers(0, pool_size, size=n)
    pools = np.empty((n, pool_size), dtype=np.int64)
    cols = np.arange(pool_size)
    is_pos = cols[None, :] == slot[:, None]
    pools[is_pos] = arms
    pools[~is_pos] = artist_ids[neg].ravel()
    perm = rng.permutation(n)
    return EventArrays(
        users=users[perm],
        arms=arms[perm],
        pools=pools[perm],
        ts=ts[perm],
        n_dropped_no_features=n_dropped,
    )
