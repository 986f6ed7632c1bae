"""The replay's pace: ``--rate auto`` follows the release tick; the model versions each 1,000 events saw."""

from __future__ import annotations

import pytest

from privrec.commands.replay import EVENTS_PER_TICK, _rate
from producers.replay import ReplayResult


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
