"""A catalog directory on the real stack (broker, redis, worker, HTTP server): new users, all items, replays.

Nothing mocked: a generated catalog (string ids, non-ASCII names, tags, a friend graph) is served by a real
faust worker and ``pipeline.apps.web``; users the catalog does not list are served and learned from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from pipeline import services
from pipeline.config.keys import PublicKeys
from privrec.cli import main
from privrec.ops.stackfile import read_tokens, stack_tokens
from producers.catalog import hash_unit
from producers.catalog.generate import write_catalog

from stacks import REPO, http, wait_for

pytestmark = pytest.mark.integration

UNITS = 4




@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_catalog(tmp_path_factory.mktemp("mine") / "shop", n_items=400, n_users=60, n_events=1500, seed=7)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: services.ServiceHandle,
          catalog_dir: Path) -> Iterator[tuple[str, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("openworld")
    broker = services.start_broker(tmp)
    services.create_topics(broker.address, {"interactions": 4, "dead-letters": 1, "recommendations": 1})
    env = {**os.environ, "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": redis_server.url, "PRIVREC_NAMESPACE": "ow",
           "PRIVREC_CATALOG": str(catalog_dir), "PRIVREC_CATALOG_UNITS": str(UNITS), "PRIVREC_D": "8",
           "PRIVREC_EPSILON": "inf", "PRIVREC_TICK_SECONDS": "0.3", "PRIVREC_STATE_DIR": str(tmp),
           "PRIVREC_CACHE_DIR": str(tmp / "cache"), "PRIVREC_LOGLEVEL": "WARNING", "PYTHONPATH": str(REPO),
           "PRIVREC_ADMIN_TOKEN": "operator-secret",
           "PRIVREC_MODEL": "flat", "PRIVREC_ITEM_WEIGHT": "0"}  # the flat bandit's widths and features alone
                                                                  # (the hierarchy on an open catalog: test_hierarchy_stack.py)
    client = redis.Redis.from_url(redis_server.url)
    started = []
    try:
        started.append(services.start_process(
            "worker-0", [sys.executable, "-m", "pipeline.apps.worker"], tmp, env=env, timeout=90,
            ready=lambda: bool(client.hgetall("ow:ops:{ow:ops}:workers"))))
        port = services.free_port()
        tokens = stack_tokens(tmp, {})  # as privrec up makes them: <state>/tokens.json, the web server's env alone
        web = services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], tmp,
                                     env={**env, **tokens.env()}, address=f"127.0.0.1:{port}",
                                     url=f"http://127.0.0.1:{port}")
        started.append(web)
        wait_for(lambda: http("GET", f"{web.url}/healthz")[0] == 200, 60, "a first model")
        yield web.url, env
    finally:
        for h in reversed(started):
            services.stop(h, grace_seconds=5)
        services.stop(broker)


def test_a_new_user_is_served_over_every_item_and_learned_from(stack: tuple[str, dict[str, str]]) -> None:
    url, env = stack
    user = "Zoë, new today"
    q = urllib.parse.urlencode({"user": user, "k": "5"})
    code, body = http("GET", f"{url}/recommend?{q}")
    assert code == 200, body
    assert body["unit"] == hash_unit(user, UNITS)  # the public rule
    assert len(body["items"]) == 5 and len({it["item"] for it in body["items"]}) == 5
    target = "sku-000123-δ"
    cand = urllib.parse.urlencode({"user": user, "k": "1", "candidates": target})
    _, before = http("GET", f"{url}/recommend?{cand}")
    for _ in range(20):  # the new user likes one item: positive feedback on it
        code, rec = http("GET", f"{url}/recommend?{cand}")
        assert code == 200
        code, ack = http("POST", f"{url}/feedback", {"rec_id": rec["rec_id"], "item": target, "reward": 1})
        assert code == 202, ack

    wait_for(lambda: http("GET", f"{url}/budget")[1].get("events_released", 0) >= 20, 30, "the 20 feedbacks released")
    released = int(redis.Redis.from_url(env["REDIS_URL"]).hget(PublicKeys("ow").released, "version"))
    # the release is solved, then served once the web server re-reads the model's version (every 0.2 s)
    now = wait_for(lambda: (lambda r: r if r["model_version"] >= released else None)(http("GET", f"{url}/recommend?{cand}")[1]),
                   30, "the release's model served")
    # exactly the 20 feedbacks in the unit's Gram (epsilon = inf, nobody else in it yet): width alpha / sqrt(1 + 20)
    assert now["items"][0]["bonus"] == pytest.approx(before["items"][0]["bonus"] / 21 ** 0.5, rel=1e-9)
    assert before["items"][0]["mean"] == 0.0 and now["items"][0]["mean"] > 0.0
    operator = read_tokens(env["PRIVREC_STATE_DIR"]).operator  # the test picked this user: the operator asks
    code, budget = http("GET", f"{url}/budget?user={urllib.parse.quote(user)}", token=operator)
    assert code == 200 and budget["user"]["interactions"] == 20


def test_a_session_is_a_new_user_with_the_token_of_their_views(stack: tuple[str, dict[str, str]]) -> None:
    """``POST /session`` on a catalog that takes new users: a fresh id and its token, which opens that user's
    ``/budget?user=`` and no one else's."""
    url, env = stack
    tokens = read_tokens(env["PRIVREC_STATE_DIR"])
    made = [http("POST", f"{url}/session", {}) for _ in range(2)]
    assert [code for code, _ in made] == [201, 201], made
    (_, a), (_, b) = made
    assert a["user"] != b["user"] and a["user"].startswith("web-")
    assert a["token"] == tokens.for_user(a["user"])  # HMAC-SHA256(the stack's secret, the id)

    def view(user: str, token: str | None) -> tuple[int, Any]:
        return http("GET", f"{url}/budget?{urllib.parse.urlencode({'user': user})}", token=token)

    code, own = view(a["user"], a["token"])
    assert code == 200 and own["user"]["user"] == a["user"] and own["user"]["interactions"] == 0
    assert view(a["user"], None)[0] == 401
    assert view(a["user"], b["token"])[0] == 403  # one session's token opens its own user's view only
    assert view("Zoë, new today", a["token"])[0] == 403  # nor a user someone else made
    code, rec = http("GET", f"{url}/recommend?{urllib.parse.urlencode({'user': a['user'], 'k': '2'})}")
    assert code == 200 and rec["user"] == a["user"]  # served like any user the catalog does not list


