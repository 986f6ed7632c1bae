"""The release timer's period (pipeline.release.timers.register): the mode chooses it; local mode polls for folded
batches within pipeline.modes.local.localmode.RELEASE_POLL_S. In process, no services: a stand-in records what the
timer is registered with (no app runs)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.config.settings import Settings
from pipeline.modes.local.localmode import RELEASE_POLL_S
from pipeline.release import timers


class _App:
    """Records the periods of the timers registered on it."""

    def __init__(self) -> None:
        self.periods: list[float] = []

    def timer(self, period: float, **_: Any) -> Any:
        self.periods.append(period)
        return lambda fn: fn

    def task(self, fn: Any) -> Any:
        return fn


def test_the_period_is_tick_seconds_unless_the_mode_says_otherwise() -> None:
    settings = Settings(tick_seconds=2.0)
    app = _App()
    timers.register(app, settings, catalog=None)  # type: ignore[arg-type]
    local = min(settings.tick_seconds, RELEASE_POLL_S)  # what local mode's worker registers
    timers.register(app, settings, catalog=None, interval=local)  # type: ignore[arg-type]
    assert app.periods == [2.0, RELEASE_POLL_S]
    assert 0 < RELEASE_POLL_S < 1.0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_a_period_that_is_not_a_positive_number_of_seconds_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        timers.register(_App(), Settings(), catalog=None, interval=bad)  # type: ignore[arg-type]
