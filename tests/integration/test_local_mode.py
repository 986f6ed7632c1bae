"""Local mode against the real broker, redis-server, worker and web server.

* The boundary: during a local-mode replay (simulated users run the device library and talk HTTP),
  every message on every topic, every Redis key and the worker and web logs are scanned; none holds
  a raw reward (the test's fractional rewards are distinctive strings) or an exact per-user
  statistic (the test computes every exact ``b_u`` a device ever held and looks for it).
* Noise off (devices that send their exact values), the local aggregate equals the global mode's
  exact statistics of the same events, computed by the global mode's own ingest.
* kill -9 of the worker mid-stream and a restarted device: no report counted twice, no noise redrawn
  (the released sums equal the sums of the reports the devices sent, to the last bit of noise).
"""

from __future__ import annotations

import dataclasses

import json
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from models.local import FileStorage, LocalClient, LocalConfig, LocalReport
from models.local.aggregate import clip_context
from models.streaming import ReleasedStats, UnitStats
from pipeline import services
from pipeline.data.catalog import load_catalog
from pipeline.ingestion.ingest import IngestProcessor
from pipeline.config.settings import Settings

from stacks import LocalStack, lastfm_data_or_skip, wait_for, web_stack

WORLD = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "40",
         "PRIVREC_ALGORITHM": "linucb", "PRIVREC_EPSILON": "2", "PRIVREC_TICK_SECONDS": "0.3",
         "PRIVREC_LOGLEVEL": "INFO", "PRIVREC_MODE": "local",
         "PRIVREC_USER_CAP": "64"}  # user level (the default): a cap above what a device here reports in one epoch


def _config(stack: LocalStack) -> LocalConfig:
    status, public = stack.get_json("/local/config")
    assert status == 200 and public["mode"] == "local"
    from producers.devices import config_from_public

    return config_from_public(public)


def _released(stack: LocalStack) -> ReleasedStats:
    client = redis.Redis.from_url(stack.redis_url)
    raw = client.hgetall(f"{stack.namespace}:released:{{{stack.namespace}:rel}}:stats")
    return ReleasedStats.from_mapping(raw)


def _wait_released(stack: LocalStack, count: int, timeout: float = 60.0) -> ReleasedStats:
    def done() -> ReleasedStats | None:
        try:
            rel = _released(stack)
        except Exception:  # noqa: BLE001 - not published yet
            return None
        return rel if int(rel.count.sum()) >= count else None

    return wait_for(done, timeout, f"a release covering {count} reports")


def _play(stack: LocalStack, devices: dict[str, LocalClient], n: int, rng: random.Random,
          rewards: list[float], exact: list[np.ndarray], sent: list[LocalReport]) -> None:
    """``n`` interactions through the API: recommend, the user's reward, the device's report, POST /report."""
    users = sorted(devices)
    for _ in range(n):
        user = rng.choice(users)
        status, rec = stack.get_json(f"/recommend?user={user}&k=3")
        assert status == 200, rec
        item = rec["items"][rng.randrange(len(rec["items"]))]
        reward = rng.random() if rng.random() < 0.5 else float(rng.randrange(2))  # fractions: distinctive digits
        dev = devices[user]
        rep = dev.report(rec_id=rec["rec_id"], x=np.asarray(item["x"]), reward=reward)
        status, body = stack.post_json("/report", rep.to_dict())
        assert status == 202, body
        dev.acknowledge(rep.version)
        rewards.append(reward)
        exact.append(dev.exact_b)
        sent.append(rep)


# ---------------------------------------------------------------------------------------------- scanning

