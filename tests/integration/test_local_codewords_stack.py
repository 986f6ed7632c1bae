"""``privrec up --mode local --local-codewords 64`` on LastFM with the separate shuffler (the real broker, redis-server,
shuffler, worker and web server): a LastFM replay's listens, sealed message by message, change the released ``b`` and
the served scores; the boundary holds with the messages — the separate shuffler's full boundary scan
(:func:`test_local_shuffler.assert_parties_apart`) over every topic, Redis key/value and log: no shuffled batch names a
user, a version or a request, the analyzer holds no opened message and no codeword next to a user id, the shuffler no
opened message or content, nobody a raw reward or an exact per-user statistic."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from models.local import LocalClient
from models.local.esa import seal_report
from models.local.seal import b64decode
from models.streaming import ReleasedStats
from producers.devices import config_from_public
from pipeline.config.settings import Settings
from privrec import ops
from privrec.ops.redis_users import role_redis_url
from privrec.ops.stackfile import read_tokens

from stacks import http, lastfm_data_or_skip, up_stack, wait_for
from test_local_mode import _all_messages
from test_local_shuffler import assert_parties_apart

N = 100  # distinct users per population-wide batch (the smallest the blanket reaches (2, 1e-5) with at cap 2: 66)
NS = "cwlive"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = lastfm_data_or_skip()
    state = tmp_path_factory.mktemp("codewords") / "stack"
    settings = Settings(mode="local", namespace=NS, catalog="lastfm", data_dir=str(data), local_algorithm="round",
                        shuffle_batch=N, user_cap=2, local_codewords=64, epsilon=2.0, noise_ridge=0.0,
                        algorithm="linucb", tick_seconds=0.3, partitions=2)
    with up_stack(settings, state, timeout=120, loglevel="INFO"):
        yield {"state": state, "info": ops.read_stack(state)}


def _scores(base: str, user: str, pool: list[str]) -> dict[str, float]:
    status, rec = http("GET", f"{base}/recommend?user={user}&k={len(pool)}&candidates={','.join(pool)}")
    assert status == 200, rec
    return {it["item"]: float(it["score"]) for it in rec["items"]}


def test_a_replay_with_codewords_moves_the_released_b_and_the_served_scores(stack: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    from privrec.cli import main

    info, state = stack["info"], stack["state"]
    base = info["http"]
    admin = redis.Redis.from_url(role_redis_url(info, "admin"))
    status, public = http("GET", f"{base}/local/config")
    assert status == 200 and public["noise"]["kind"] == "blanket" and len(public["codebook"]) == 64
    assert public["esa"]["shuffler"].startswith("http://127.0.0.1:")
    status, users = http("GET", f"{base}/users?limit=2")
    user = str(users["users"][0])
    pool = [it["item"] for it in http("GET", f"{base}/recommend?user={user}&k=10")[1]["items"]]
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

    # the analyzer dead-lettered nothing of the devices' messages (the boundary scan is the next test's)
    messages = _all_messages(info["kafka"])
    shuffled = [json.loads(v) for t, v in messages if t == "ldp-shuffled"]
    assert shuffled and all(doc.get("msgs") for doc in shuffled)
    assert not [v for t, v in messages if t == "dead-letters" and b"sealed message" in v]

    # what users are told is the blanket's guarantee: each batch (one batch alone, exact), and /budget
    from models.local.shuffle import Shuffler

    settings = Settings.from_mapping(info["settings"], environ={})
    per_batch = Shuffler(settings.local_config(25)).guarantee()
    assert all((doc["epsilon"], doc["delta"], doc["bound"], doc["analysis"]) == (*per_batch, "blanket")
               for doc in shuffled) and per_batch[0] < 2.0
    # /budget?user= counts the envelopes the shuffler accepted from each user (the batches name none)
    accepted = {k.decode(): int(v) for k, v in admin.hgetall(f"{NS}-shuffler:accepted:{{{NS}-shuffler}}").items()}
    assert accepted
    operator = read_tokens(state).operator  # privrec up's (<state>/tokens.json)
    for u in sorted(accepted)[:5]:
        status, body = http("GET", f"{base}/budget?user={u}", token=operator)
        assert status == 200 and body["user"]["interactions"] == body["user"]["reports"] == accepted[u]
        assert body["privacy"]["parties"]["everyone_else"]["analysis"] == "blanket"
        assert body["privacy"]["against_operator"]["epsilon_per_report"] is None


def test_the_boundary_scan_holds_with_codewords(stack: dict[str, Any]) -> None:
    """The separate shuffler's boundary scan (:func:`test_local_shuffler.assert_parties_apart`) with codewords:
    N users who had not reported send one listen each (fractional rewards: distinctive digits), their batch closes,
    and no party holds what it must not — the analyzer no opened message and no codeword next to a user id, the
    shuffler no opened message or content, nobody a raw reward or an exact per-user statistic."""
    info, state = stack["info"], stack["state"]
    base = info["http"]
    admin = redis.Redis.from_url(role_redis_url(info, "admin"))
    status, public = http("GET", f"{base}/local/config")
    assert status == 200
    config = config_from_public(public)
    codebook = np.asarray(public["codebook"], dtype=np.float64)
    pk, submit = b64decode(public["esa"]["public_key"]), public["esa"]["shuffler"]
    reported = {u.decode() for u in admin.hkeys(f"{NS}-shuffler:versions:{{{NS}-shuffler}}")}
    users = [str(u) for u in http("GET", f"{base}/users?limit=5000")[1]["users"] if str(u) not in reported][:N]
    assert len(users) == N  # N users new to the shuffler: with any open batch they close one
    rng = random.Random(21)
    start = _count(admin)
    envelopes, rewards, exact, rec_ids, contents = [], [], [], [], []
    for user in users:
        status, rec = http("GET", f"{base}/recommend?user={user}&k=5")
        assert status == 200, rec
        dev = LocalClient(user, config, codebook=codebook)
        reward = rng.uniform(0.05, 0.95)
        rep = dev.report(rec_id=rec["rec_id"], x=np.asarray(rng.choice(rec["items"])["x"]), reward=reward)
        envelopes.append(seal_report(rep, pk))
        rewards.append(reward)
        exact.append(dev.exact_b)
        rec_ids.append(rec["rec_id"])
        contents.append(rep.vector)
    with ThreadPoolExecutor(8) as pool:  # distinct users: their envelopes need no order
        statuses = list(pool.map(lambda env: http("POST", submit, env.to_dict())[0], envelopes))
    assert statuses == [202] * N and all(env.msgs for env in envelopes)
    wait_for(lambda: _count(admin) >= start + N, 60, "the batch of the new users released")
    time.sleep(1.0)  # let the logs flush
    assert_parties_apart(info, state, NS, d=config.d, contents=np.stack(contents), envelopes=envelopes,
                         rec_ids=rec_ids, rewards=rewards, exact=exact)


def _count(admin: redis.Redis) -> int:
    raw = admin.hgetall(f"{NS}:released:{{{NS}:rel}}:stats")
    return int(ReleasedStats.from_mapping(raw).count.sum()) if raw else 0
