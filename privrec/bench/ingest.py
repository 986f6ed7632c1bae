"""``privrec bench ingest``: end-to-end events/s of one worker against the raw Kafka consume rate.

What it measures, on a stack of its own (Tansu broker, redis-server and one faust worker
started in a temporary state directory with :mod:`pipeline.services`, stopped after):

* **pre-produced** (isolates the worker): N events are produced into ``interactions``
  *before* the worker starts. Raw rates are measured on those very events first:
  aiokafka ``getmany`` of all N from the same topic with the worker's batch size
  (``raw_consume``), the same plus ``json.loads`` of each value (``consume_json``) and plus
  the pipeline's full parser :func:`pipeline.data.records.parse_interaction`
  (``consume_parse``). Then the worker starts and the bench polls Redis every 10 ms: the
  worker's committed ingest offsets (its durable counters, written atomically with the
  statistics) and the released / solved event counts (at user level with the events the cap refused:
  :class:`privrec.bench.observe.Poller`). ``ingest`` rate = events committed
  between the first poll that sees a commit and the last event committed, over that time;
  ``end_to_end`` = the same events until a *solved* model version covers all N.
* **two workers** (``--no-two-workers`` skips it): 3N fresh events pre-produced, then two workers of
  one consumer group (the topic's ``partitions`` split between them). The first worker ingests alone
  until the group settles (~1 s), so the rate counts from the moment both own partitions: while both
  still have events left (``both_busy``, :func:`both_busy_window`) and until all are committed (which
  the partitions' balance caps: events are keyed by user). ``second_worker_share`` = (two - one) / one
  against the pre-produced phase's ingest rate (target >= 0.6), with each process's CPU seconds and
  how many of the 2 cores they kept busy: the second worker competes with the first, the broker and
  redis-server for them.
* **concurrent** (the issue's definition, produce → released model): the worker is
  started and ready on an empty topic; then N events are produced as fast as aiokafka
  goes, from this process, while the worker ingests. ``end_to_end`` = N / (time from the
  first produced event until a solved model covers all N); ``ingest`` = N / (time until
  all N are committed). The producer competes with the worker for the 2 cores, so this
  is lower than the pre-produced rate.

Each phase also records the CPU seconds that the worker, broker, redis-server and this
process used (from ``/proc``; robust to other jobs on a shared machine, unlike wall time)
and the load average. ``--profile`` adds a third run of the pre-produced phase with a
profiler on the worker (py-spy sampling the ingest window when ``py-spy`` is installed,
else cProfile; not used for the rates) and says where the worker's time goes.

Events are 25-dimensional synthetic interactions with an explicit ``context`` (rounded to
4 decimals, norm <= 1, ~320 bytes of JSON, like deploy/NOTES-broker.md), LinUCB, keyed by
user, on 4 partitions.

The workload and raw Kafka rates are in :mod:`privrec.bench.workload`, the observation of
the worker in :mod:`privrec.bench.observe`, the profilers in :mod:`privrec.bench.profiling`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from .observe import Poller, cpu_seconds
from .profiling import cprofile_summary, py_spy_binary, spy_summary, start_py_spy, stop_py_spy
from .workload import TOPIC, consume, produce, rate, synthetic_values

__all__ = ["bench_ingest", "register", "TARGET_EVENTS_PER_S"]

#: Issue 3's target for one worker (LinUCB, d = 25).
TARGET_EVENTS_PER_S = 20_000


@dataclass
class _Env:
    """The bench's own services and settings."""

    state: Path
    settings: Any
    redis_url: str
    handles: dict[str, Any] = field(default_factory=dict)


def _start_worker(env: _Env, kafka: str, namespace: str, *, profile_path: Path | None = None,
                  suffix: str = "") -> Any:
    from pipeline import services
    from privrec.ops import child_env

    settings = env.settings.replace(kafka=kafka, redis_url=env.redis_url, namespace=namespace)
    name = f"worker-{namespace}{suffix}"  # also its id in the workers' status hash
    child = child_env(settings, env.state, loglevel="WARNING") | {"PRIVREC_WORKER_ID": name}
    argv = [sys.executable, "-m", "pipeline.apps.worker"]
    if profile_path is not None:
        argv = [sys.executable, "-m", "cProfile", "-o", str(profile_path), "-m", "pipeline.apps.worker"]
    handle = services.start_process(name, argv, env.state, env=child)
    env.handles[handle.name] = handle
    return handle


def _cpu_snapshot(env: _Env) -> dict[str, float | None]:
    out = {name: cpu_seconds(h.pid) for name, h in env.handles.items()}
    out["bench"] = time.process_time()
    return out


