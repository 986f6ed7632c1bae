"""Local mode at user level against the real broker, redis-server, worker and web server.

The device keeps its cap and its budget; the server never trusts it to: a report past the epoch's cap,
ahead of the server's epoch, or whose version is past the lifetime budget's report limit is accepted by
``POST /report`` (the web process checks the schema and the list, not the ledger) and dead-lettered by
the worker with the reason, and never reaches the released sums. ``/budget`` states the user's guarantee in
the global mode's user-level fields.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from kafka import KafkaConsumer, TopicPartition

from models.local import LocalClient, LocalConfig, LocalReport, MemoryStorage, ReportRefused
from models.streaming import ReleasedStats

from stacks import LocalStack, wait_for, web_stack

CAP = 3
WORLD = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "40",
         "PRIVREC_ALGORITHM": "linucb", "PRIVREC_EPSILON": "2", "PRIVREC_TICK_SECONDS": "0.3",
         "PRIVREC_MODE": "local", "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_USER_CAP": str(CAP),
         "PRIVREC_USER_BUDGET": "4"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with web_stack(tmp_path_factory.mktemp("local-user") / "stack", settings=WORLD) as st:
        yield st


def _config(st: LocalStack) -> LocalConfig:
    from producers.devices import config_from_public

    status, public = st.get_json("/local/config")
    assert status == 200 and public["unit"] == "user" and public["cap"] == CAP
    return config_from_public(public)


def _count(st: LocalStack) -> int:
    client = redis.Redis.from_url(st.redis_url)
    try:
        raw = client.hgetall(f"{st.namespace}:released:{{{st.namespace}:rel}}:stats")
        return int(ReleasedStats.from_mapping(raw).count.sum()) if raw else 0
    finally:
        client.close()


def _dead_letters(address: str) -> list[dict[str, Any]]:
    consumer = KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=1500, auto_offset_reset="earliest")
    tps = [TopicPartition("dead-letters", p) for p in consumer.partitions_for_topic("dead-letters") or ()]
    consumer.assign(tps)
    out = [json.loads(m.value) for m in consumer]
    consumer.close()
    return out


def _send(st: LocalStack, rep: LocalReport) -> None:
    status, body = st.post_json("/report", rep.to_dict())
    assert status == 202, body


def _forged(st: LocalStack, user: str, version: int, epoch: int, d: int) -> LocalReport:
    """A report of a device that ignores its cap (valid schema, a fresh list of the user)."""
    status, rec = st.get_json(f"/recommend?user={user}&k=2")
    assert status == 200
    return LocalReport(user=user, version=version, algorithm="round", rec_id=rec["rec_id"], vector=np.zeros(d),
                       epoch=epoch)


def test_reports_beyond_the_cap_or_the_budget_are_dead_lettered_with_the_reason(stack: LocalStack) -> None:
    st = stack
    cfg = _config(st)
    limit = cfg.report_limit()
    assert limit is not None and CAP < limit < 4 * CAP  # budget 4 at epsilon 2: a few epochs' worth
    start = _count(st)
    dev = LocalClient("1", cfg, MemoryStorage(), seed=5)
    for _ in range(CAP):
        status, rec = st.get_json("/recommend?user=1&k=2")
        rep = dev.report(rec_id=rec["rec_id"], x=np.asarray(rec["items"][0]["x"]), reward=1.0)
        _send(st, rep)
        dev.acknowledge(rep.version)
    with pytest.raises(ReportRefused, match="cap"):  # the device keeps its cap ...
        dev.report(rec_id="any", x=np.zeros(cfg.d), reward=1.0)
    epoch = cfg.epoch_at(time.time())
    assert dev.epoch == epoch
    # ... and the server checks it: a fourth report in the epoch, an epoch ahead of the server's clock, a version
    # past the budget's report limit (in the next epoch, so the cap is not what refuses it)
    _send(st, _forged(st, "1", CAP + 1, epoch, cfg.d))
    _send(st, _forged(st, "2", 1, epoch + 5, cfg.d))
    _send(st, _forged(st, "3", limit + 1, epoch + 1, cfg.d))
    _send(st, _forged(st, "4", limit, epoch, cfg.d))  # the last version the budget allows: accepted

    def refused() -> list[str] | None:
        reasons = [d["reason"] for d in _dead_letters(st.broker.address)]
        return reasons if len(reasons) >= 3 else None

    reasons = wait_for(refused, 60, "three dead letters")
    assert any("beyond the cap" in r and "'1'" in r and f"cap {CAP}" in r for r in reasons), reasons
    assert any(f"epoch {epoch + 5} is ahead of the server's epoch" in r for r in reasons), reasons
    assert any("past the lifetime budget" in r and "'3'" in r for r in reasons), reasons
    wait_for(lambda: _count(st) >= start + CAP + 1 or None, 60, "the accepted reports released")
    time.sleep(1.0)  # a refused report, were it counted, would show in a later release
    assert _count(st) == start + CAP + 1
    # /budget: user 1's guarantee in the global mode's user-level fields, from the public ledger
    status, b = st.get_json("/budget?user=1", token=st.user_token("1"))
    assert status == 200
    u = b["user"]
    assert u["unit"] == "user" and u["cap"] == CAP and u["ticks_this_epoch"] == CAP and u["at_cap"]
    assert u["epoch"] == epoch and u["remaining_ticks"] == 0 and u["user_budget"] == 4.0 and not u["at_budget"]
    assert u["epsilon"] == pytest.approx(cfg.epsilon)  # a capped epoch: exactly (epsilon, delta)
    assert u["epsilon"] == pytest.approx(dev.spent()[0]) and u["budget_left"] == pytest.approx(4.0 - cfg.epsilon)
    led = b["ledger"]
    assert led["users"] == 2 and led["users_at_cap"] == 1 and led["capped_events"] == 2
    assert led["budget_events"] == 1 and led["users_at_budget"] == 1 and led["user_budget"] == 4.0
    assert b["privacy"]["unit"] == "user" and b["privacy"]["cap"] == CAP
    status, b4 = st.get_json("/budget?user=4", token=st.user_token("4"))
    assert b4["user"]["at_budget"] and b4["user"]["reports_allowed"] == limit
    assert b4["user"]["budget_left"] == pytest.approx(4.0 - cfg.spent(limit)[0]) and cfg.spent(limit)[0] <= 4.0
