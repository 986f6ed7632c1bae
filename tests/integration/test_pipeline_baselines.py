"""The other papers' baselines (``--algorithm ss-* / dgs-*``) in the streaming pipeline.

One broker and one stream for the whole module: ten real worker processes, one per
(baseline, noise off / on) namespace, consume the same ``interactions`` topic in their own
consumer groups. Mid-stream the five noise-on workers are killed with SIGKILL and
restarted. Then, for each baseline:

* noise off: exact statistics, the released per-unit models, the model keys and what
  ``Recommender`` serves equal the offline baseline on the same events (exactly through
  ``release_from_stats``; to a stated tolerance through the event-by-event ``update`` path);
* noise on: nothing is lost or counted twice, every version ever published (before and
  after the crash) equals a release recomputed from the audit log and the secret seed, and
  the persisted per-unit mechanism state equals that recomputation's state byte for byte.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from models.policies.peruser import ServingModels
from models.policies.baselines import make_baseline
from models.ground.linalg import ucb_scores
from models.streaming import UnitStats
from pipeline import services
from pipeline.release.baseline_release import build_baseline
from pipeline.data.catalog import SyntheticCatalog
from pipeline.config.keys import PublicKeys
from pipeline.data.records import parse_batch, parse_interaction
from pipeline.serve.serving import Recommender
from pipeline.config.settings import BASELINE_ALGORITHMS
from pipeline.state.trusted import TrustedKeys, TrustedStore

from stacks import WORLD, Stack, offline_stats, produce, synthetic_events, wait_for

pytestmark = pytest.mark.integration

ALGORITHMS = sorted(BASELINE_ALGORITHMS)
EVENTS = 4000
#: Tiny per-unit trees (``2**3 - 1 = 7`` releases of a unit per epoch: a horizon of 3 releases gets
#: ``1 + ceil(log2 3)`` levels), so the streams roll over into new epochs.
TREE_LEVELS = "2"
#: After the bulk of the stream, this many waves that each touch every unit and are released before
#: the next one is sent: every unit advances at least WAVES times however slowly the workers tick,
#: so with WAVES > 7 every unit's tree rolls over (not left to the machine's speed).
WAVES = 10


@dataclass
class Run:
    """One namespace's worker, and every release the watcher saw it publish."""

    stack: Stack
    algorithm: str
    private: bool
    seen: dict[int, dict[str, bytes]] = field(default_factory=dict)  # version -> theta/conf/width bytes
    errors: list[str] = field(default_factory=list)
    before_crash: dict[int, dict[str, bytes]] = field(default_factory=dict)
    count_at_crash: int = 0


@dataclass
class Streamed:
    runs: dict[tuple[str, bool], Run]
    produced: list[tuple[int, int, bytes]]
    catalog: SyntheticCatalog


