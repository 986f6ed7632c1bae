"""The hierarchy (the default model) against a real broker and redis-server: what is released, what is served.

* Without noise, the released blocks are the users' contributions summed (each user one listen: no tick's grouping
  changes them), the served serving models are ``solve_hierarchy`` of the release, bit for bit, and ``/recommend``
  ranks by them.
* At epsilon 2, ``/budget`` states the blocks, their shares and the cap of 1; a user's second tick is not learned.
* On an open catalog, an item added while running is learned by the item level.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.ground.linalg import ucb_scores
from models.streaming.hierarchy import HierarchyLayout, ReleasedHierarchy, default_shares, solve_hierarchy
from pipeline import services
from pipeline.config.keys import PublicKeys
from pipeline.config.settings import Settings
from pipeline.data.catalog import load_catalog
from producers.catalog.generate import write_catalog

from stacks import LocalStack, exact_released_count, http, wait_for, web_stack

pytestmark = pytest.mark.integration

ADMIN = "operator-secret"


def _world(catalog: Path, **extra: str) -> dict[str, str]:
    return {"PRIVREC_CATALOG": str(catalog), "PRIVREC_D": "8", "PRIVREC_CATALOG_UNITS": "4",
            "PRIVREC_TICK_SECONDS": "0.3", "PRIVREC_LOGLEVEL": "WARNING", "PRIVREC_ADMIN_TOKEN": ADMIN,
            "PRIVREC_PARTITIONS": "2", **extra}


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_catalog(tmp_path_factory.mktemp("hier") / "shop", n_items=120, n_users=80, n_events=0,
                         events=False, seed=11, zipf=1.0)


def _listen(stack: LocalStack, events: list[tuple[str, str]]) -> None:
    from kafka import KafkaProducer  # type: ignore[import-untyped]

    prod = KafkaProducer(bootstrap_servers=stack.broker.address, linger_ms=5)
    for i, (user, arm) in enumerate(events):
        ev = {"event_id": f"h{i}-{user}", "user": user, "arm": arm, "reward": 1.0, "kind": "listen",
              "ts": 1.7e12 + i}
        prod.send("interactions", key=user.encode(), value=json.dumps(ev).encode())
    prod.flush()
    prod.close()


def _client(stack: LocalStack) -> Any:
    import redis

    return redis.Redis.from_url(stack.redis_url)


def _released(stack: LocalStack) -> dict[bytes, bytes]:
    return _client(stack).hgetall(PublicKeys(stack.namespace).released)


def _count(stack: LocalStack) -> int:
    """The events the latest release covers, exactly (the operator's figures: the released count is noisy)."""
    return exact_released_count(_client(stack), stack.namespace)


@pytest.fixture
def open_stack(tmp_path: Path, catalog_dir: Path, redis_server: services.ServiceHandle,
               request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    extra = dict(getattr(request, "param", {"PRIVREC_EPSILON": "inf"}))
    workers = int(extra.pop("workers", 1))
    with web_stack(tmp_path, settings=_world(catalog_dir, **extra), redis_url=redis_server.url,
                   workers=workers) as st:
        yield st


@pytest.mark.parametrize("open_stack", [{"PRIVREC_EPSILON": "inf", "workers": "2"}], indirect=True)
def test_without_noise_the_release_is_the_contributions_and_the_served_model_its_solve(
        open_stack: LocalStack, catalog_dir: Path) -> None:
    """Two workers, a partition each: each folds its own partition's users (pipeline.state.foldround), the leader
    releases the sum."""
    stack = open_stack
    s = Settings.from_mapping({}, environ=stack.env)
    assert s.model == "hierarchy" and not s.private
    catalog = load_catalog(s)
    items = list(catalog.arm_ids)
    rng = np.random.default_rng(0)
    users = [f"listener-{i}" for i in range(60)]
    picks = [items[int(a)] for a in rng.integers(0, 30, size=len(users))]
    _listen(stack, list(zip(users, picks)))
    wait_for(lambda: _count(stack) == len(users), 60, "every listen released")
    ticks = [json.loads(e) for e in _client(stack).lrange(PublicKeys(stack.namespace).tick_log, 0, -1)]
    assert any(t.get("folded") and t["partitions_here"] == 1 for t in ticks)  # the other worker folded the other

    raw = _released(stack)
    rel = ReleasedHierarchy.from_mapping(raw)
    layout = HierarchyLayout(d=catalog.d, n_items=rel.items.shape[0] if rel.items is not None else 0,
                             n_units=catalog.n_units, shares=default_shares(users=80, units=4, private=False))
    F = np.asarray(catalog.feature_matrix)
    exact = layout.exact_vector([(catalog.unit_of(u), {catalog.arm_row(a): 1.0}) for u, a in zip(users, picks)], F)
    expected = ReleasedHierarchy.from_vector(layout, exact, std=0.0)
    assert rel.std_pool == rel.std_items == 0.0 and rel.count == pytest.approx(len(users), abs=1e-9)
    assert np.allclose(rel.pool, expected.pool, atol=1e-12) and np.allclose(rel.items, expected.items, atol=1e-12)
    assert rel.units is not None and np.allclose(rel.units, expected.units, atol=1e-12)  # no noise: every block

    version = int(raw[b"version"])
    keys = PublicKeys(stack.namespace)
    client = _client(stack)
    wait_for(lambda: int(client.hget(keys.model_meta, "version") or 0) >= version, 30, "the release solved")
    meta = client.hgetall(keys.model_meta)
    assert meta[b"model"] == b"hierarchy"
    model = solve_hierarchy(ReleasedHierarchy.from_mapping(client.hgetall(keys.released)), F,
                            n_units=catalog.n_units)
    term = client.hgetall(keys.model_items)
    assert float(term[b"weight"]) == 1.0
    assert np.frombuffer(term[b"pop"], dtype="<f8").tobytes() == model.item_scores.tobytes()
    for u in range(catalog.n_units):
        unit = client.hgetall(keys.model_unit(u))
        assert np.frombuffer(unit[b"theta"], dtype="<f8").tobytes() == model.theta[u].tobytes()

    # /recommend ranks by x . theta_u + item term + bonus
    user = users[0]
    pool = items[:25]
    wait_for(lambda: _served_version(stack, pool[0]) >= version, 15, "the solved release served")
    status, body = stack.get_json("/recommend?" + urllib.parse.urlencode({"user": user, "k": "5",
                                                                            "candidates": ",".join(pool)}))
    assert status == 200
    u = catalog.unit_of(user)
    rows = catalog.arm_rows(pool)
    mean, bonus = ucb_scores(model.theta[u], model.M[u], F[rows], s.alpha)
    score = mean + bonus + model.item_scores[rows]
    order = [pool[i] for i in np.argsort(-score, kind="stable")[:5]]
    assert [it["item"] for it in body["items"]] == order
    # the most listened item of the pool is on top: counts decide without noise
    listened = {a: picks.count(a) for a in set(picks)}
    assert body["items"][0]["item"] == max(pool, key=lambda a: (listened.get(a, 0), -pool.index(a)))


def test_pending_contributions_without_the_gram_release_the_same_hierarchy(
        catalog_dir: Path, redis_client: Any) -> None:
    """The worker's hierarchy ingest keeps no Gram and no ``b`` in the pending contributions (``unit_stats`` off):
    on the same events, with the same secret seed, every tick publishes the same blocks (units on too) and count as
    an ingest that keeps them, bit for bit; the trusted stats then hold counts and no ``g:``/``b:`` fields."""
    from pipeline.data.records import partition_of
    from pipeline.ingestion.agents import make_processor
    from pipeline.release.stages import ReleaseStage
    from pipeline.state.trusted import TrustedKeys

    published: dict[bool, list[ReleasedHierarchy]] = {}
    stats: dict[bool, dict[bytes, bytes]] = {}
    for unit_stats in (True, False):
        ns = f"gramless{int(unit_stats)}"
        s = Settings.from_mapping({}, environ=_world(catalog_dir, PRIVREC_NAMESPACE=ns, PRIVREC_EPSILON="2",
                                                     PRIVREC_HIERARCHY_SHARES="pool=0.2,items=0.4,units=0.4"))
        catalog = load_catalog(s)
        redis_client.set(TrustedKeys(ns).secret, "20261127")
        proc = make_processor(redis_client, s, catalog)
        assert proc.unit_stats is False  # what the worker runs for the hierarchy
        proc.unit_stats = unit_stats
        stage = ReleaseStage(s, catalog, redis_client)
        arms = list(catalog.arm_ids)
        offsets = dict.fromkeys(range(s.partitions), 0)
        published[unit_stats] = []
        for tick in range(4):
            per: dict[int, list[bytes]] = {p: [] for p in range(s.partitions)}
            for u in range(tick * 15, tick * 15 + 25):  # 10 users return in the next tick: capped (user_cap 1)
                user = f"g{u}"
                for j in range(1 + u % 3):
                    ev = {"event_id": f"{user}-{tick}-{j}", "user": user, "arm": arms[(u * 7 + j) % len(arms)],
                          "reward": 1.0 if (u + j) % 3 else 0.0, "ts": 1.7e12, "rec_id": None}
                    per[partition_of(user, s.partitions)].append(json.dumps(ev).encode())
            for p, raws in per.items():
                batch = proc.process(p, list(enumerate(raws, start=offsets[p])))
                assert not batch.dead, batch.dead
                offsets[p] += len(raws)
            assert stage.tick(force=True) == tick + 1
            published[unit_stats].append(ReleasedHierarchy.from_mapping(
                redis_client.hgetall(PublicKeys(ns).released)))
        stats[unit_stats] = {k: v for p in range(s.partitions)
                             for k, v in redis_client.hgetall(TrustedKeys(ns).stats(p)).items()}
    for full, gramless in zip(published[True], published[False]):
        assert gramless.units is not None
        for name in ("pool", "items", "units"):
            assert np.array_equal(getattr(full, name), getattr(gramless, name)), name
        assert (full.std_pool, full.std_items, full.std_units) == (gramless.std_pool, gramless.std_items,
                                                                   gramless.std_units)
    assert not any(k[:2] in (b"g:", b"b:") for k in stats[False]) and any(k[:2] == b"g:" for k in stats[True])
    assert ({k: v for k, v in stats[True].items() if k[:2] == b"n:"}
            == {k: v for k, v in stats[False].items() if k[:2] == b"n:"})


@pytest.mark.parametrize("open_stack", [{"PRIVREC_EPSILON": "2"}], indirect=True)
def test_at_epsilon_2_the_budget_states_the_blocks_and_a_users_second_tick_is_not_learned(
        open_stack: LocalStack) -> None:
    stack = open_stack
    s = Settings.from_mapping({}, environ=stack.env)
    assert s.model == "hierarchy" and s.user_cap == 1
    catalog = load_catalog(s)
    arm = list(catalog.arm_ids)[3]
    _listen(stack, [("twice", arm)])
    wait_for(lambda: _count(stack) == 1, 30, "the first listen released")
    time.sleep(3 * s.tick_seconds)  # later ticks: the same user again
    _listen(stack, [("twice", arm), ("once", arm)])
    wait_for(lambda: _count(stack) == 2, 30, "the other user's listen released")
    status, body = stack.get_json("/budget")
    assert status == 200
    p = body["privacy"]
    assert p["model"] == "hierarchy" and p["unit"] == "user" and p["cap"] == 1
    assert p["epsilon"] == pytest.approx(2.0, rel=1e-9) and p["delta"] == 1e-5
    blocks = {st["name"]: st for st in p["statistics"] if "share_of_mu_squared" in st}
    assert set(blocks) == {"pool", "items"}
    assert sum(b["share_of_mu_squared"] for b in blocks.values()) == pytest.approx(1.0)
    for b in blocks.values():
        assert b["mu"] == pytest.approx(p["mu_at_cap"] * math.sqrt(b["share_of_mu_squared"]))
        assert b["sensitivity_per_tick"] == pytest.approx(math.sqrt(2))
    assert not any(x.startswith("the Gram") for x in p["public"])  # the hierarchy releases no Gram matrix
    assert p["relation"] == "add-remove" and "the release schedule" in " ".join(p["public"])
    assert "ledger" not in body and body["counts"].startswith("noisy")  # participation: the operator's figures
    status, metrics = stack.get_json("/metrics")
    assert status == 401 and metrics["error"]["parameter"] == "Authorization"
    wait_for(lambda: stack.get_json("/budget", token=stack.operator_token)[1]["ledger"]["capped_events"] >= 1, 30,
             "the capped listen counted")
    operator = stack.get_json("/budget", token=stack.operator_token)[1]
    assert operator["counts"].startswith("exact") and operator["events_released"] == 2  # (no event since)
    rel = ReleasedHierarchy.from_mapping(_released(stack))
    assert rel.std_pool > 0 and rel.std_items > 0
    # unweighted, a block's noise std is sigma sqrt(2) / sqrt(share): the pool's smaller share, the larger noise
    assert rel.std_pool > rel.std_items
    assert rel.std_pool / rel.std_items == pytest.approx(math.sqrt(blocks["items"]["share_of_mu_squared"]
                                                                    / blocks["pool"]["share_of_mu_squared"]))


def test_an_item_added_while_running_is_learned_by_the_item_level(open_stack: LocalStack) -> None:
    stack = open_stack
    s = Settings.from_mapping({}, environ=stack.env)
    new = "neu ✨ hier"
    status, ack = http("POST", stack.base_url + "/items", {"item": new, "name": "Neu", "tags": ["Jazz", "decade=1970s"]},
                       token=ADMIN)
    assert status == 202, ack
    wait_for(lambda: stack.get_json("/recommend?" + urllib.parse.urlencode(
        {"user": "probe", "k": "1", "candidates": new}))[0] == 200, 15, "the new item served")
    before = _pop_of(stack, s, new)
    _listen(stack, [(f"fan-{i}", new) for i in range(12)])
    wait_for(lambda: _count(stack) == 12, 60, "the fans' listens released")
    version = int(_released(stack)[b"version"])
    client = _client(stack)
    keys = PublicKeys(stack.namespace)
    wait_for(lambda: int(client.hget(keys.model_meta, "version") or 0) >= version, 30, "the release solved")
    # the web server re-reads the model's version at most every 0.2 s: wait until it serves the solved release
    wait_for(lambda: _served_version(stack, new) >= version, 15, "the solved release served")
    after = _pop_of(stack, s, new)
    assert before == 0.0 and after > 1.0  # learned: far above the content model's prediction


def _served_version(stack: LocalStack, arm: str) -> int:
    status, body = stack.get_json("/recommend?" + urllib.parse.urlencode({"user": "probe", "k": "1",
                                                                            "candidates": arm}))
    return int(body["model_version"]) if status == 200 else -1


def _pop_of(stack: LocalStack, s: Settings, arm: str) -> float:
    status, body = stack.get_json("/recommend?" + urllib.parse.urlencode({"user": "probe", "k": "1",
                                                                            "candidates": arm}))
    assert status == 200
    return float(body["items"][0].get("popularity", 0.0))