def _cpu_delta(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float]:
    return {k: round(after[k] - v, 2) for k, v in before.items()  # type: ignore[operator]
            if v is not None and after.get(k) is not None}


def _stop(env: _Env, name: str) -> None:
    from pipeline import services

    handle = env.handles.pop(name, None)
    if handle is not None:
        services.stop(handle, grace_seconds=20)


def _phase_preproduced(env: _Env, values: list[tuple[bytes, bytes]], tag: str, *, raw: bool,
                       profile_path: Path | None = None, spy_path: Path | None = None,
                       timeout: float = 600) -> dict[str, Any]:
    from pipeline import services

    n = len(values)
    s = env.settings
    broker = services.start_broker(env.state, name=f"kafka-{tag}")
    env.handles[broker.name] = broker
    try:
        services.create_topics(broker.address, {TOPIC: s.partitions, "dead-letters": 1, "recommendations": 1})
        produce_s = asyncio.run(produce(broker.address, values))
        out: dict[str, Any] = {"what": "events produced before the worker starts; rates over the worker's own "
                                       "processing (first commit seen -> all committed / model covers all)",
                               "events": n, "produce_events_per_s": rate(n, produce_s)}
        if raw:
            for work, key in (("none", "raw_consume"), ("json", "consume_json"), ("parse", "consume_parse")):
                secs = asyncio.run(consume(broker.address, n, s, work))
                out[f"{key}_events_per_s"] = rate(n, secs)
        ns = f"bench{tag}"
        t_spawn = time.perf_counter()
        cpu0 = _cpu_snapshot(env)
        worker = _start_worker(env, broker.address, ns, profile_path=profile_path)
        cpu0[worker.name] = 0.0
        poller = Poller(env.redis_url, ns, s.partitions, pid=worker.pid)
        poller.start()
        spy = None
        try:
            if spy_path is not None:  # sample the ingest only: from the first commit to the last
                poller.wait(lambda x: x[1] >= 1, timeout, "the first commit")
                spy = start_py_spy(worker.pid, spy_path)
            poller.wait(lambda x: x[1] >= n, timeout, f"all {n} events ingested")
            if spy is not None:
                stop_py_spy(spy)
                spy = None
            poller.wait(lambda x: x[3] >= n, timeout, f"a solved model covering all {n} events")
            cpu1 = _cpu_snapshot(env)
        finally:
            if spy is not None:
                stop_py_spy(spy)
            poller.stop()
        first = poller.first(1, 1)
        assert first is not None
        t_first, c_first, cpu_first = first
        t_ingested, _, cpu_ingested = poller.first(1, n)  # type: ignore[misc]
        t_released = poller.first(2, n)[0]  # type: ignore[index]
        t_solved = poller.first(3, n)[0]  # type: ignore[index]
        counted = n - c_first
        out.update({
            "spawn_to_first_commit_s": round(t_first - t_spawn, 3),
            "events_in_first_commit_seen": c_first,
            "ingest_events_per_s": rate(counted, t_ingested - t_first),
            "released_events_per_s": rate(counted, t_released - t_first),
            "refused_events": poller.refused,  # user level: at the cap (in the released and solved counts)
            "end_to_end_events_per_s": rate(counted, t_solved - t_first),
            "ingest_s": round(t_ingested - t_first, 3),
            "ingested_to_released_s": round(t_released - t_ingested, 3),
            "released_to_solved_s": round(t_solved - t_released, 3),
            "cpu_seconds": _cpu_delta(cpu0, cpu1),
            "timeline": poller.timeline(t_first),
        })
        # worker CPU between the first commit seen and the last: ingest work only, no start-up
        # (None when the first commit already held every event: a loaded machine or a tiny --events; no rate then)
        out["worker_cpu_us_per_event"] = round((cpu_ingested - cpu_first) / counted * 1e6, 1) if counted > 0 else None
        out["worker_cpu_share_while_ingesting"] = (round((cpu_ingested - cpu_first) / (t_ingested - t_first), 3)
                                                   if t_ingested > t_first else None)
        _stop(env, f"worker-{ns}")
        return out
    finally:
        _stop(env, f"worker-bench{tag}")
        _stop(env, broker.name)