def _all_messages(address: str) -> list[tuple[str, bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=1500, auto_offset_reset="earliest")
    topics = sorted(t for t in consumer.topics() if not t.startswith("__"))
    out: list[tuple[str, bytes]] = []
    for topic in topics:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out += [(topic, r.value or b"") for r in records]
    consumer.close()
    return out


def _redis_values(url: str) -> list[tuple[str, bytes]]:
    client = redis.Redis.from_url(url)
    out: list[tuple[str, bytes]] = []
    for key in client.scan_iter(count=1000):
        name = key.decode()
        kind = client.type(key).decode()
        out.append((name, key))
        if kind == "string":
            out.append((name, client.get(key) or b""))
        elif kind == "hash":
            for f, v in client.hgetall(key).items():
                out += [(name, f), (name, v)]
        elif kind == "stream":
            for _, fields in client.xrange(key):
                for f, v in fields.items():
                    out += [(name, f), (name, v)]
        elif kind == "list":
            out += [(name, v) for v in client.lrange(key, 0, -1)]
        elif kind in ("set", "zset"):
            members = client.smembers(key) if kind == "set" else client.zrange(key, 0, -1)
            out += [(name, v) for v in members]
    client.close()
    return out


def _walk(obj: Any) -> Iterator[Any]:
    yield obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def _arrays(blob: bytes, d: int) -> Iterator[np.ndarray]:
    """Every run of numbers ``blob`` could hold: its JSON lists, and its bytes as little-endian float64."""
    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        doc = None
    for v in _walk(doc):
        if isinstance(v, list) and len(v) >= d and all(isinstance(a, (int, float)) for a in v):
            yield np.asarray(v, dtype=np.float64)
    for shift in range(8):  # any alignment
        n = (len(blob) - shift) // 8
        if n >= d:
            yield np.frombuffer(blob[shift:shift + 8 * n], dtype="<f8")


def _find(arr: np.ndarray, secrets: np.ndarray, atol: float = 1e-9) -> bool:
    """Whether any ``d`` consecutive values of ``arr`` equal (within ``atol``) a row of ``secrets``."""
    d = secrets.shape[1]
    with np.errstate(invalid="ignore"):
        starts = np.flatnonzero(np.isfinite(arr[: len(arr) - d + 1]))
        heads = np.sort(secrets[:, 0])
        lo = np.searchsorted(heads, arr[starts] - atol, side="left")
        hi = np.searchsorted(heads, arr[starts] + atol, side="right")
    for i in starts[hi > lo]:  # the first value matches some secret's: compare the whole window
        if np.any(np.all(np.abs(secrets - arr[i:i + d]) <= atol, axis=1)):
            return True
    return False


def _assert_no_leak(blobs: list[tuple[str, bytes]], rewards: list[float], exact: list[np.ndarray], d: int) -> None:
    distinctive = {repr(r) for r in rewards if 0 < r < 1}
    assert len(distinctive) > 20  # the scan has something to find
    secrets = np.stack([e for e in exact if np.abs(e).max() > 1e-6])
    for where, blob in blobs:
        text = blob.decode("utf-8", "replace")
        hits = [r for r in distinctive if r in text]
        assert not hits, f"a raw reward {hits[0]} in {where}: {text[:200]}"
        try:
            doc = json.loads(blob)
        except (ValueError, UnicodeDecodeError):
            doc = None
        assert not any(isinstance(v, dict) and "reward" in v for v in _walk(doc)), f"a 'reward' field in {where}"
        for arr in _arrays(blob, d):
            assert not _find(arr, secrets), f"an exact per-user b_u in {where}"


def test_the_scan_finds_what_it_looks_for() -> None:
    """The scanner is not vacuous: a planted exact vector (JSON or binary, any alignment) or reward is found."""
    rng = np.random.default_rng(0)
    exact = [rng.normal(size=5) for _ in range(30)]
    rewards = [float(r) for r in rng.random(30)]
    _assert_no_leak([("clean", json.dumps({"b": [1.5] * 5}).encode())], rewards, exact, 5)
    planted = [("json", json.dumps({"m": [0.0, *exact[7].tolist()]}).encode()),
               ("binary", b"xyz" + np.concatenate([rng.normal(size=3), exact[3]]).astype("<f8").tobytes()),
               ("reward", json.dumps({"v": rewards[4]}).encode()),
               ("field", json.dumps({"reward": 1}).encode())]
    for blob in planted:
        with pytest.raises(AssertionError):
            _assert_no_leak([blob], rewards, exact, 5)


# ---------------------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def tree_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Path]]:
    """A local-mode stack (per-user trees) and the directory where its simulated devices keep their state."""
    root = tmp_path_factory.mktemp("local-tree")
    with web_stack(root / "stack", settings={**WORLD, "PRIVREC_LOCAL_ALGORITHM": "tree"}) as st:
        yield st, root / "devices"


def _devices(stack: LocalStack, where: Path) -> dict[str, LocalClient]:
    cfg = _config(stack)
    return {u: LocalClient(u, cfg, FileStorage(where / f"{u}.json")) for u in map(str, range(6))}


def test_boundary_no_raw_reward_or_exact_user_statistic_anywhere(tree_stack: tuple[LocalStack, Path]) -> None:
    st, where = tree_stack
    cfg = _config(st)
    devices = _devices(st, where)
    rewards: list[float] = []
    exact: list[np.ndarray] = []
    sent: list[LocalReport] = []
    start = int(_wait_released(st, 0).count.sum())
    _play(st, devices, 120, random.Random(1), rewards, exact, sent)
    # a raw reward is refused, with the mode named
    status, rec = st.get_json("/recommend?user=0&k=2")
    status, body = st.post_json("/feedback", {"rec_id": rec["rec_id"], "item": rec["items"][0]["item"],
                                              "reward": 0.123456789})
    assert status == 400 and "local mode" in body["error"]["message"] and "/report" in body["error"]["message"]
    status, body = st.post_json("/listen", {"user": "0", "item": rec["items"][0]["item"], "reward": 0.123456789})
    assert status == 400 and "local mode" in body["error"]["message"]
    rel = _wait_released(st, start + len(sent))
    assert int(rel.count.sum()) == start + len(sent)
    time.sleep(1.0)  # let the logs flush
    blobs = _all_messages(st.broker.address) + _redis_values(st.redis_url)
    topics = {w for w, _ in blobs}
    assert {"ldp-reports", "recommendations"} <= topics
    for name in ("worker-0", "web"):
        log = (st.state_dir / f"{name}.log").read_bytes()
        assert len(log) > 0
        blobs += [(f"{name}.log", line) for line in log.splitlines()]
    _assert_no_leak(blobs, rewards + [0.123456789], exact, cfg.d)
    # and the budget states each user's local guarantee
    status, b = st.get_json("/budget?user=3", token=st.user_token("3"))
    assert status == 200 and b["privacy"]["mode"] == "local"
    assert b["user"]["reports"] == devices["3"].version
    assert "device" in b["local"]["guarantee"]["trusted"]


def _latest_reports(stack: LocalStack) -> dict[str, np.ndarray]:
    """Each user's latest report as the worker stored it (noisy: public)."""
    client = redis.Redis.from_url(stack.redis_url)
    out = {}
    for p in range(4):
        for k, v in client.hgetall(f"{stack.namespace}:trusted:{{{stack.namespace}:p{p}}}:stats").items():
            if k.startswith(b"l:"):
                out[k[2:].decode()] = np.frombuffer(v[8:], dtype="<f8")
    client.close()
    return out


def test_kill9_mid_stream_and_a_restarted_device_count_nothing_twice_and_redraw_nothing(
        tree_stack: tuple[LocalStack, Path]) -> None:
    st, where = tree_stack
    cfg = _config(st)
    start = int(_wait_released(st, 0).count.sum())
    devices = _devices(st, where)  # restarted devices: they continue from their files, if any
    rng = random.Random(2)
    sent: list[LocalReport] = []
    _play(st, devices, 30, rng, [], [], sent)
    worker = next(h for h in st.handles if h.name == "worker-0")
    os.kill(worker.pid, 9)
    wait_for(lambda: not services.is_running(worker), 10, "the killed worker to exit")
    _play(st, devices, 30, rng, [], [], sent)  # the web keeps accepting; Kafka keeps the reports
    # a device that crashes after making a report and before sending it
    status, rec = st.get_json("/recommend?user=2&k=2")
    item = rec["items"][0]
    pending = devices["2"].report(rec_id=rec["rec_id"], x=np.asarray(item["x"]), reward=1.0)
    restarted = LocalClient("2", cfg, FileStorage(where / "2.json"))
    assert restarted.pending() == [pending] and restarted.pending()[0].to_json() == pending.to_json()
    status, body = st.post_json("/report", restarted.pending()[0].to_dict())
    assert status == 202, body
    status, body = st.post_json("/report", restarted.pending()[0].to_dict())
    assert status == 409  # re-sent: one report per shown list
    restarted.acknowledge(pending.version)
    sent.append(pending)
    # the same report on the topic twice (a producer retry): the worker dead-letters the repeat
    prod = KafkaProducer(bootstrap_servers=st.broker.address)
    queued = dataclasses.replace(pending, shown=tuple(it["item"] for it in rec["items"]))  # as the server queued it
    prod.send("ldp-reports", key=b"2", value=queued.to_json()).get(timeout=10)
    prod.close()
    env = {**st.env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    st.handles.append(services.start_process("worker-0", [sys.executable, "-m", "pipeline.apps.worker"], st.state_dir,
                                             env=env, timeout=60))
    _wait_released(st, start + len(sent))
    time.sleep(1.5)  # the repeat, were it counted, would show in a later release
    rel = _released(st)
    assert int(rel.count.sum()) == start + len(sent)
    stored = _latest_reports(st)
    last = {rep.user: rep for rep in sent}
    for user, rep in last.items():  # each user's latest report, bit for bit: no noise redrawn
        np.testing.assert_array_equal(stored[user], rep.vector)
    catalog = load_catalog(Settings.from_mapping({}, environ=st.env))
    expected = np.zeros((catalog.n_units, cfg.d))
    for user, vec in stored.items():
        expected[catalog.unit_of(user)] += vec
    np.testing.assert_allclose(rel.b_tilde.reshape(-1, cfg.d), expected, rtol=0, atol=1e-9)
    dead = _dead_letters(st.broker.address)
    assert any("stale or repeated version" in d["reason"] for d in dead)


def _dead_letters(address: str) -> list[dict[str, Any]]:
    return [json.loads(v) for t, v in _all_messages(address) if t == "dead-letters"]


def test_noise_off_the_local_aggregate_equals_the_global_modes_exact_statistics(tmp_path: Path) -> None:
    """Devices without noise send their exact values (the protocol does not care); the released sums then equal
    the statistics the global mode's own ingest computes from the same events."""
    # event level: the test's hand-made reports carry no epoch (the device library is not what is tested here)
    with web_stack(tmp_path / "st", settings={**WORLD, "PRIVREC_LOCAL_ALGORITHM": "round",
                                              "PRIVREC_PRIVACY_UNIT": "event"}) as st:
        cfg = _config(st)
        rng = random.Random(5)
        events: list[dict[str, Any]] = []
        versions: dict[str, int] = {}
        for i in range(80):
            user = str(rng.randrange(6))
            status, rec = st.get_json(f"/recommend?user={user}&k=3")
            item = rec["items"][rng.randrange(len(rec["items"]))]
            reward = rng.random()
            x = clip_context(np.asarray(item["x"]))
            versions[user] = versions.get(user, 0) + 1
            rep = LocalReport(user, versions[user], "round", rec["rec_id"], reward * x)
            assert st.post_json("/report", rep.to_dict())[0] == 202
            events.append({"event_id": f"e{i}", "user": user, "arm": item["item"], "reward": reward, "ts": 1.7e12 + i,
                           "rec_id": None, "shown": [it["item"] for it in rec["items"]]})
        rel = _wait_released(st, len(events))
        # the global mode's ingest, on the same events, in a namespace of its own
        s = Settings.from_mapping({}, environ={**st.env, "PRIVREC_MODE": "global", "PRIVREC_NAMESPACE": "glob"})
        catalog = load_catalog(s)
        client = redis.Redis.from_url(st.redis_url)
        proc = IngestProcessor(client, "glob", catalog)
        proc.process(0, [(i, json.dumps(e).encode()) for i, e in enumerate(events)])
        stats, _ = proc.store.snapshot(1, catalog.n_units, catalog.d)
        assert isinstance(stats, UnitStats)
        np.testing.assert_array_equal(rel.count, stats.count)
        np.testing.assert_allclose(rel.gram, stats.gram, rtol=0, atol=1e-12)
        np.testing.assert_allclose(rel.b_tilde.reshape(-1, cfg.d), stats.b, rtol=0, atol=1e-12)
        client.close()