def test_every_item_is_ranked_without_candidates(stack: tuple[str, dict[str, str]], catalog_dir: Path) -> None:
    url, _ = stack
    def settled() -> Any:  # a model version that stays (after a release the unit's list is refreshed in the
        _, first = http("GET", f"{url}/recommend?user=user-3@example.org&k=100")  # background: one request may be stale)
        time.sleep(0.5)
        code, again = http("GET", f"{url}/recommend?user=user-3@example.org&k=100")
        return again if code == 200 and again["model_version"] == first["model_version"] else None

    body = wait_for(settled, 30, "a settled model version")
    scores = [it["score"] for it in body["items"]]
    assert scores == sorted(scores, reverse=True) and len(body["items"]) == 100
    # the top 100 of all 400 items: none of the others scores higher (the same scores through candidates)
    ids = [line.split(",")[0] for line in (catalog_dir / "items.csv").read_text(encoding="utf-8").splitlines()[1:]]
    rest = [i for i in ids if i not in {it["item"] for it in body["items"]}]
    best_rest = max(http("GET", f"{url}/recommend?" + urllib.parse.urlencode(
        {"user": "user-3@example.org", "k": "1", "candidates": ",".join(rest[j:j + 100])}))[1]["items"][0]["score"]
        for j in range(0, len(rest), 100))
    assert best_rest <= scores[-1] + 1e-9


def test_replay_events_writes_the_ratio_and_baselines(stack: tuple[str, dict[str, str]], catalog_dir: Path,
                                                      tmp_path: Path) -> None:
    url, _ = stack
    out = tmp_path / "replay"
    assert main(["replay", "events", str(catalog_dir / "events.csv"), "--http", url, "--events", "400",
                 "--pool", "10", "--rate", "max", "--out", str(out), "--no-progress"]) == 0
    doc = json.loads((out / "replay.json").read_text())
    assert doc["events"] == 400 and doc["source"] == "events"
    assert doc["random_reward"] == pytest.approx(400 / 10)
    assert doc["ratio"] == pytest.approx(doc["reward"] / doc["random_reward"])
    assert {"popularity_ratio", "private_popularity_ratio"} <= doc.keys()
    assert doc["settings"]["catalog"] == str(catalog_dir.resolve())
    assert (out / "replay.png").stat().st_size > 0