def _published(raw: dict[bytes, bytes]) -> dict[str, bytes]:
    return {k: raw[f"a:{k}".encode()] for k in ("theta", "conf", "width")}


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory, redis_server: services.ServiceHandle) -> Iterator[Streamed]:
    tmp = tmp_path_factory.mktemp("baselines")
    broker = services.start_broker(tmp)
    services.create_topics(broker.address, {"interactions": 4, "dead-letters": 1, "recommendations": 1})
    runs: dict[tuple[str, bool], Run] = {}
    for i, (alg, private) in enumerate((a, p) for a in ALGORITHMS for p in (False, True)):
        ns = f"bl{i}x{abs(hash(tmp)) % 10_000}"
        state = tmp / ns
        state.mkdir()
        env = {**WORLD, "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": redis_server.url, "PRIVREC_NAMESPACE": ns,
               "PRIVREC_STATE_DIR": str(state), "PRIVREC_ALGORITHM": alg, "PRIVREC_TREE_LEVELS": TREE_LEVELS,
               "PRIVREC_EPSILON": "2" if private else "inf"}
        runs[alg, private] = Run(Stack(state, broker, redis_server.url, ns, env), alg, private)
    try:
        with ThreadPoolExecutor(len(runs)) as pool:  # worker start-ups overlap (each ~5-9 s alone)
            list(pool.map(lambda r: r.stack.start_worker(timeout=120), runs.values()))
        catalog = next(iter(runs.values())).stack.catalog()
        stop = threading.Event()

        def watch() -> None:
            client = redis.Redis.from_url(redis_server.url)
            while not stop.is_set():
                for run in runs.values():
                    raw = client.hgetall(PublicKeys(run.stack.namespace).released)
                    if raw:
                        v, got = int(raw[b"version"]), _published(raw)
                        if run.seen.setdefault(v, got) != got:
                            run.errors.append(f"version {v} was published twice with different values")
                stop.wait(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        events = list(synthetic_events(catalog, EVENTS, seed=7))
        bulk, waves = _split_waves(events, catalog.n_units, WAVES)
        produced: list[tuple[int, int, bytes]] = []
        stacks = [r.stack for r in runs.values()]  # one topic, several namespaces: each records the lists
        # (served feedback carries no context of its own: the event-by-event twin below takes one row per event)
        producer = threading.Thread(target=lambda: produced.extend(produce(stacks, bulk, rate=500, contexts=False)))
        producer.start()
        noisy = [r for r in runs.values() if r.private]
        wait_for(lambda: all(r.stack.released_count() > 800 for r in noisy), 40, "a release in the middle of the stream")
        for run in noisy:
            worker = run.stack.workers[-1]
            run.stack.kill9(worker)
            run.stack.workers.remove(worker)
            run.before_crash = dict(run.seen)
            run.count_at_crash = run.stack.released_count()
        with ThreadPoolExecutor(len(noisy)) as pool:
            list(pool.map(lambda r: r.stack.start_worker("worker-1", timeout=120), noisy))
        producer.join(timeout=60)
        for wave in waves:
            sent = len(produced)
            for run in runs.values():
                wait_for(lambda: run.stack.released_count() == sent, 90, f"the stream released in {run.algorithm}")
            produced.extend(produce(stacks, wave, contexts=False))
        for run in runs.values():
            wait_for(lambda: run.stack.released_count() == EVENTS, 90, f"all events released in {run.algorithm}")
            version = int(run.stack.released()[b"version"])
            wait_for(lambda: run.stack.model_version() >= version and version in run.seen, 30,
                     f"the serving model of {run.algorithm}")
        stop.set()
        watcher.join(timeout=5)
        yield Streamed(runs, produced, catalog)
    finally:
        with ThreadPoolExecutor(len(runs)) as pool:
            list(pool.map(lambda w: services.stop(w, grace_seconds=5), [w for r in runs.values() for w in r.stack.workers]))
        services.stop(broker)
        shutil.rmtree(tmp, ignore_errors=True)


def _split_waves(events: list[dict[str, Any]], n_units: int,
                 waves: int) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """``(bulk, waves)``: each wave holds one event of every unit, taken from the end of ``events``."""
    tail: list[list[dict[str, Any]]] = [[] for _ in range(waves)]
    taken: set[int] = set()
    for u in range(n_units):
        mine = [i for i in range(len(events) - 1, -1, -1) if events[i]["user"] == str(u)][:waves]
        assert len(mine) == waves, f"unit {u} has fewer than {waves} events"
        for w, i in enumerate(mine):
            tail[w].append(events[i])
        taken.update(mine)
    return [ev for i, ev in enumerate(events) if i not in taken], tail


class IncrementalStats:
    """``offline_stats(..., upto=offsets)`` for a non-decreasing sequence of ``offsets``, in one pass.

    Per partition, events are added in offset order with ``UnitStats.add`` (bit-identical to the
    workers' batches), and shards are summed in partition order, as the release stage does.
    """

    def __init__(self, catalog: SyntheticCatalog, produced: list[tuple[int, int, bytes]], partitions: int) -> None:
        self.parts = []
        for p in range(partitions):
            rows = []
            for _, off, value in sorted(x for x in produced if x[0] == p):
                one = parse_batch([value], catalog)  # the Gram takes the shown list's items, b the event's context
                if not one.dead:
                    rows.append((off, one))
            self.parts.append(rows)
        self.shards = [UnitStats.zeros(n_units=catalog.n_units, d=catalog.d) for _ in range(partitions)]
        self.pos = [0] * partitions

    def upto(self, offsets: list[int]) -> UnitStats:
        for p, rows in enumerate(self.parts):
            i = self.pos[p]
            while i < len(rows) and rows[i][0] < offsets[p]:
                one = rows[i][1]
                self.shards[p].add_parts(one.units, one.contexts, one.rewards, one.units[one.gram_events],
                                         one.gram_contexts)
                i += 1
            self.pos[p] = i
        return UnitStats.merged(self.shards)


def _model_keys(run: Run, n_units: int) -> list[dict[bytes, bytes]]:
    keys = PublicKeys(run.stack.namespace)
    return [run.stack.client.hgetall(keys.model_unit(u)) for u in range(n_units)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_noise_off_stream_equals_the_offline_baseline(streamed: Streamed, algorithm: str) -> None:
    run, catalog = streamed.runs[algorithm, False], streamed.catalog
    s = run.stack.settings()
    assert s.baseline == BASELINE_ALGORITHMS[algorithm] and not s.private
    exact = offline_stats(catalog, streamed.produced, s.partitions)
    streamed_stats, _ = TrustedStore(run.stack.client, s.namespace).snapshot(s.partitions, catalog.n_units, catalog.d)
    assert streamed_stats.to_mapping() == exact.to_mapping()  # bit for bit

    # exactly the offline baseline's models from the same statistics: without noise a unit's model
    # depends only on its statistics at its last release, which by now hold all of its events
    offline = build_baseline(s, catalog, seed=0).release_from_stats(exact.gram, exact.b, exact.count)
    released = ServingModels.from_mapping(run.stack.released())
    for name in ("theta", "conf", "width", "count"):
        assert getattr(released, name).tobytes() == getattr(offline, name).tobytes(), name
    for u, raw in enumerate(_model_keys(run, catalog.n_units)):
        assert raw[b"theta"] == offline.theta[u].tobytes() and raw[b"M"] == offline.conf[u].tobytes()
        assert float(raw[b"width"]) == offline.width[u]

    # the same baseline fed event by event (Sherman–Morrison per event, rows in send order): the same
    # math in another float order. lambda = 1, ||x|| <= 1, ~700 events per unit: cond(lambda I + G)
    # <= 700, so both inverses agree to ~cond * n * 1e-16 ~ 1e-10 relative; the widths (logs of
    # determinants) closer still
    twin = make_baseline(s.baseline, d=catalog.d, n_users=catalog.n_units, lambda_=s.lambda_,  # type: ignore[arg-type]
                         alpha="theory" if algorithm.startswith("ss-") else s.alpha, tick=EVENTS)
    for _, _, value in streamed.produced:
        u, x, r, _ = parse_interaction(value, catalog)
        twin.update(u, x, r)
    for u in range(catalog.n_units):
        theta, C, width = twin.serving_model(u)
        np.testing.assert_allclose(offline.theta[u], theta, rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(offline.conf[u], C, rtol=1e-8, atol=1e-12)
        assert offline.width[u] == pytest.approx(width, rel=1e-9)

    # serving ranks with each unit's own width (S&S's differs per unit; a global alpha would not match)
    rec = Recommender(run.stack.client, s.namespace, catalog)
    pool = [str(a) for a in range(20)]
    for user in catalog.users:
        got = rec.recommend(user, pool, k=5)
        unit = catalog.unit_of(user)
        mean, bonus = ucb_scores(offline.theta[unit], offline.conf[unit], catalog.features_of(pool),
                                 float(offline.width[unit]))
        order = np.argsort(-(mean + bonus), kind="stable")[:5]
        assert [it["item"] for it in got["items"]] == [pool[i] for i in order]
        assert [it["score"] for it in got["items"]] == [float((mean + bonus)[i]) for i in order]
    if algorithm.startswith("ss-"):
        assert len(set(offline.width.tolist())) > 1  # per-unit widths really differ


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_kill9_restart_continues_from_the_persisted_noise(streamed: Streamed, algorithm: str) -> None:
    run, catalog = streamed.runs[algorithm, True], streamed.catalog
    s = run.stack.settings()
    client = run.stack.client
    store = TrustedStore(client, s.namespace)
    streamed_stats, _ = store.snapshot(s.partitions, catalog.n_units, catalog.d)
    assert streamed_stats.to_mapping() == offline_stats(catalog, streamed.produced, s.partitions).to_mapping()
    assert int(streamed_stats.count.sum()) == EVENTS  # nothing lost, nothing counted twice
    assert not run.errors

    # the crash was mid-stream, and releases were published both before and after it
    log = [{k.decode(): v.decode() for k, v in f.items()} for _, f in client.xrange(PublicKeys(s.namespace).released_log)]
    versions = [int(e["version"]) for e in log]
    assert versions == list(range(1, len(log) + 1))  # no version skipped or repeated across the crash
    crash_version = max(run.before_crash)
    assert len(run.before_crash) >= 2 and run.count_at_crash < EVENTS and crash_version < versions[-1]
    assert any(v > crash_version for v in run.seen)

    # recompute the whole release sequence from the audit log (offsets per version) and the secret
    # seed: every version ever published, before and after the crash, is exactly that
    policy = build_baseline(s, catalog, store.noise_seed())
    stats = IncrementalStats(catalog, streamed.produced, s.partitions)
    expected: dict[int, dict[str, bytes]] = {}
    advanced_after_crash = 0
    for entry in log:
        st = stats.upto(json.loads(entry["offsets"]))
        assert int(entry["count"]) == int(st.count.sum())
        rel = policy.release_from_stats(st.gram, st.b, st.count)
        expected[int(entry["version"])] = {k: v.tobytes() for k, v in
                                           (("theta", rel.theta), ("conf", rel.conf), ("width", rel.width))}
        if int(entry["version"]) > crash_version:
            advanced_after_crash += len(rel.advanced)
    assert advanced_after_crash > 0
    for v, got in run.seen.items():
        assert expected[v] == got, f"published version {v} differs from its deterministic release"
    # the persisted per-unit mechanism states are that recomputation's, byte for byte (trees that
    # rolled over included), and the model keys hold the last release
    persisted = {k.decode(): v for k, v in client.hgetall(TrustedKeys(s.namespace).noise_state).items()}
    assert int(persisted.pop("release_version")) == versions[-1]
    assert persisted == policy.stream_state()
    assert max(st.epoch for st in policy.states) >= 1, [(st.epoch, st.step) for st in policy.states]
    last = ServingModels.from_mapping(run.stack.released())
    for u, raw in enumerate(_model_keys(run, catalog.n_units)):
        assert raw[b"theta"] == last.theta[u].tobytes() and raw[b"M"] == last.conf[u].tobytes()
        assert float(raw[b"width"]) == last.width[u]

    # the budget statement says what the baseline really guarantees
    meta = {k.decode(): v.decode() for k, v in client.hgetall(PublicKeys(s.namespace).model_meta).items()}
    privacy = json.loads(meta["privacy"])
    assert privacy["private"] and privacy["mechanism"] == s.baseline and "not used" in privacy["mechanism_setting"]
    if algorithm.startswith("ss-"):
        assert privacy["valid"] and "joint DP" in privacy["notion"] and "context" in privacy["protects"]
        assert privacy["epsilon"] <= 2.0 * (1 + 1e-9)
    else:
        assert not privacy["valid"] and "NOT a valid DP guarantee" in privacy["note"]
        assert "B.5" in privacy["note"] and privacy["protects"].startswith("each interaction's reward only")
    assert math.isfinite(float(meta["width_max"]))
