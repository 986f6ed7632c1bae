"""The replay's pace (``--rate auto`` follows the release tick; the model versions each 1,000 events saw) and its
requests, which never depend on a reward."""

from __future__ import annotations

import pytest

from privrec.commands.replay import EVENTS_PER_TICK, _rate
from producers.replay import ReplayEvent, ReplayResult, replay_schedule


def test_auto_rate_is_a_fixed_number_of_events_per_release_tick() -> None:
    assert _rate("auto", {"model": {"tick_seconds": 0.5}}) == EVENTS_PER_TICK / 0.5
    assert _rate("auto", {}) == EVENTS_PER_TICK  # no model yet: the default 1 s tick
    assert _rate("max", {}) is None
    assert _rate("250", {}) == 250.0
    for bad in ("0", "-3", "fast", "inf"):
        with pytest.raises(ValueError, match="--rate"):
            _rate(bad, {})


def test_versions_per_1000_events_counts_distinct_versions_per_window() -> None:
    r = ReplayResult(versions=[1] * 600 + [2] * 600 + [3] * 300 + [5] * 100)
    assert r.versions_per_1000() == [2, 3]


@pytest.mark.parametrize("listens", [True, False], ids=["listens", "no_listens"])
def test_the_requests_do_not_depend_on_the_rewards(listens: bool) -> None:
    """Arrivals are public: the endpoints the replay calls, per user and in order, are the same whether every
    recommendation hit (rewards 1) or missed (rewards 0), so the ledger's arrival counts encode no reward."""
    events = [ReplayEvent(user=str(u % 3), arm=str(u), pool=(str(u), "x", "y")) for u in range(12)]
    misses = replay_schedule(events, [0.0] * len(events), listens=listens)
    hits = replay_schedule(events, [1.0] * len(events), listens=listens)
    mixed = replay_schedule(events, [float(i % 2) for i in range(len(events))], listens=listens)
    assert misses == hits == mixed
    per_event = 3 if listens else 2
    assert len(misses) == per_event * len(events)
    for user in ("0", "1", "2"):
        calls = [path for u, path in misses if u == user]
        assert calls == ["/recommend", "/feedback", "/listen"][:per_event] * 4
