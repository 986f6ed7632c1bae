"""The one place tests start stacks and talk HTTP to them (``tests/README.md``).

Stacks, smallest first:

- :func:`open_stack`: a fresh broker with the pipeline's topics and a namespace on a given redis-server; the test
  starts the workers it needs (:meth:`Stack.start_worker`) and kills them at will.
- :func:`web_stack`: a fresh broker, a redis-server (or a given one), one worker and the web server, ready to answer
  (:func:`privrec.bench.serve.local_stack`, which the serving benchmark uses too).
- :func:`up_stack`: ``privrec up`` itself (:func:`privrec.ops.up`), stopped by ``privrec down`` on exit; for what only
  ``up`` arranges (the shuffler, federated sites, the ACL users, the supervisor) and for tests of ``up``.
- :func:`start_redis`: a redis-server of the test's own (the session's is the ``redis_server`` fixture).

Every process is stopped by PID on exit, also after a failure. :func:`http` is the one HTTP client of the tests.
Also here: event producers, the offline computation a stack's release is compared with, and wait helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis
from kafka import KafkaConsumer, KafkaProducer

from models.streaming import UnitStats
from pipeline import services
from pipeline.data.catalog import SyntheticCatalog
from pipeline.config.keys import PublicKeys
from pipeline.data.records import parse_batch
from pipeline.ingestion.shown_lists import rec_id_required
from pipeline.services import ServiceHandle
from pipeline.config.settings import Settings
from privrec.bench.serve import LocalStack
from privrec.bench.serve import local_stack as web_stack  # the serving benchmark starts its stacks the same way

__all__ = ["WORLD", "REPO", "LocalStack", "web_stack", "wait_for", "Stack", "open_stack", "up_stack", "start_redis",
           "Reply", "http", "synthetic_events", "shown_as_served", "produce", "offline_stats", "ReleaseWatcher",
           "assert_releases_deterministic", "Stream", "assert_exact", "produce_synthetic", "admin_url",
           "exact_released_count", "released_events", "alive", "publish_model", "lastfm_data_or_skip"]

REPO = Path(__file__).resolve().parents[1]

#: Small synthetic world used by the pipeline tests.
#: Event level: these tests compare the streamed statistics with the offline computation event by event
#: (user level sums and clips each user's events per release tick, which depends on the tick timing;
#: tests/integration/test_user_level_stack.py covers it).
WORLD = {"PRIVREC_D": "5", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "40", "PRIVREC_TICK_SECONDS": "0.3",
         "PRIVREC_LOGLEVEL": "WARNING", "PRIVREC_PRIVACY_UNIT": "event",
         "PRIVREC_ITEM_WEIGHT": "0"}  # the bandit's release alone (the flat model without the item term)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class Stack:
    """A broker of its own, the session's redis-server, a namespace, and worker processes."""

    state_dir: Path
    broker: ServiceHandle
    redis_url: str
    namespace: str
    env: dict[str, str] = field(default_factory=dict)
    workers: list[ServiceHandle] = field(default_factory=list)

    @property
    def client(self) -> redis.Redis:
        from pipeline.config.redisconn import connect

        return connect(self.redis_url)  # a cluster client when the URL names a Redis Cluster node

    def settings(self) -> Settings:
        return Settings.from_mapping({}, environ=self.env)

    def catalog(self) -> SyntheticCatalog:
        s = self.settings()
        return SyntheticCatalog(n_users=s.n_users, d=s.d, n_arms=s.n_arms, seed=s.world_seed)

    def start_worker(self, name: str = "worker-0", timeout: float = 60.0) -> ServiceHandle:
        env = {**os.environ, **self.env, "PRIVREC_WORKER_ID": name, "PYTHONPATH": str(REPO)}
        client = self.client
        status = f"{self.namespace}:ops:{{{self.namespace}:ops}}:workers"

        def assigned() -> bool:
            raw = client.hget(status, name)
            return bool(raw) and bool(json.loads(raw)["partitions"])

        client.hdel(status, name)
        handle = services.start_process(name, [sys.executable, "-m", "pipeline.apps.worker"], self.state_dir,
                                        env=env, ready=assigned, timeout=timeout)
        self.workers.append(handle)
        return handle

    def kill9(self, handle: ServiceHandle) -> None:
        os.kill(handle.pid, 9)
        wait_for(lambda: not services.is_running(handle), 10, "the killed worker to exit")

    def producer(self) -> KafkaProducer:
        return KafkaProducer(bootstrap_servers=self.broker.address, linger_ms=5)

    def released(self) -> dict[bytes, bytes]:
        return self.client.hgetall(f"{self.namespace}:released:{{{self.namespace}:rel}}:stats")

    def released_count(self) -> int:
        """Events the latest release covers: the exact figure (the operator's key under the add/remove relation)."""
        return exact_released_count(self.client, self.namespace)

    def model_version(self) -> int:
        raw = self.client.hget(f"{self.namespace}:model:{{{self.namespace}:model}}:meta", "version")
        return int(raw or 0)

    def dead_letters(self, expected: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        consumer = KafkaConsumer("dead-letters", bootstrap_servers=self.broker.address,
                                 auto_offset_reset="earliest", consumer_timeout_ms=1000)
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer:
                out.append(json.loads(msg.value))
        consumer.close()
        return out


@contextlib.contextmanager
def open_stack(state_dir: Path, redis_url: str, namespace: str, *, partitions: int = 4,
               world: dict[str, str] | None = None, env: dict[str, str] | None = None) -> Iterator[Stack]:
    """A fresh broker (so topics start empty) with the pipeline's topics, a namespace on the session's
    redis-server, and on exit every worker stopped, then the broker."""
    broker = services.start_broker(state_dir)
    services.create_topics(broker.address, {"interactions": partitions, "dead-letters": 1, "recommendations": 1})
    full = {**(WORLD if world is None else world), "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": redis_url,
            "PRIVREC_NAMESPACE": namespace, "PRIVREC_STATE_DIR": str(state_dir), **(env or {})}
    st = Stack(state_dir, broker, redis_url, namespace, full)
    try:
        yield st
    finally:
        for w in st.workers:
            services.stop(w, grace_seconds=5)
        for b in {broker.pid: broker, st.broker.pid: st.broker}.values():  # a test may have replaced the broker
            services.stop(b)


@contextlib.contextmanager
def up_stack(settings: Settings, state_dir: Path, **up: Any) -> Iterator[dict[str, Any]]:
    """``privrec up`` in ``state_dir`` (``up``: :func:`privrec.ops.up`'s keyword arguments); yields its status, and
    on exit ``privrec down`` stops every process it started."""
    from privrec import ops

    info = ops.up(settings, state_dir, **up)
    try:
        yield info
    finally:
        ops.down(state_dir)


@contextlib.contextmanager
def start_redis(state_dir: Path, **kw: Any) -> Iterator[ServiceHandle]:
    """A redis-server of its own in ``state_dir`` (``kw``: :func:`pipeline.services.start_redis`'s: ``name``,
    ``port``, ...), stopped on exit."""
    handle = services.start_redis(state_dir, **kw)
    try:
        yield handle
    finally:
        services.stop(handle)


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: ``status`` (0 when nothing answered: refused, reset or timed out), ``body`` (the decoded
    JSON, the text when it is not JSON, ``None`` when empty), ``headers`` and the ``seconds`` it took. It unpacks
    and indexes as ``(status, body)``."""

    status: int
    body: Any
    headers: dict[str, str]
    seconds: float

    def __iter__(self) -> Iterator[Any]:
        return iter((self.status, self.body))

    def __getitem__(self, index: int) -> Any:
        return (self.status, self.body)[index]

    def expect(self, status: int = 200) -> Any:
        """The body, after checking the status."""
        assert self.status == status, f"HTTP {self.status} (expected {status}): {self.body!r}"
        return self.body


def http(method: str, url: str, body: Any = None, *, token: str | None = None,
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> Reply:
    """``method`` ``url``: ``body`` goes as JSON (bytes as they are, for malformed bodies); ``token`` as
    ``Authorization: Bearer``. Never raises for an HTTP status or a dead server: see :class:`Reply`."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {**({} if data is None else {"Content-Type": "application/json"}),
            **({} if token is None else {"Authorization": f"Bearer {token}"}), **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, got = int(resp.status), resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        status, raw, got = int(exc.code), exc.read(), dict(exc.headers)
    except OSError:
        return Reply(0, None, {}, time.monotonic() - t0)
    seconds = time.monotonic() - t0
    if not raw:
        return Reply(status, None, got, seconds)
    try:
        return Reply(status, json.loads(raw), got, seconds)
    except ValueError:
        return Reply(status, raw.decode(errors="replace"), got, seconds)


def synthetic_events(catalog: SyntheticCatalog, n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Valid interactions; about half carry an explicit context (some longer than 1, to be clipped)."""
    rng = random.Random(seed)
    d = catalog.d
    for i in range(n):
        ev: dict[str, Any] = {"event_id": f"e{seed}-{i}", "user": str(rng.randrange(catalog.n_units)),
                              "arm": str(rng.randrange(len(catalog.arm_ids))), "reward": rng.random(),
                              "ts": 1.7e12 + i, "rec_id": None}
        if i % 2:
            ev["context"] = [rng.uniform(-1.0, 1.0) for _ in range(d)]
        if i % 7 == 0:
            ev["reward"] = float(rng.randrange(2))
        yield ev


def shown_as_served(stack: Stack | Sequence[Stack], events: list[dict[str, Any]], *, contexts: bool = True
                    ) -> list[dict[str, Any]]:
    """The events as the stacks' ingest accepts feedback (several stacks: namespaces reading one topic): where a
    model requires a server-issued ``rec_id`` (:func:`pipeline.ingestion.shown_lists.rec_id_required`), each
    feedback event without one answers a one-item list that the harness records as ``GET /recommend`` records it
    (``{ns}:recs:*``, the server's store) in every stack's namespace, so the event carries that ``rec_id`` and
    list. Other events, and every event where no stack requires it, are returned as they are. ``contexts`` false:
    a served feedback drops its own context, as ``POST /feedback`` writes it (its Gram row and its ``b`` are then
    both the item's catalog context, the one-row protocol of the papers' twins)."""
    stacks = [stack] if isinstance(stack, Stack) else list(stack)
    if not any(rec_id_required(st.settings()) for st in stacks):
        return events
    out = []
    with stacks[0].client.pipeline(transaction=False) as pipe:
        for ev in events:
            if (ev.get("rec_id") is None and ev.get("kind", "feedback") != "listen" and "shown" not in ev
                    and isinstance(ev.get("arm"), str) and isinstance(ev.get("user"), str)):
                rec_id = f"harness-{ev['event_id']}"
                for st in stacks:
                    pipe.set(PublicKeys(st.namespace).recommendation(rec_id), json.dumps(
                        {"rec_id": rec_id, "user": ev["user"], "items": [ev["arm"]], "model_version": 0,
                         "ts": 1.7e12}), ex=86400)
                ev = {**ev, "rec_id": rec_id, "shown": [ev["arm"]]}
                if not contexts:
                    ev.pop("context", None)
            out.append(ev)
        pipe.execute()
    return out


def produce(stack: Stack | Sequence[Stack], events: list[dict[str, Any]], *, rate: float | None = None,
            contexts: bool = True) -> list[tuple[int, int, bytes]]:
    """Produce keyed by user (each feedback answering a list the server recorded where a model requires it:
    :func:`shown_as_served`; several stacks on one broker: recorded for each); return ``(partition, offset, value)``
    of each, in send order."""
    events = shown_as_served(stack, events, contexts=contexts)
    prod = (stack if isinstance(stack, Stack) else stack[0]).producer()
    futures = []
    t0 = time.monotonic()
    for i, ev in enumerate(events):
        value = json.dumps(ev).encode()
        futures.append((prod.send("interactions", key=ev["user"].encode(), value=value), value))
        if rate is not None:
            ahead = (i + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    prod.flush()
    out = []
    for fut, value in futures:
        md = fut.get(timeout=30)
        out.append((md.partition, md.offset, value))
    prod.close()
    return out


def offline_stats(catalog: SyntheticCatalog, produced: list[tuple[int, int, bytes]], partitions: int,
                  upto: list[int] | None = None) -> UnitStats:
    """The offline ``models`` computation: per partition in offset order, shards summed in partition order."""
    shards = []
    for p in range(partitions):
        s = UnitStats.zeros(n_units=catalog.n_units, d=catalog.d)
        for part, off, value in sorted(x for x in produced if x[0] == p):
            if upto is not None and off >= upto[p]:
                continue
            one = parse_batch([value], catalog)  # the Gram takes the shown list's items, b the event's context
            if not one.dead:
                s.add_parts(one.units, one.contexts, one.rewards, one.units[one.gram_events], one.gram_contexts)
        shards.append(s)
    return UnitStats.merged(shards)


class ReleaseWatcher:
    """Polls the published release every 20 ms and records each version's ``b_tilde`` bytes; a version published
    twice with different values is an error (it would reveal the exact difference of two statistics)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.seen: dict[int, bytes] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        from models.streaming import ReleasedStats

        while not self._stop.is_set():
            try:
                raw = self.stack.released()
            except redis.exceptions.RedisError:  # Redis down (a fault test): look again later
                raw = {}
            if raw:
                v, b = int(raw[b"version"]), ReleasedStats.from_mapping(raw).b_tilde.tobytes()
                if self.seen.setdefault(v, b) != b:
                    self.errors.append(f"version {v} was published twice with different values")
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def assert_releases_deterministic(stack: Stack, catalog: SyntheticCatalog, produced: list[tuple[int, int, bytes]],
                                  watcher: ReleaseWatcher, algorithm: str) -> list[int]:
    """Every version the watcher saw equals the mechanism's release of the events it covered, recomputed from the
    release log (version -> offsets) and the secret seed; versions are 1, 2, 3, ... Returns them."""
    from models.mechanisms import make_mechanism
    from models.mechanisms.participation import replace_sensitivity
    from models.streaming import Releaser
    from pipeline.release.stages import projection
    from pipeline.state.trusted import TrustedStore

    assert not watcher.errors, watcher.errors
    s = stack.settings()
    store = TrustedStore(stack.client, s.namespace)
    log = [{k.decode(): v.decode() for k, v in fields.items()}
           for _, fields in stack.client.xrange(f"{s.namespace}:released:{{{s.namespace}:rel}}:log")]
    versions = [int(e["version"]) for e in log]
    assert versions == list(range(1, len(log) + 1)), versions  # no version skipped or repeated
    structure, V = projection(algorithm, catalog.W)
    mech = make_mechanism(s.mechanism, dim=catalog.n_units * catalog.d,
                          # replace neighbours: two clipped contributions differ by 2 x b_clip
                          sensitivity=replace_sensitivity(s.clips[0], signed=True) * float(np.linalg.norm(V, axis=0).max()),
                          epsilon=s.epsilon, delta=s.delta,
                          horizon=s.tree_ticks, seed=store.noise_seed(), mixing=V, block_dim=catalog.d)
    releaser = Releaser(structure=structure, V=V, d=catalog.d, mechanism=mech)
    state = mech.init_state()
    expected: dict[int, bytes] = {}
    for entry in log:
        stats = offline_stats(catalog, produced, s.partitions, upto=json.loads(entry["offsets"]))
        rel, state = releaser.release(stats, state, int(entry["version"]))
        expected[rel.version] = rel.b_tilde.tobytes()
    assert watcher.seen
    for v, b in watcher.seen.items():
        assert expected[v] == b, f"published version {v} differs from its deterministic release"
    return versions


class Stream:
    """Events produced in a background thread at ``rate``, with a :class:`ReleaseWatcher` on the releases."""

    def __init__(self, stack: Stack, events: list[dict[str, Any]], rate: float) -> None:
        self.watcher = ReleaseWatcher(stack)
        self.produced: list[tuple[int, int, bytes]] = []
        self._thread = threading.Thread(target=lambda: self.produced.extend(produce(stack, events, rate=rate)))
        self._thread.start()

    def join(self, timeout: float = 60.0) -> None:
        self._thread.join(timeout=timeout)


def assert_exact(stack: Stack, catalog: SyntheticCatalog, produced: list[tuple[int, int, bytes]]) -> UnitStats:
    """The streamed statistics equal the offline computation of the produced events (nothing lost or doubled)."""
    from pipeline.state.trusted import TrustedStore

    s = stack.settings()
    streamed, _ = TrustedStore(stack.client, s.namespace).snapshot(s.partitions, catalog.n_units, catalog.d)
    assert streamed.to_mapping() == offline_stats(catalog, produced, s.partitions).to_mapping()
    return streamed


def produce_synthetic(kafka: str, n: int, seed: int) -> None:
    """``n`` synthetic interactions of the ops tests' world (6 users, d = 5, 40 arms) to ``interactions``."""
    catalog = SyntheticCatalog(n_users=6, d=5, n_arms=40, seed=0)
    prod = KafkaProducer(bootstrap_servers=kafka, linger_ms=5)
    for ev in synthetic_events(catalog, n, seed=seed):
        prod.send("interactions", key=ev["user"].encode(), value=json.dumps(ev).encode())
    prod.flush()
    prod.close()


def admin_url(state_dir: Path) -> str:
    """The Redis URL of a ``privrec up`` stack's administrator (its password from ``redis-users.json``)."""
    from privrec.ops.stackfile import admin_redis_url, read_stack

    stack = read_stack(state_dir)
    assert stack is not None, f"no stack in {state_dir}"
    return admin_redis_url(stack)


def exact_released_count(client: redis.Redis, namespace: str) -> int:
    """Events covered by the namespace's latest release, exactly: the operator's figures under the add/remove
    relation (the released hash then carries the noisy count), else the released hash's count."""
    from pipeline.config.keys import PublicKeys

    keys = PublicKeys(namespace)
    raw = client.hget(keys.release_figures, "count")
    return int(raw if raw is not None else client.hget(keys.released, "count") or 0)


def released_events(redis_url: str, namespace: str) -> int:
    """Events covered by the namespace's latest release (exactly)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return exact_released_count(client, namespace)
    finally:
        client.close()


def alive(pid: int) -> bool:
    """A live process (a zombie counts as gone: PID 1 here does not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def publish_model(redis_url: str, settings: Settings, catalog: SyntheticCatalog, events: int = 30) -> None:
    """One release and its served model in ``settings.namespace``, as the worker makes them (in-process, no
    Kafka): ``events`` interactions ingested, a forced release tick, the solve."""
    from pipeline.ingestion.ingest import IngestProcessor
    from pipeline.release.stages import ReleaseStage, SolveStage

    client = redis.Redis.from_url(redis_url)
    try:
        users, arms = list(catalog.users), list(catalog.arm_ids)
        raw = [json.dumps({"event_id": f"e{i}", "user": users[i % len(users)], "arm": arms[i % len(arms)],
                           "reward": float(i % 2), "ts": 1.7e12 + i}).encode() for i in range(events)]
        IngestProcessor(client, settings.namespace, catalog).process(0, list(enumerate(raw)))
        release = ReleaseStage(settings, catalog, client)
        assert release.tick(force=True) is not None
        assert SolveStage(settings, client, release.statement).run() is not None
    finally:
        client.close()


def lastfm_data_or_skip() -> Path:
    """The HetRec LastFM data directory (``PRIVREC_DATA_DIR`` or the default), or skip the test without it."""
    import pytest

    from producers.lastfm.raw import resolve_data_dir

    try:
        return Path(resolve_data_dir(None))
    except (OSError, ValueError):
        pytest.skip("the HetRec LastFM data directory is not available (set PRIVREC_DATA_DIR)")