def _phase_two_workers(env: _Env, values: list[tuple[bytes, bytes]], tag: str, *, timeout: float = 600) -> dict[str, Any]:
    """Pre-produced events, two workers of one consumer group: the rate from the moment both own partitions
    (the group has settled; the first to start may ingest alone until then) until every event is committed."""
    import redis

    from pipeline import services
    from privrec.ops import wait_workers

    n = len(values)
    s = env.settings
    broker = services.start_broker(env.state, name=f"kafka-{tag}")
    env.handles[broker.name] = broker
    ns = f"bench{tag}"
    names: list[str] = []
    try:
        services.create_topics(broker.address, {TOPIC: s.partitions, "dead-letters": 1, "recommendations": 1})
        asyncio.run(produce(broker.address, values))
        cpu0 = _cpu_snapshot(env)
        workers = [_start_worker(env, broker.address, ns, suffix=f"-{i}") for i in range(2)]
        names = [w.name for w in workers]
        for w in workers:
            cpu0[w.name] = 0.0
        poller = Poller(env.redis_url, ns, s.partitions)
        poller.start()
        per_partition_samples = _PartitionSampler(env.redis_url, poller.offset_keys, {w.name: w.pid for w in workers})
        per_partition_samples.start()
        try:
            client = redis.Redis.from_url(env.redis_url)
            assigned = wait_workers(client, ns, workers, s.partitions, timeout=120)
            client.close()
            last = poller.sample()  # the moment the group has settled
            t_both, c_both = last[0], last[1]
            cpu_both, t_cpu_both = _cpu_snapshot(env), time.perf_counter()
            poller.wait(lambda x: x[1] >= n, timeout, f"all {n} events ingested by two workers")
            cpu1, t_cpu1 = _cpu_snapshot(env), time.perf_counter()
            per_partition_samples.stop()
            poller.wait(lambda x: x[3] >= n, timeout, f"a solved model covering all {n} events (two workers)")
        finally:
            per_partition_samples.stop()
            poller.stop()
        busy = both_busy_window(per_partition_samples.samples, assigned, t_both)
        t_ingested = poller.first(1, n)[0]  # type: ignore[index]
        t_solved = poller.first(3, n)[0]  # type: ignore[index]
        counted = n - c_both
        # the topic starts empty: each partition's committed offset is its number of events
        client = redis.Redis.from_url(env.redis_url)
        per_partition = [int(v or 0) for v in client.mget(poller.offset_keys)]
        client.close()
        busiest = max(sum(per_partition[p] for p in ps) for ps in assigned.values()) / max(1, sum(per_partition))
        return {"what": "events produced before two workers of one consumer group start; ingest rates from the "
                        "moment both own partitions: while both have events left (both_busy, the share's basis), "
                        "and until all are committed (ingest_events_per_s, bounded by the partitions' balance)",
                "both_busy": busy,
                "events": n, "events_after_both_assigned": counted, "partitions": assigned,
                "events_per_partition": per_partition, "busiest_worker_share_of_events": round(busiest, 3),
                "share_bound_from_balance": round(1 / busiest - 1, 3),
                "ingest_events_per_s": rate(counted, t_ingested - t_both) if counted > 0 else None,
                "end_to_end_events_per_s": rate(counted, t_solved - t_both) if counted > 0 else None,
                "ingest_s": round(t_ingested - t_both, 3),
                "end_to_end_note": "not comparable with one worker's end-to-end rate: another number of events "
                                   "over the same fixed release tick",
                "cpu_seconds": _cpu_delta(cpu0, cpu1),
                "while_both_ingest": cpu_use(_cpu_delta(cpu_both, cpu1), t_cpu1 - t_cpu_both),
                "note": "on 2 cores the second worker competes with the first, the broker, redis-server and this "
                        "process for the same cores (while_both_ingest.cpu_busy_cores near 2 means the machine, not "
                        "the pipeline, bounds the share); cpu_seconds cover the whole phase, start-up included"}
    finally:
        for name in names:
            _stop(env, name)
        _stop(env, broker.name)