def test_a_bad_catalog_is_refused_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "items.csv").write_text("item,tags\na,x|y\nb,\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("PRIVREC_") or k in ("KAFKA_BOOTSTRAP", "REDIS_URL"))}
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-m", "privrec.cli", "up", "--state-dir", str(state), "--catalog",
                           str(bad)], capture_output=True, text=True, timeout=120,
                          env={**env, "PRIVREC_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode != 0
    assert "items.csv, line 3, column tags: empty 'tags' and 'features'" in proc.stderr
    assert not (state / "stack.json").exists() and not list(state.glob("*.pid"))


def _tags_of(catalog_dir: Path, item: str) -> list[str]:
    import csv

    with (catalog_dir / "items.csv").open(encoding="utf-8") as fh:
        return next(r["tags"].split("|") for r in csv.DictReader(fh) if r["item"] == item)


def test_an_item_added_while_running_is_recommended_and_learned(stack: tuple[str, dict[str, str]],
                                                                catalog_dir: Path) -> None:
    url, env = stack
    auth = {"Authorization": "Bearer operator-secret"}
    # the operator token is required
    assert http("POST", f"{url}/items", {"item": "x", "tags": ["Jazz"]})[0] == 401
    assert http("POST", f"{url}/items", {"item": "x", "tags": ["Jazz"]}, headers={"Authorization": "Bearer nope"})[0] == 401
    # malformed bodies: 400 naming the field
    for body, field in (({"tags": ["Jazz"]}, "item"), ({"item": "x", "features": [1, 2]}, "features"),
                        ({"item": "x", "features": ["a"] * 8}, "features"), ({"item": "x"}, "tags"),
                        ({"item": "x", "tags": ["no-such-label"]}, "tags"), ({"item": "x", "tags": "Jazz"}, "tags"),
                        ({"item": "x", "tags": ["Jazz"], "name": 3}, "name"), ([1, 2], "body")):
        code, err = http("POST", f"{url}/items", body, headers=auth)
        assert (code, err["error"]["parameter"]) == (400, field), (body, err)
    assert http("POST", f"{url}/items", {"item": "sku-000001-β", "tags": ["Jazz"]}, headers=auth)[0] == 409  # already there

    # a unit learns to like one item: 30 new users that the public rule puts in one unit
    target = "sku-000200-α"
    unit = (hash_unit("Zoë, new today", UNITS) + 1) % UNITS
    fans = [u for u in (f"fan-{i}" for i in range(2000)) if hash_unit(u, UNITS) == unit][:30]
    released = http("GET", f"{url}/budget")[1]["events_released"]
    for fan in fans:
        _, rec = http("GET", f"{url}/recommend?" + urllib.parse.urlencode({"user": fan, "k": "1", "candidates": target}))
        assert http("POST", f"{url}/feedback", {"rec_id": rec["rec_id"], "item": target, "reward": 1})[0] == 202
    wait_for(lambda: http("GET", f"{url}/budget")[1]["events_released"] >= released + 30, 30, "the fans' feedback")

    # a new item like the liked one (the same tags: the same features, from the build's tag transform)
    new = "neu ✨ 2026"
    code, ack = http("POST", f"{url}/items", {"item": new, "name": "Neu ✨", "tags": _tags_of(catalog_dir, target)}, headers=auth)
    assert code == 202, ack

    def top() -> dict[str, float]:
        _, body = http("GET", f"{url}/recommend?" + urllib.parse.urlencode({"user": fans[0], "k": "20"}))
        return {it["item"]: it["score"] for it in body["items"]}

    ranked = wait_for(lambda: (lambda t: t if new in t else None)(top()), 10, "the new item in the top 20")
    assert ranked[new] == pytest.approx(ranked[target], abs=1e-9)  # ranked with the liked item, every item ranked
    # the worker knows it too: feedback on it is learned, not dead-lettered
    released = http("GET", f"{url}/budget")[1]["events_released"]
    _, rec = http("GET", f"{url}/recommend?" + urllib.parse.urlencode({"user": fans[1], "k": "1", "candidates": new}))
    assert rec["items"][0]["name"] == "Neu ✨"
    assert http("POST", f"{url}/feedback", {"rec_id": rec["rec_id"], "item": new, "reward": 1})[0] == 202
    wait_for(lambda: http("GET", f"{url}/budget")[1]["events_released"] >= released + 1, 30, "feedback on the new item")


def test_malformed_items_and_events_naming_unknown_items_are_dead_lettered(stack: tuple[str, dict[str, str]]
                                                                          ) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    _, env = stack
    kafka = env["KAFKA_BOOTSTRAP"]
    producer = KafkaProducer(bootstrap_servers=kafka)
    producer.send("items", key=b"bad", value=b'{"item": "bad", "features": [1, 2]}')
    producer.send("interactions", key=b"u", value=json.dumps(
        {"event_id": "ow-unknown", "user": "u", "arm": "no-such-item", "reward": 1}).encode())
    producer.flush()
    producer.close()
    consumer = KafkaConsumer("dead-letters", bootstrap_servers=kafka, auto_offset_reset="earliest",
                             consumer_timeout_ms=1000)
    seen: list[dict[str, Any]] = []

    def both() -> bool:
        seen.extend(json.loads(m.value) for m in consumer)
        reasons = [(d["topic"], d["reason"]) for d in seen]
        return (any(t == "items" and "malformed item" in r and "`features`" in r for t, r in reasons)
                and any(t == "interactions" and "unknown arm 'no-such-item'" in r for t, r in reasons))

    try:
        wait_for(both, 30, "both dead letters")
    finally:
        consumer.close()
    assert sum(1 for d in seen if d["topic"] == "items") == 1  # once, whichever worker saw it first


def test_the_item_sums_are_sized_at_start_and_take_items_added_later(redis_client: redis.Redis,
                                                                      tmp_path: Path) -> None:
    """Ingest on the real redis-server: the item term's sums have the capacity's coordinates from the start, an
    item added while running fills the next one, an item beyond the capacity is learned from with no sum."""
    from pipeline.data.catalog_open import OpenCatalog
    from pipeline.ingestion.ingest import IngestProcessor
    from pipeline.state.trusted import TrustedStore
    from producers.catalog import build_catalog

    root = write_catalog(tmp_path / "small", n_items=10, n_users=4, seed=3, edges=False)
    cat = OpenCatalog(build_catalog(root, d=8, units=2, use_cache=False))
    capacity = cat.item_capacity
    assert capacity == 10 + 1024
    proc = IngestProcessor(redis_client, "cap", cat, item_sums=True)
    assert proc.n_items == capacity
    fresh = [f"new-{i}" for i in range(capacity - 10 + 1)]  # one more than the capacity holds
    assert cat.add_items(fresh, np.ones((len(fresh), 8)) / np.sqrt(8)) == fresh
    events = [{"event_id": f"c{i}", "user": f"someone-{i}", "arm": arm, "reward": 1.0}
              for i, arm in enumerate(["sku-000003-δ", "new-0", "new-0", fresh[-1]])]
    batch = proc.process(0, [(i, json.dumps(e).encode()) for i, e in enumerate(events)])
    assert batch.counted == 4 and not batch.dead  # the item beyond the capacity is learned from (the bandit)
    _, sums, _ = TrustedStore(redis_client, "cap").load_partition_items(0, cat.n_units, cat.d, capacity)
    assert len(sums) == capacity and sums[3] == 1.0 and sums[10] == 2.0 and sums.sum() == 3.0


def test_privrec_up_serves_a_catalog_directory(tmp_path: Path, catalog_dir: Path) -> None:
    """The CLI as a user runs it: ``privrec up --catalog DIR``, a new user's recommendations, ``privrec down``."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("PRIVREC_") or k in ("KAFKA_BOOTSTRAP", "REDIS_URL"))}
    env["PRIVREC_CACHE_DIR"] = str(tmp_path / "cache")

    def privrec(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "privrec.cli", *args], capture_output=True, text=True,
                              timeout=240, env=env)

    state = tmp_path / "stack"
    up = privrec("up", "--state-dir", str(state), "--catalog", str(catalog_dir), "--d", "8", "--catalog-units", "3",
                 "--tick-seconds", "0.3", "--loglevel", "WARNING")
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        st = json.loads(privrec("status", "--state-dir", str(state), "--json").stdout)
        assert st["settings"]["catalog"] == str(catalog_dir.resolve())
        url = st["http"]
        wait_for(lambda: http("GET", f"{url}/healthz")[0] == 200, 60, "a first model")
        code, body = http("GET", f"{url}/recommend?user=brand-new&k=3")
        assert code == 200 and body["unit"] == hash_unit("brand-new", 3) and len(body["items"]) == 3
    finally:
        down = privrec("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr


def test_privrec_items_add_posts_a_file_of_items(stack: tuple[str, dict[str, str]], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = stack
    monkeypatch.setenv("PRIVREC_ADMIN_TOKEN", "operator-secret")
    f = tmp_path / "more.csv"
    f.write_text("item,name,tags,features\n"
                 "file-α,Aus der Datei,Jazz|Rock,\n"
                 "file-β,Mit Merkmalen,," + " ".join(["0.5"] * 8) + "\n"
                 "sku-000002-γ,schon da,Jazz,\n", encoding="utf-8")
    assert main(["items", "add", str(f), "--http", url]) == 0
    assert "added 2 items; 1 already in the catalog; 0 refused" in capsys.readouterr().out
    q = urllib.parse.urlencode({"user": "anyone", "k": "2", "candidates": "file-α,file-β"})
    body = wait_for(lambda: (lambda r: r[1] if r[0] == 200 else None)(http("GET", f"{url}/recommend?{q}")), 10,
                    "the added items served (one release tick after they were published)")
    assert {it["name"] for it in body["items"]} == {"Aus der Datei", "Mit Merkmalen"}
    # a bad file is refused before anything is sent, naming file, line and column
    f.write_text("item,features\nfile-γ,1 2 3\n", encoding="utf-8")
    assert main(["items", "add", str(f), "--http", url]) == 2
    assert "more.csv, line 2, column features: has 3 values, expected d = 8" in capsys.readouterr().err
