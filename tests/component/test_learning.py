"""``/feedback``'s and ``/listen``'s ``learning``: what the public ledger says of a user's next interaction.

:func:`pipeline.serve.budget_view.learning` over a dict standing in for Redis (it reads two hash fields): the
fold's own rules (:meth:`pipeline.state.userlevel.Folder._plan`) — at the cap nothing more this epoch, past the
lifetime budget nothing more — judged in the epoch of the *next* release, and nothing at event level.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.config.keys import PublicKeys, partition_of
from pipeline.config.ledger import LedgerRecord
from pipeline.serve.budget_view import LEARNED, learning
from pipeline.serve.openapi import COMPONENTS

T = 7  # release ticks per epoch (tree_levels 3)
KEYS = PublicKeys("t")
PARTITIONS = 2
USER = "u1"
#: user level, cap 4, B(k) / B(cap) = k / 4, and a lifetime budget of mu 0.8 at mu_cap 1: one more tick is allowed
#: while sqrt(past + (k + 1) / 4) <= 0.8, i.e. up to k = 2 in a fresh history (sqrt(0.75) > 0.8 refuses the third)
STATEMENT = {"unit": "user", "private": True, "cap": 4, "ratios": [0.25, 0.5, 0.75, 1.0], "mu_at_cap": 1.0,
             "delta": 1e-5}
BUDGET = {"epsilon": 3.0, "delta": 1e-5, "mu": 0.8}


class FakeRedis:
    def __init__(self, released: int | None, record: LedgerRecord | None) -> None:
        self.data: dict[tuple[str, str], bytes] = {}
        if released is not None:
            self.data[(KEYS.released, "version")] = str(released).encode()
        if record is not None:
            self.data[(KEYS.ledger_participation(partition_of(USER, PARTITIONS)), USER)] = record.dumps().encode()

    async def hget(self, key: str, field: str) -> bytes | None:
        return self.data.get((key, field))


def _learning(released: int | None, record: LedgerRecord | None, statement: dict[str, Any]) -> dict[str, Any]:
    """The ``learning`` answer, checked against the OpenAPI document's ``Learning`` schema."""
    from openapi_schema_validator import OAS30Validator

    out = asyncio.run(learning(FakeRedis(released, record), KEYS, PARTITIONS, USER, statement, tree_ticks=T,
                               tick_seconds=0.5))
    OAS30Validator(COMPONENTS["schemas"]["Learning"]).validate(out)
    return out


@pytest.mark.parametrize(("released", "record", "learned", "reason"), [
    (None, None, True, None),                               # nothing released yet, no record
    (3, LedgerRecord(epoch=0, k=3, last_version=3), True, None),  # one tick left
    (3, LedgerRecord(epoch=0, k=4, last_version=3), False, "cap"),
    (9, LedgerRecord(epoch=0, k=4, last_version=6), True, None),  # at the cap in a closed epoch: a new one began
    # release 7 is the last of epoch 0: the next, 8, opens epoch 1, which folds this interaction
    (7, LedgerRecord(epoch=0, k=4, last_version=7), True, None),
    (6, LedgerRecord(epoch=0, k=4, last_version=6), False, "cap"),
], ids=["fresh", "under_cap", "at_cap", "next_epoch", "epoch_boundary", "last_tick_of_epoch"])
def test_the_cap_in_the_epoch_of_the_next_release(released: int | None, record: LedgerRecord | None, learned: bool,
                                                  reason: str | None) -> None:
    out = _learning(released, record, STATEMENT)
    assert (out["learned"], out["reason"]) == (learned, reason)
    r = released or 0
    assert out["epoch"] == r // T and out["epoch_releases_left"] == (r // T + 1) * T - r
    assert out["epoch_seconds_left_at_least"] == out["epoch_releases_left"] * 0.5 and out["cap"] == 4


def test_the_lifetime_budget_stops_learning_before_the_cap() -> None:
    statement = {**STATEMENT, "user_budget": BUDGET}
    assert _learning(3, LedgerRecord(epoch=0, k=1, last_version=2), statement)["learned"] is True
    out = _learning(3, LedgerRecord(epoch=0, k=2, last_version=3), statement)
    assert (out["learned"], out["reason"], out["ticks_this_epoch"]) == (False, "budget", 2)
    # at the cap, the cap is the reason (the fold checks it first)
    assert _learning(3, LedgerRecord(epoch=0, k=4, last_version=3), statement)["reason"] == "cap"


def test_event_level_is_always_learned() -> None:
    out = _learning(3, LedgerRecord(epoch=0, k=99, last_version=3), {"unit": "event", "private": True})
    assert out == LEARNED and out is not LEARNED