class _PartitionSampler:
    """Every 10 ms: the committed offset of each partition and the CPU seconds of each worker, in a thread."""

    def __init__(self, redis_url: str, offset_keys: list[str], pids: dict[str, int]) -> None:
        import redis

        self.client = redis.Redis.from_url(redis_url)
        self.offset_keys, self.pids = offset_keys, pids
        self.samples: list[tuple[float, list[int], dict[str, float]]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-partition-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            offsets = [int(v or 0) for v in self.client.mget(self.offset_keys)]
            cpu = {name: cpu_seconds(pid) or 0.0 for name, pid in self.pids.items()}
            self.samples.append((time.perf_counter(), offsets, cpu))
            time.sleep(0.01)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self.thread.join()
            self.client.close()


def both_busy_window(samples: list[tuple[float, list[int], dict[str, float]]], assigned: dict[str, list[int]],
                     t_start: float, *, min_seconds: float = 0.2) -> dict[str, Any] | None:
    """The ingest rate while every worker still has events to commit: from ``t_start`` (the group has settled)
    until the first sample where one worker's partitions reach their final offsets.

    The first worker to start ingests alone until the group settles, and which partitions it has drained by
    then is chance; after that, a worker with little left idles while the other finishes. Over this window
    both work, so its rate is what two workers ingest, whatever the balance of the partitions. ``None`` when
    the window is shorter than ``min_seconds``.

    Parameters
    ----------
    samples
        ``(time, committed offset per partition, CPU seconds per worker)``, in time order; the last is final.
    assigned
        Partitions of each worker.
    t_start
        When both own partitions.

    >>> s = [(0.0, [0, 0], {"a": 0.0, "b": 0.0}), (1.0, [100, 50], {"a": 0.9, "b": 0.5}),
    ...      (2.0, [200, 100], {"a": 1.8, "b": 1.0}), (3.0, [200, 300], {"a": 1.8, "b": 1.9})]
    >>> both_busy_window(s, {"a": [0], "b": [1]}, 0.5)
    {'events': 150, 'seconds': 1.0, 'events_per_s': 150.0, 'cpu_seconds': {'a': 0.9, 'b': 0.5}, 'ended_by': 'a'}
    >>> both_busy_window(s, {"a": [0], "b": [1]}, 1.9) is None  # 'a' is done at the first sample after 1.9
    True
    """
    after = [x for x in samples if x[0] >= t_start]
    if not after:
        return None
    final = samples[-1][1]
    done = {w: sum(final[p] for p in ps) for w, ps in assigned.items()}
    start = after[0]
    for t, offsets, cpu in after:
        ended = [w for w, ps in assigned.items() if sum(offsets[p] for p in ps) >= done[w]]
        if ended:
            break
    seconds = t - start[0]
    if seconds < min_seconds:
        return None
    events = sum(offsets) - sum(start[1])
    return {"events": events, "seconds": round(seconds, 3), "events_per_s": rate(events, seconds),
            "cpu_seconds": {w: round(cpu[w] - start[2][w], 2) for w in assigned if w in cpu and w in start[2]},
            "ended_by": ended[0]}


def cpu_use(cpu_seconds: dict[str, float], wall_s: float) -> dict[str, Any]:
    """CPU seconds per process over a window of ``wall_s`` seconds, their sum, and how many cores that kept busy.

    >>> cpu_use({"worker-0": 1.5, "worker-1": 1.0, "redis": 0.5}, 2.0)
    {'cpu_seconds': {'worker-0': 1.5, 'worker-1': 1.0, 'redis': 0.5}, 'cpu_seconds_total': 3.0, 'wall_s': 2.0, 'cpu_busy_cores': 1.5}
    """
    if wall_s <= 0:
        raise ValueError(f"`wall_s` must be positive, got {wall_s}.")
    total = round(sum(cpu_seconds.values()), 2)
    return {"cpu_seconds": cpu_seconds, "cpu_seconds_total": total, "wall_s": round(wall_s, 3),
            "cpu_busy_cores": round(total / wall_s, 2)}


def second_worker_share(one: float | None, two: float | None) -> float | None:
    """What the second worker adds, as a share of the first's rate: ``(two - one) / one``.

    >>> second_worker_share(100.0, 160.0), second_worker_share(100.0, 90.0), second_worker_share(None, 5.0)
    (0.6, -0.1, None)
    """
    if not one or two is None:
        return None
    return round((two - one) / one, 3)


def _phase_concurrent(env: _Env, values: list[tuple[bytes, bytes]], tag: str, *, timeout: float = 600) -> dict[str, Any]:
    import redis

    from pipeline import services
    from privrec.ops import wait_workers

    n = len(values)
    s = env.settings
    broker = services.start_broker(env.state, name=f"kafka-{tag}")
    env.handles[broker.name] = broker
    ns = f"bench{tag}"
    try:
        services.create_topics(broker.address, {TOPIC: s.partitions, "dead-letters": 1, "recommendations": 1})
        worker = _start_worker(env, broker.address, ns)
        client = redis.Redis.from_url(env.redis_url)
        wait_workers(client, ns, [worker], s.partitions, timeout=120)
        client.close()
        time.sleep(1.0)  # let the first (empty) release tick pass
        poller = Poller(env.redis_url, ns, s.partitions, pid=worker.pid)
        poller.start()
        try:
            cpu0 = _cpu_snapshot(env)
            started = threading.Event()
            t_before = time.perf_counter()
            produce_s = asyncio.run(produce(broker.address, values, started))
            t_produced = time.perf_counter()
            poller.wait(lambda x: x[3] >= n, timeout, f"a solved model covering all {n} events")
            cpu1 = _cpu_snapshot(env)
        finally:
            poller.stop()
        t0 = t_produced - produce_s  # the first send
        t_ingested = poller.first(1, n)[0]  # type: ignore[index]
        t_released = poller.first(2, n)[0]  # type: ignore[index]
        t_solved = poller.first(3, n)[0]  # type: ignore[index]
        out: dict[str, Any] = {
            "what": "worker ready on an empty topic, then N events produced from the bench process while it "
                    "ingests; rates from the first produced event",
            "events": n,
            "producer_start_s": round(t0 - t_before, 3),
            "produce_events_per_s": rate(n, produce_s),
            "ingest_events_per_s": rate(n, t_ingested - t0),
            "released_events_per_s": rate(n, t_released - t0),
            "end_to_end_events_per_s": rate(n, t_solved - t0),
            "produce_s": round(produce_s, 3),
            "ingest_s": round(t_ingested - t0, 3),
            "ingested_to_released_s": round(t_released - t_ingested, 3),
            "released_to_solved_s": round(t_solved - t_released, 3),
            "cpu_seconds": _cpu_delta(cpu0, cpu1),
            "timeline": poller.timeline(t0),
        }
        wcpu = out["cpu_seconds"].get(worker.name)
        if wcpu:
            out["worker_cpu_us_per_event"] = round(wcpu / n * 1e6, 1)
        return out
    finally:
        _stop(env, f"worker-{ns}")
        _stop(env, broker.name)


@contextlib.contextmanager
def _services(keep: bool) -> Iterator[tuple[Path, Any]]:
    from pipeline import services

    state = Path(tempfile.mkdtemp(prefix="privrec-bench-ingest-"))
    try:
        rds = services.start_redis(state, appendonly=True)
        yield state, rds
    finally:
        services.stop_all(state, grace_seconds=20)
        if not keep:
            shutil.rmtree(state, ignore_errors=True)


def bench_ingest(*, events: int = 200_000, n_users: int = 10, d: int = 25, batch_size: int | None = None,
                 tick_seconds: float | None = None, concurrent: bool = True, profile_dir: Path | None = None,
                 keep: bool = False, say: Any = None, algorithm: str = "linucb", two_workers: bool = True
                 ) -> dict[str, Any]:
    """Run the benchmark (see the module docstring) and return the JSON document.

    Parameters
    ----------
    events
        N, events per phase.
    n_users
        Users of the synthetic catalog (one LinUCB unit each).
    d
        Context dimension.
    batch_size, tick_seconds
        Override the pipeline settings of the same name (``None``: the defaults).
    concurrent
        Also run the concurrent produce+ingest phase.
    profile_dir
        If given, also run the pre-produced phase with the worker under cProfile and write
        ``worker.prof`` there (its rates are not comparable: cProfile slows Python down).
    keep
        Keep the temporary state directory (logs) instead of deleting it.
    say
        Called with progress lines.
    algorithm
        ``linucb`` (default), ``colin`` or ``goblin``: what the release and solve stages run (CoLin and GOB.Lin with
        the flat model, which is theirs).
    two_workers
        Also ingest 3N events with two workers of one consumer group (``two_workers``; from the moment both own
        partitions) and report what the second adds (``summary["second_worker_share"]``; target >= 0.6 of the
        first's rate), with the bound the partitions' balance sets (events are keyed by user).
    """
    from pipeline.config.settings import Settings
    from privrec.experiments.runner import machine_info

    note = say or (lambda _l: None)
    changes: dict[str, Any] = {"algorithm": algorithm, "catalog": "synthetic", "d": d, "n_users": n_users}
    if algorithm != "linucb":  # CoLin and GOB.Lin pool through their graph: the flat model (the hierarchy is LinUCB's)
        changes["model"] = "flat"
    if batch_size is not None:
        changes["batch_size"] = batch_size
    if tick_seconds is not None:
        changes["tick_seconds"] = tick_seconds
    settings = Settings.from_mapping({}, environ={}).replace(**changes)
    note(f"generating {events} events (d = {d}, {n_users} users)")
    values = synthetic_values(events, n_users=n_users, d=d, n_arms=settings.n_arms)
    doc: dict[str, Any] = {"target_events_per_s": TARGET_EVENTS_PER_S}
    load_before = os.getloadavg()
    with _services(keep) as (state, rds):
        env = _Env(state, settings, rds.url, {rds.name: rds})
        note("pre-produced phase: produce, raw consume x3, then the worker")
        doc["preproduced"] = _phase_preproduced(env, values, "a", raw=True)
        if two_workers:  # 3N fresh events: the group takes ~1 s to settle, while the first worker ingests alone
            note(f"two-worker phase: produce {3 * events} events, then two workers of one consumer group")
            more = synthetic_values(3 * events, n_users=n_users, d=d, n_arms=settings.n_arms, seed=1)
            doc["two_workers"] = _phase_two_workers(env, more, "w")
            del more
        if concurrent:
            note("concurrent phase: worker ready, then produce while it ingests")
            doc["concurrent"] = _phase_concurrent(env, values, "b")
        if profile_dir is not None:
            profile_dir.mkdir(parents=True, exist_ok=True)
            if py_spy_binary() is not None:
                raw_path = profile_dir.resolve() / "worker.py-spy.raw"
                note(f"profiled phase: py-spy on the worker during ingest -> {raw_path}")
                prof_doc = _phase_preproduced(env, values, "p", raw=False, spy_path=raw_path)
                summary = spy_summary(raw_path) if raw_path.exists() else None
            else:
                prof = profile_dir.resolve() / "worker.prof"
                note(f"profiled phase: py-spy not found (pip install py-spy); the worker under cProfile -> {prof}")
                prof_doc = _phase_preproduced(env, values, "p", raw=False, profile_path=prof)
                summary = cprofile_summary(prof) if prof.exists() else None
            doc["profiled"] = {"note": "a separate pre-produced run with a profiler attached: its rates are "
                                       "not the benchmark's",
                               "ingest_events_per_s": prof_doc["ingest_events_per_s"],
                               "worker_cpu_us_per_event": prof_doc["worker_cpu_us_per_event"],
                               "profile": summary}
        if keep:
            doc["state_dir"] = str(state)
    pre = doc["preproduced"]
    raw = pre["raw_consume_events_per_s"]
    doc["summary"] = {
        "end_to_end_events_per_s": pre["end_to_end_events_per_s"],
        "ingest_events_per_s": pre["ingest_events_per_s"],
        "raw_consume_events_per_s": raw,
        "ratio_end_to_end_to_raw": _ratio(pre["end_to_end_events_per_s"], raw, 4),
        "ratio_ingest_to_raw": _ratio(pre["ingest_events_per_s"], raw, 4),
        "concurrent_end_to_end_events_per_s": doc.get("concurrent", {}).get("end_to_end_events_per_s"),
        # robust to other jobs on the machine: what one fully available core would ingest
        "worker_cpu_us_per_event": pre["worker_cpu_us_per_event"],
        "ingest_events_per_worker_cpu_second": round(1e6 / pre["worker_cpu_us_per_event"])
        if pre["worker_cpu_us_per_event"] else None,
        "worker_cpu_share_while_ingesting": pre["worker_cpu_share_while_ingesting"],
        "consume_json_events_per_s": pre.get("consume_json_events_per_s"),
        "ratio_end_to_end_to_consume_json": _ratio(pre["end_to_end_events_per_s"], pre.get("consume_json_events_per_s"),
                                                   3),
        "ratio_ingest_to_consume_json": _ratio(pre["ingest_events_per_s"], pre.get("consume_json_events_per_s"), 3),
        "two_workers_ingest_events_per_s": (doc.get("two_workers", {}).get("both_busy") or {}).get("events_per_s"),
        "two_workers_ingest_until_all_events_per_s": doc.get("two_workers", {}).get("ingest_events_per_s"),
        "two_workers_end_to_end_events_per_s": doc.get("two_workers", {}).get("end_to_end_events_per_s"),
        "two_workers_share_bound_from_balance": doc.get("two_workers", {}).get("share_bound_from_balance"),
        "two_workers_cpu_busy_cores": doc.get("two_workers", {}).get("while_both_ingest", {}).get("cpu_busy_cores"),
        "second_worker_share_of": "ingest rates (committed offsets): one worker's pre-produced phase vs two workers "
                                  "while both have events left (two_workers.both_busy); _until_all: until all "
                                  "are committed, bounded by the partitions' balance",
        "second_worker_share": second_worker_share(
            pre["ingest_events_per_s"], (doc.get("two_workers", {}).get("both_busy") or {}).get("events_per_s")),
        "second_worker_share_until_all": second_worker_share(pre["ingest_events_per_s"],
                                                             doc.get("two_workers", {}).get("ingest_events_per_s")),
        "targets": {"ratio_end_to_end_to_consume_json": 0.5, "second_worker_share": 0.6},
        "meets_target": bool(pre["end_to_end_events_per_s"] and pre["end_to_end_events_per_s"] >= TARGET_EVENTS_PER_S),
        "which": "preproduced (events in the topic before the worker starts); see `concurrent` for produce+ingest",
    }
    doc["settings"] = {**settings.model_config(), "batch_size": settings.batch_size,
                       "batch_seconds": settings.batch_seconds, "tick_seconds": settings.tick_seconds,
                       "events": events, "event_bytes_mean": round(sum(len(v) for _, v in values) / len(values), 1),
                       "context": "explicit, 25 floats rounded to 4 decimals, norm <= 1",
                       "client": "aiokafka (worker and raw consume), getmany max_records = batch_size",
                       "workers": 1}
    doc["machine"] = machine_info() | {"loadavg_before": [round(x, 2) for x in load_before],
                                       "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    return doc


def _ratio(a: float | None, b: float | None, digits: int) -> float | None:
    """``a / b`` rounded, ``None`` when either is unknown (``None``) or ``b`` is 0.

    >>> _ratio(1.0, 3.0, 3), _ratio(None, 3.0, 3), _ratio(1.0, 0.0, 3)
    (0.333, None, None)
    """
    return round(a / b, digits) if a is not None and b else None


def _num(value: float | None, spec: str = ">10,.0f") -> str:
    """``value`` formatted, or ``n/a`` (right-aligned like the numbers) when it was not measurable.

    >>> _num(1234.5), _num(None), _num(0.5, ".3f"), _num(None, ".3f")
    ('     1,234', '       n/a', '0.500', 'n/a')
    """
    return format(value, spec) if value is not None else format("n/a", ">10" if spec.startswith(">10") else "")


def _print(doc: dict[str, Any]) -> None:
    pre, sm = doc["preproduced"], doc["summary"]
    print(f"pre-produced ({pre['events']} events in the topic before the worker starts):")
    if pre["ingest_events_per_s"] is None:
        print(f"  (the worker's first commit already held {pre['events_in_first_commit_seen']:,} of the "
              f"{pre['events']:,} events: no ingest rate to measure; run more --events or on a quieter machine)")
    print(f"  end-to-end (first commit -> solved model covers all): {_num(sm['end_to_end_events_per_s'])} ev/s")
    print(f"  ingest only (worker's committed offsets):             {_num(sm['ingest_events_per_s'])} ev/s")
    print(f"  raw consume, aiokafka getmany (same events, topic):   {_num(sm['raw_consume_events_per_s'])} ev/s")
    print(f"  raw consume + json.loads:                             {_num(pre['consume_json_events_per_s'])} ev/s")
    print(f"  raw consume + parse_interaction:                      {_num(pre['consume_parse_events_per_s'])} ev/s")
    print(f"  ratio end-to-end / raw: {_num(sm['ratio_end_to_end_to_raw'], '.3f')}   ingest / raw: "
          f"{_num(sm['ratio_ingest_to_raw'], '.3f')}")
    if sm["ingest_events_per_worker_cpu_second"] is None:  # a run shorter than the CPU clock's tick (10 ms)
        print(f"  worker CPU per event: not measurable (the worker's CPU time did not move while it ingested: "
              f"below the CPU clock's 10 ms resolution); cpu seconds {pre['cpu_seconds']}")
    else:
        print(f"  worker CPU per event: {pre.get('worker_cpu_us_per_event')} µs = "
              f"{sm['ingest_events_per_worker_cpu_second']:,} events per worker CPU-second; the worker had "
              f"{pre['worker_cpu_share_while_ingesting']:.0%} of a core (load average "
              f"{doc['machine']['loadavg_before'][0]}); cpu seconds {pre['cpu_seconds']}")
    if "concurrent" in doc:
        c = doc["concurrent"]
        print(f"concurrent (produce {c['events']} events while the worker ingests):")
        print(f"  end-to-end (first produced -> solved model covers all): {_num(c['end_to_end_events_per_s'])} ev/s")
        print(f"  ingest (first produced -> all committed):              {_num(c['ingest_events_per_s'])} ev/s")
        print(f"  produce (aiokafka, from the bench process):            {_num(c['produce_events_per_s'])} ev/s")
        if c.get("worker_cpu_us_per_event"):
            print(f"  worker CPU per event: {c['worker_cpu_us_per_event']} µs")
    print(f"  end-to-end / (consume + json.loads): {_num(sm['ratio_end_to_end_to_consume_json'], '.3f')} (target >= "
          f"0.5: {'met' if (sm['ratio_end_to_end_to_consume_json'] or 0) >= 0.5 else 'MISSED'}); ingest only / "
          f"(consume + json.loads): {_num(sm['ratio_ingest_to_consume_json'], '.3f')}")
    if "two_workers" in doc:
        t = doc["two_workers"]
        share = sm["second_worker_share"]
        print(f"two workers, one consumer group ({t['events_after_both_assigned']:,} events after both own partitions "
              f"{t['partitions']}):")
        busy = t.get("both_busy") or {}
        print(f"  ingest while both have events left: {busy.get('events_per_s') or float('nan'):>10,.0f} ev/s "
              f"({busy.get('events', 0):,} events in {busy.get('seconds', float('nan'))} s, worker CPU seconds "
              f"{busy.get('cpu_seconds')}) against one worker's {_num(sm['ingest_events_per_s'], ',.0f')}: the "
              f"second adds "
              f"{share if share is not None else float('nan'):.2f} of the first's rate (target >= 0.6: "
              f"{'met' if share is not None and share >= 0.6 else 'MISSED'})")
        until = sm.get("second_worker_share_until_all")
        print(f"  ingest until all are committed: {t['ingest_events_per_s'] or float('nan'):>10,.0f} ev/s: "
              f"{until if until is not None else float('nan'):.2f} of the first's rate")
        print(f"  end-to-end (both own partitions -> solved model covers all): "
              f"{t.get('end_to_end_events_per_s') or float('nan'):,.0f} ev/s (not comparable with one worker's: "
              f"another number of events over the same fixed release tick)")
        if "while_both_ingest" in t:
            w = t["while_both_ingest"]
            print(f"  while both ingest: cpu seconds {w['cpu_seconds']} = {w['cpu_seconds_total']} s in {w['wall_s']} s:"
                  f" {w['cpu_busy_cores']} of the machine's {os.cpu_count()} cores busy (the second worker competes "
                  f"with the first, the broker and redis-server for them); whole phase {t['cpu_seconds']}")
        print(f"  events per partition {t['events_per_partition']}: the busier worker has "
              f"{t['busiest_worker_share_of_events']:.0%} of them, so the second worker can add at most "
              f"{t['share_bound_from_balance']:.2f} (keys are users: more users balance the partitions)")
    prof = doc.get("profiled", {}).get("profile")
    if prof and "main_thread_categories" in prof:
        print(f"where the worker's time goes while ingesting ({prof['tool']}):")
        print(f"  busy samples per thread (s): {prof['threads']}")
        for row in prof["main_thread_categories"]:
            print(f"  {row['share']:6.1%}  {row['seconds']:6.2f} s  {row['category']}")
    elif prof:
        print("profile (worker main thread, cProfile), top by own time:")
        for row in prof["by_tottime"][:12]:
            print(f"  {row['tottime_s']:8.2f} s  {row['calls']:>9}  {row['function']}")
    verdict = "meets" if sm["meets_target"] else "is BELOW"
    print(f"target {doc['target_events_per_s']:,} ev/s on one worker: end-to-end {verdict} it")


def register(bsub: Any) -> None:
    p = bsub.add_parser("ingest", help="end-to-end events/s of one worker vs the raw Kafka consume rate",
                        description=__doc__.split("\n\n")[0] + " Writes ingest.json to --out.")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--events", type=int, default=200_000, help="events per phase (default 200000)")
    p.add_argument("--users", type=int, default=10, help="users of the synthetic catalog (default 10)")
    p.add_argument("--d", type=int, default=25, help="context dimension (default 25)")
    p.add_argument("--batch-size", type=int, default=None, help="worker batch size (default: the setting's)")
    p.add_argument("--tick-seconds", type=float, default=None, help="release tick (default: the setting's)")
    p.add_argument("--no-concurrent", action="store_true", help="skip the concurrent produce+ingest phase")
    p.add_argument("--no-two-workers", action="store_true", help="skip the two-worker phase")
    p.add_argument("--algorithm", choices=("linucb", "colin", "goblin"), default="linucb",
                   help="the model the release and solve stages run (default linucb; colin and goblin run the flat "
                        "model)")
    p.add_argument("--profile", action="store_true",
                   help="also profile the worker in a separate pre-produced run: py-spy if installed "
                        "(pip install py-spy; writes worker.py-spy.raw), else cProfile (worker.prof)")
    p.add_argument("--keep", action="store_true", help="keep the temporary state directory (logs)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.events < 1000:
        raise ValueError(f"`--events` must be at least 1000, got {args.events}.")
    if args.users < 1 or args.d < 1:
        raise ValueError(f"`--users` and `--d` must be positive, got {args.users} and {args.d}.")
    doc = bench_ingest(events=args.events, n_users=args.users, d=args.d, batch_size=args.batch_size,
                       tick_seconds=args.tick_seconds, concurrent=not args.no_concurrent,
                       profile_dir=args.out if args.profile else None, keep=args.keep, algorithm=args.algorithm,
                       two_workers=not args.no_two_workers, say=lambda line: print(f"bench ingest: {line}", file=sys.stderr, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ingest.json").write_text(json.dumps(doc, indent=2) + "\n")
    _print(doc)
    print(f"wrote {args.out}/ingest.json", file=sys.stderr)
    return 0
