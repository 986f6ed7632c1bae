"""``privrec up --mode local --local-codewords 64`` on LastFM with the separate shuffler (the real broker, redis-server,
shuffler, worker and web server): a LastFM replay's listens, sealed message by message, change the released ``b`` and
the served scores; the boundary holds with the messages — no shuffled batch names a user, a version or a request, and
no opened message appears where the shuffler keeps, logs or sends anything."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from models.streaming import ReleasedStats
from pipeline.config.settings import Settings
from privrec import ops
from privrec.ops.redis_users import role_redis_url

from pipeline_support import wait_for, lastfm_data_or_skip
from test_least_privilege import _get
from test_local_mode import _all_messages, _redis_values

N = 100  # distinct users per population-wide batch (the smallest the blanket reaches (2, 1e-5) with at cap 2: ~80)
NS = "cwlive"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = lastfm_data_or_skip()
    state = tmp_path_factory.mktemp("codewords") / "stack"
    settings = Settings(mode="local", namespace=NS, catalog="lastfm", data_dir=str(data), local_algorithm="round",
                        shuffle_batch=N, user_cap=2, local_codewords=64, epsilon=2.0, noise_ridge=0.0,
                        algorithm="linucb", tick_seconds=0.3, partitions=2)
    ops.up(settings, state, timeout=120, loglevel="INFO")
    try:
        yield {"state": state, "info": ops.read_stack(state)}
    finally:
        ops.down(state)


def _scores(base: str, user: str, pool: list[str]) -> dict[str, float]:
    status, rec = _get(f"{base}/recommend?user={user}&k={len(pool)}&candidates={','.join(pool)}")
    assert status == 200, rec
    return {it["item"]: float(it["score"]) for it in rec["items"]}


def test_a_replay_with_codewords_moves_the_released_b_and_the_served_scores(stack: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    from privrec.cli import main

    info, state = stack["info"], stack["state"]
    base = info["http"]
    admin = redis.Redis.from_url(role_redis_url(info, "admin"))
    status, public = _get(f"{base}/local/config")
    assert status == 200 and public["noise"]["kind"] == "blanket" and len(public["codebook"]) == 64
    assert public["esa"]["shuffler"].startswith("http://127.0.0.1:")
    status, users = _get(f"{base}/users?limit=2")
    user = str(users["users"][0])
    pool = [it["item"] for it in _get(f"{base}/recommend?user={user}&k=10")[1]["items"]]
    before = _scores(base, user, pool)

    assert main(["replay", "lastfm", "--mode", "local", "--events", "600", "--http", base, "--out",
                 str(tmp_path / "out"), "--no-baselines", "--no-progress"]) == 0

    def released() -> ReleasedStats | None:
        raw = admin.hgetall(f"{NS}:released:{{{NS}:rel}}:stats")
        return ReleasedStats.from_mapping(raw) if raw else None

    wait_for(lambda: (r := released()) is not None and int(r.count.sum()) >= N, 60, "a batch of listens released")
    rel = released()
    assert rel is not None and int(rel.count.sum()) % N == 0
    b = np.asarray(rel.b_tilde).reshape(-1, 25)
    assert np.abs(b).max() > 1.0                                   # the listens' codewords are in b ...
    np.testing.assert_array_equal(b, np.broadcast_to(b[0], b.shape))  # ... of every unit (the population's)
    wait_for(lambda: _scores(base, user, pool) != before, 30, "the served scores to follow the release")
    time.sleep(1.0)  # let the logs flush

    messages = _all_messages(info["kafka"])
    values = _redis_values(role_redis_url(info, "admin"))
    shuffled = [json.loads(v) for t, v in messages if t == "ldp-shuffled"]
    assert shuffled and all(doc.get("msgs") for doc in shuffled)
    for doc in shuffled:  # the analyzer's input: no identity, no request, no report boundary of the messages
        assert not {"user", "version", "rec_id", "shown"} & set(doc), "a batch carries an identity"
    # the shuffler never holds an opened message or content: their plaintext schemas appear nowhere it keeps or logs
    shuffler = ([v for k, v in values if k.startswith(f"{NS}-shuffler:")]
                + (state / "shuffler.log").read_bytes().splitlines() + [v for t, v in messages if t == "ldp-shuffled"])
    assert any(k.startswith(f"{NS}-shuffler:") for k, _ in values)
    for blob in shuffler:
        assert b"privrec.ItemMessage/1" not in blob and b"privrec.ReportContent/1" not in blob
    # the analyzer dead-lettered nothing of the devices' messages
    assert not [v for t, v in messages if t == "dead-letters" and b"sealed message" in v]
