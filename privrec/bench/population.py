"""``privrec bench population``: what each user costs the live default stack as the population grows.

What it drives: the default stack, as ``privrec up`` starts it (:func:`privrec.bench.serve.local_stack`: the
embedded Tansu broker, redis-server, one worker or more (``--workers``), the web server), with every privacy and
model setting at its default: user level, the hierarchy in global mode, the add/remove relation, ``user_cap`` 1, the 1 s release tick.
The one choice made here is the catalog: a generated catalog directory (1,000 items with features, ``d = 25``,
100 units, no users file), so that any user id is welcome (``SHA-256(user) mod n_units``, the open world of
:mod:`pipeline.data.catalog_open`) and N distinct users need no catalog of N users.

How: users ``u0000000``, ``u0000001``, ... arrive in *waves* of ``active`` users; each user sends 3 to 5
events (``--events-per-user``) produced back to back with kafka-python (large batches, ``linger_ms``) straight
to ``interactions``, in the format ingest accepts (no ``context``: the arm's features; no ``rec_id``: the
hierarchy takes none, :func:`pipeline.ingestion.shown_lists.rec_id_required`). The bench waits until the exact
released count (the operator's figures, ``{ns}:ledger:{ns:rel}:figures``) covers the wave before the next one,
so a user's events are ingested together and take part in one tick (``user_cap`` 1: a later tick's events would
be capped by design). At each size N of ``--sizes`` (a running total: the population grows from one size to the
next), measured at rest (the waves' events released, two more ticks done):

* ``ingest_events_per_s``: the worker's rate on a backlog, from its committed offsets polled every 5 ms: each wave is
  produced while the workers are stopped (``SIGSTOP``, continued once the wave is in the topic), and the rate is the
  events committed after the first commit seen over the time until the last (a wave that one commit takes whole:
  its events over the time from the resume to that commit, a lower bound; the release ticks run beside it, as
  they do in service; the bench's producer does not); ``send_to_committed_events_per_s``: the size's new events over
  the time from each wave's first send until the committed offsets cover it (production included); and
  ``consume_json_events_per_s``: aiokafka ``getmany`` + ``json.loads`` of the whole topic (every event so far)
  in the same run, the worker idle; ``ingest_ratio`` is their quotient;
* Redis ``used_memory`` and the memory of each kind of key (``MEMORY USAGE``), the worker's and web server's RSS;
* every release tick's wall time from the leader's tick log (:attr:`pipeline.config.keys.PublicKeys.tick_log`:
  fold, ledger figures, release, solve) with the users it folded; p50/p99 per band of users folded per tick
  (around 1k, 10k, 100k) and a least-squares fit ``tick_s = a + b * folded + c * N``;
* ``/recommend`` latency (p50/p99) for users never seen before, ``/budget`` (public and the operator's view),
  ``/budget/history`` and ``/dashboard``.

Across sizes: ``redis_marginal_bytes_per_user`` is the slope of ``used_memory`` at rest (less the shown lists of the
bench's own ``/recommend`` requests) between the two largest sizes (per user; per event: over the events those users sent). Headline figures: ``redis_marginal_bytes_per_user``,
``ingest_ratio`` (at the largest size), ``tick_p99_s`` (ticks folding about 10k users; else the fit at 10k
users and the largest N, said in ``tick_p99_basis``) and ``lost_events`` (produced minus released, exactly).
``capped_events`` are the part of them the cap refused by design: a user whose events straddle a fold (ingest took
some before the leader's tick, the rest after) has taken part in that tick, and ``user_cap`` 1 keeps the rest out of
the epoch's statistics; ``unaccounted_events`` (lost, not capped) must be 0.
Writes ``population.json`` and ``population.png`` (cost against N).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["bench_population", "register", "HEADLINE", "tick_bands", "marginal"]

#: The figures a script reads from ``population.json``.
HEADLINE = ("redis_marginal_bytes_per_user", "ingest_ratio", "tick_p99_s", "lost_events")
#: Users folded per tick around which tick times are summarised.
TICK_BANDS = (1_000, 10_000, 100_000)
#: Catalog of the bench: items, dimension and units (a generated catalog directory).
N_ITEMS, D, N_UNITS = 1000, 25, 100


def tick_bands(ticks: list[dict[str, Any]], bands: tuple[int, ...] = TICK_BANDS) -> dict[str, Any]:
    """p50/p99 of the tick wall time over the ticks that folded between half and twice each band's users (a tick
    the bench stopped midway, ``paused``, is left out: its wall time holds the pause).

    >>> t = [{"folded": 900, "tick_s": 0.1}, {"folded": 1100, "tick_s": 0.3}, {"folded": 30, "tick_s": 0.05},
    ...      {"folded": 1000, "tick_s": 2.5, "paused": True}]
    >>> tick_bands(t, (1000, 10000))["1000"]["ticks"], tick_bands(t, (1000, 10000))["10000"]
    (2, None)
    """
    out: dict[str, Any] = {}
    for band in bands:
        times = [t["tick_s"] for t in ticks if band / 2 <= t.get("folded", 0) <= 2 * band and not t.get("paused")]
        out[str(band)] = None if not times else {
            "ticks": len(times), "p50_s": round(float(np.percentile(times, 50)), 4),
            "p99_s": round(float(np.percentile(times, 99)), 4), "max_s": round(max(times), 4)}
    return out


def marginal(rows: list[dict[str, Any]], field: str, per: str = "users") -> float | None:
    """Slope of ``field`` against ``per`` between the last two rows (``None`` with fewer than two).

    >>> marginal([{"users": 100, "m": 5000}, {"users": 300, "m": 9000}], "m")
    20.0
    """
    if len(rows) < 2 or rows[-1][per] == rows[-2][per]:
        return None
    return round((rows[-1][field] - rows[-2][field]) / (rows[-1][per] - rows[-2][per]), 2)


def _fit(ticks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least squares ``tick_s = a + b * folded + c * population`` over the ticks that folded someone."""
    rows = [t for t in ticks if t.get("folded", 0) > 0 and not t.get("paused")]
    if len(rows) < 4:
        return None
    X = np.array([[1.0, t["folded"], t["population"]] for t in rows])
    y = np.array([t["tick_s"] for t in rows])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    r2 = 1 - float(resid @ resid) / max(1e-12, float(((y - y.mean()) ** 2).sum()))
    return {"a_s": float(coef[0]), "b_s_per_folded_user": float(coef[1]), "c_s_per_user_in_population": float(coef[2]),
            "r2": round(r2, 3), "ticks": len(rows)}


def _predict(fit: dict[str, Any] | None, folded: int, population: int) -> float | None:
    if fit is None:
        return None
    return round(fit["a_s"] + fit["b_s_per_folded_user"] * folded + fit["c_s_per_user_in_population"] * population, 4)


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _rss_sum(pids: list[int]) -> float | None:
    """The workers' RSS together (MB)."""
    rss = [_rss_mb(p) for p in pids]
    return None if None in rss else round(sum(r for r in rss if r is not None), 1)


def yardstick_us() -> float:
    """``sum(range(1000))`` in µs on this machine now (every absolute figure scales with it)."""
    import timeit

    return round(timeit.timeit("sum(range(1000))", number=10000) / 10000 * 1e6, 2)


class _Producer:
    """kafka-python with large batches and a linger, straight to ``interactions``; events as ingest takes them."""

    def __init__(self, address: str, items: list[str], events_per_user: tuple[int, int], seed: int) -> None:
        from kafka import KafkaProducer  # type: ignore[import-untyped]  # kafka-python ships no type hints

        self.producer = KafkaProducer(bootstrap_servers=address, linger_ms=20, batch_size=1 << 20,
                                      max_request_size=8 << 20, acks=1)
        self.items, self.lo, self.hi = items, events_per_user[0], events_per_user[1]
        self.rng = random.Random(seed)
        self.produced = 0

    def wave(self, first: int, users: int) -> int:
        """Send every event of users ``first .. first + users - 1`` (each user's back to back); their number."""
        rng, items, send = self.rng, self.items, self.producer.send
        n = 0
        ts = time.time() * 1000
        for u in range(first, first + users):
            user = f"u{u:07d}"
            key = user.encode()
            for j in range(rng.randint(self.lo, self.hi)):
                value = (f'{{"event_id": "{user}-{j}", "user": "{user}", "arm": "{rng.choice(items)}", '
                         f'"reward": {1.0 if rng.random() < 0.3 else 0.0}, "ts": {ts:.0f}, "rec_id": null}}')
                send("interactions", key=key, value=value.encode())
                n += 1
        self.producer.flush()
        self.produced += n
        return n

    def close(self) -> None:
        self.producer.close()


class _Observer:
    """Reads the live stack's Redis: committed ingest offsets, the exact released count, the tick log, memory."""

    def __init__(self, redis_url: str, namespace: str, partitions: int) -> None:
        import redis

        from pipeline.config.keys import PublicKeys
        from pipeline.state.trusted import TrustedKeys

        self.r = redis.Redis.from_url(redis_url)
        self.ns, self.keys = namespace, PublicKeys(namespace)
        self.offset_keys = [TrustedKeys(namespace).offset(p) for p in range(partitions)]
        self.seen_ticks: set[int] = set()

    def committed(self) -> int:
        return sum(int(v or 0) for v in self.r.mget(self.offset_keys))

    def released(self) -> int:
        raw = self.r.hget(self.keys.release_figures, "count")
        return int(raw if raw is not None else self.r.hget(self.keys.released, "count") or 0)

    def capped(self) -> int:
        return sum(int(self.r.hget(self.keys.ledger_summary(p), "dropped") or 0) for p in range(len(self.offset_keys)))

    def ticks(self) -> list[dict[str, Any]]:
        """Tick log entries not returned before, oldest first."""
        out = []
        for raw in reversed(self.r.lrange(self.keys.tick_log, 0, -1)):
            t = json.loads(raw)
            if t["at_ms"] not in self.seen_ticks:
                self.seen_ticks.add(t["at_ms"])
                out.append(t)
        return out

    def wait_ingested(self, before: int, target: int, timeout: float) -> tuple[int, float]:
        """Wait until the committed offsets reach ``target`` (from ``before``); the events committed after the first
        commit seen and the seconds from that commit to the last (the worker's own ingest rate: the producer's
        start-up and the first batch's latency are not in it). A wave whose first commit seen already covers it
        (a small wave on a fast machine: nothing to time between commits) counts whole, timed from this call (the
        workers' resume, the backlog complete) to that commit: its first batch's latency is then in it, so the
        rate is a lower bound rather than nothing."""
        t0 = time.perf_counter()
        first: tuple[int, float] | None = None
        while True:
            now, c = time.perf_counter(), self.committed()
            if first is None and c > before:
                first = (c, now)
            if c >= target:
                assert first is not None
                if first[0] >= target:  # one commit took the whole wave
                    return target - before, now - t0
                return target - first[0], now - first[1]
            if now - t0 > timeout:
                raise TimeoutError(f"not within {timeout:.0f} s: {target} events ingested (committed {c})")
            time.sleep(0.005)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> float:
        t0 = time.perf_counter()
        while not predicate():
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"not within {timeout:.0f} s: {what}")
            time.sleep(0.01)
        return time.perf_counter() - t0

    def memory(self) -> dict[str, Any]:
        """``used_memory`` and the memory of each kind of key of the namespace (its name without the slot)."""
        kinds: dict[str, dict[str, int]] = {}
        for key in self.r.scan_iter(match=f"{self.ns}:*", count=1000):
            parts = key.decode().split(":")
            kind = f"{parts[1]}:{parts[-1]}" if len(parts) >= 4 else key.decode()
            if parts[1] == "recs":
                kind = "recs:<rec_id>"
            k = kinds.setdefault(kind, {"keys": 0, "bytes": 0, "fields": 0})
            k["keys"] += 1
            k["bytes"] += int(self.r.memory_usage(key, samples=0) or 0)
            if self.r.type(key) == b"hash":
                k["fields"] += int(self.r.hlen(key))
        info = self.r.info("memory")
        recs = kinds.get("recs:<rec_id>", {}).get("bytes", 0)
        return {"used_memory": int(info["used_memory"]), "used_memory_dataset": int(info["used_memory_dataset"]),
                # the shown lists of the bench's own /recommend requests (a TTL of a day) are not the population's
                "used_memory_population": int(info["used_memory"]) - recs,
                "by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"]))}


def _timed_gets(host: str, paths: list[str], token: str | None = None) -> list[float]:
    """Seconds of each ``GET`` over one keep-alive connection (status 200 required)."""
    h, port = host.split(":")
    conn = http.client.HTTPConnection(h, int(port), timeout=120)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    out = []
    try:
        for path in paths:
            t0 = time.perf_counter()
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            out.append(time.perf_counter() - t0)
            if resp.status != 200:
                raise RuntimeError(f"GET {path} answered {resp.status}: {body[:300]!r}")
    finally:
        conn.close()
    return out


def _ms(seconds: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(seconds, 50)) * 1e3, 2),
            "p99_ms": round(float(np.percentile(seconds, 99)) * 1e3, 2), "n": len(seconds)}


def _serving(stack: Any, size: int, requests: int) -> dict[str, Any]:
    """``/recommend`` for never-seen users; ``/budget``, its operator view, ``/budget/history``, ``/dashboard``."""
    host = stack.web.address
    _timed_gets(host, [f"/recommend?user=warm-{size}-{i}&k=10" for i in range(20)])
    rec = _timed_gets(host, [f"/recommend?user=new-{size}-{i}&k=10" for i in range(requests)])
    return {"recommend_new_user": _ms(rec),
            "budget_public": _ms(_timed_gets(host, ["/budget"] * 5)),
            "budget_operator": _ms(_timed_gets(host, ["/budget"] * 3, stack.operator_token)),
            "budget_history_operator": _ms(_timed_gets(host, ["/budget/history"] * 3, stack.operator_token)),
            "dashboard": _ms(_timed_gets(host, ["/dashboard"] * 5))}


@contextlib.contextmanager
def _paused(pids: list[int], windows: list[tuple[int, int]]) -> Iterator[None]:
    """The processes ``pids`` stopped (``SIGSTOP``) inside the block and continued (``SIGCONT``) after it, whatever
    happens in it: the workers ingest a wave only once all of it is in the topic, so their rate is that of a backlog
    on cores they do not share with the bench's producer (the reference, consume + ``json.loads``, reads a backlog
    alone too). The pause's wall-clock window (ms) is appended to ``windows``: a release tick that overlaps it is
    not a tick's time (:func:`_mark_paused`)."""
    import signal

    start = int(time.time() * 1000)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        windows.append((start, int(time.time() * 1000) + 1))


def _mark_paused(tick: dict[str, Any], windows: list[tuple[int, int]]) -> dict[str, Any]:
    """``tick`` with ``paused`` set when its run (``at_ms`` is its end, ``tick_s`` its length) overlaps a pause.

    >>> _mark_paused({"at_ms": 10_000, "tick_s": 2.0}, [(8_500, 8_900)])["paused"]
    True
    >>> _mark_paused({"at_ms": 10_000, "tick_s": 1.0}, [(8_500, 8_900)])["paused"]
    False
    """
    end = int(tick["at_ms"])
    begin = end - int(math.ceil(float(tick["tick_s"]) * 1000)) - 1
    tick["paused"] = any(a <= end and begin <= b for a, b in windows)
    return tick


def _catalog(root: Path) -> Path:
    from producers.catalog.generate import write_catalog

    return write_catalog(root, n_items=N_ITEMS, n_users=10, d=D, feature_share=1.0, users_file=False, edges=False,
                         events=False)


def bench_population(sizes: list[int], *, events_per_user: tuple[int, int] = (3, 5), active: int = 10_000,
                     requests: int = 1000, workdir: Path | None = None, seed: int = 0,
                     say: Callable[[str], None] | None = None, progress: bool = True,
                     wave_timeout: float = 600.0, workers: int = 1, tick_seconds: float | None = None
                     ) -> dict[str, Any]:
    """Grow the live default stack's population through ``sizes`` and measure what each user costs.

    Parameters
    ----------
    sizes
        Population sizes N, increasing (distinct users so far when the size is measured).
    events_per_user
        Each user sends between these many events (inclusive), drawn uniformly.
    active
        Users per wave: a wave's events are all released before the next wave is produced.
    requests
        ``/recommend`` requests for never-seen users at each size.
    workdir
        State directory of the stack and the catalog (default: a temporary one, removed after).
    say
        Called with progress lines.
    progress
        Show a progress bar of the users produced (tqdm, on stderr).
    wave_timeout
        Seconds a wave may take to be released before the bench gives up.
    workers
        Workers of the stack's one consumer group (ingest is spread over them by partition; the first leads the
        release tick).
    tick_seconds
        The release tick's period (default: the setting's, 1 s). A longer one lets a tick fold a whole wave of
        ``active`` users (the tick's cost against the users active in it).
    """
    from privrec.bench.serve import local_stack
    from privrec.experiments.runner import machine_info

    from .workload import consume

    if sorted(set(sizes)) != list(sizes) or sizes[0] < 1:
        raise ValueError(f"`sizes` must be positive and increasing, got {sizes}.")
    if not 1 <= events_per_user[0] <= events_per_user[1]:
        raise ValueError(f"`events_per_user` must be 1 <= low <= high, got {events_per_user}.")
    if active < 1:
        raise ValueError(f"`active` must be positive, got {active}.")
    if workers < 1:
        raise ValueError(f"`workers` must be positive, got {workers}.")
    note = say or (lambda _l: None)
    doc: dict[str, Any] = {"machine": machine_info(), "yardstick_before_us": yardstick_us(), "sizes": list(sizes),
                           "events_per_user": list(events_per_user), "active_users_per_wave": active,
                           "workers": workers}
    tmp = tempfile.TemporaryDirectory(prefix="privrec-population-") if workdir is None else None
    root = Path(tmp.name) if tmp is not None else Path(workdir)  # type: ignore[arg-type]
    try:
        catalog = _catalog(root / "catalog")
        world = {"PRIVREC_CATALOG": str(catalog), "PRIVREC_D": str(D), "PRIVREC_CATALOG_UNITS": str(N_UNITS),
                 "PRIVREC_LOGLEVEL": "WARNING",
                 **({} if tick_seconds is None else {"PRIVREC_TICK_SECONDS": str(tick_seconds)})}
        note("starting the default stack (broker, redis-server, worker, web server)")
        with local_stack(root / "stack", settings=world, workers=workers) as stack:
            from pipeline.config.settings import Settings
            from pipeline.data.catalog import load_catalog

            settings = Settings.from_mapping({}, environ=stack.env)
            items = list(load_catalog(settings).arm_ids)
            doc["settings"] = {**settings.model_config(), "tick_seconds": settings.tick_seconds,
                               "user_cap": settings.user_cap, "relation": settings.relation,
                               "model": "hierarchy" if settings.hierarchy else "flat",
                               "privacy_unit": "user" if settings.user_level else "event",
                               "partitions": settings.partitions, "catalog": "generated directory: "
                               f"{N_ITEMS} items, d = {D}, {N_UNITS} units, users hashed to units"}
            obs = _Observer(stack.redis_url, stack.namespace, settings.partitions)
            worker_pids = [h.pid for h in stack.handles if h.name.startswith("worker-")]
            rest_s = 60 + 3 * settings.tick_seconds  # two ticks, whatever the period
            obs.wait(lambda: obs.r.llen(obs.keys.tick_log) >= 2, rest_s, "two release ticks")
            obs.ticks()  # the empty stack's ticks are not the bench's
            mem0 = obs.memory()
            doc["empty"] = {"used_memory": mem0["used_memory"], "worker_rss_mb": _rss_sum(worker_pids),
                            "web_rss_mb": _rss_mb(stack.web.pid)}
            producer = _Producer(stack.broker.address, items, events_per_user, seed)
            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=sizes[-1], unit="user", desc="population", file=sys.stderr, smoothing=0.1)
            rows: list[dict[str, Any]] = []
            ticks: list[dict[str, Any]] = []
            pauses: list[tuple[int, int]] = []  # the workers' stops (wall-clock ms): a tick across one is left out
            users = 0
            t_start = time.perf_counter()
            try:
                for size in sizes:
                    new_events, ingest_s, produce_s, counted, counted_s = 0, 0.0, 0.0, 0, 0.0
                    t_size = time.perf_counter()
                    while users < size:
                        wave = min(active, size - users)
                        t0 = time.perf_counter()
                        with _paused(worker_pids, pauses):  # the wave becomes a backlog, as consume + json.loads reads it
                            n = producer.wave(users, wave)
                        produce_s += time.perf_counter() - t0
                        target = producer.produced
                        c, c_s = obs.wait_ingested(target - n, target, wave_timeout)
                        ingest_s += time.perf_counter() - t0
                        counted, counted_s = counted + c, counted_s + c_s
                        obs.wait(lambda: obs.released() + obs.capped() >= target, wave_timeout,
                                 f"{target} events released (released {obs.released()}, capped {obs.capped()})")
                        users += wave
                        new_events += n
                        for t in obs.ticks():
                            t["population"] = users
                            ticks.append(_mark_paused(t, pauses))
                        if bar is not None:
                            bar.update(wave)
                    fill_s = time.perf_counter() - t_size
                    # at rest: two more ticks after the last wave's release, nothing pending
                    last = obs.r.llen(obs.keys.tick_log)
                    first_tick = json.loads(obs.r.lindex(obs.keys.tick_log, 0))["at_ms"]
                    obs.wait(lambda: json.loads(obs.r.lindex(obs.keys.tick_log, 1))["at_ms"] > first_tick, rest_s,
                             "two ticks at rest")
                    del last
                    for t in obs.ticks():
                        t["population"] = users
                        ticks.append(_mark_paused(t, pauses))
                    mem = obs.memory()
                    note(f"N = {size:,}: consume + json.loads of the topic's {producer.produced:,} events")
                    consume_s = asyncio.run(consume(stack.broker.address, producer.produced, settings, "json"))
                    row = {"users": users, "events": producer.produced, "new_events": new_events,
                           "fill_s": round(fill_s, 2), "produce_s": round(produce_s, 2),
                           "ingest_events_per_s": round(counted / counted_s) if counted_s else None,
                           "send_to_committed_events_per_s": round(new_events / ingest_s) if ingest_s else None,
                           "consume_json_events_per_s": round(producer.produced / consume_s),
                           "released": obs.released(), "capped_events": obs.capped(),
                           "used_memory": mem["used_memory"], "used_memory_dataset": mem["used_memory_dataset"],
                           "used_memory_population": mem["used_memory_population"],
                           "memory_by_kind": mem["by_kind"],
                           "worker_rss_mb": _rss_sum(worker_pids), "web_rss_mb": _rss_mb(stack.web.pid),
                           "ticks_at_size": tick_bands([t for t in ticks if t["population"] == users]),
                           "serving": _serving(stack, size, requests), "yardstick_us": yardstick_us()}
                    row["ingest_ratio"] = (round(row["ingest_events_per_s"] / row["consume_json_events_per_s"], 3)
                                           if row["ingest_events_per_s"] else None)
                    row["lost_events"] = producer.produced - row["released"]
                    row["unaccounted_events"] = row["lost_events"] - row["capped_events"]
                    rows.append(row)
                    note(f"N = {size:,}: {fill_s:.0f} s, ingest {row['ingest_events_per_s']:,} ev/s vs consume + "
                         f"json.loads {row['consume_json_events_per_s']:,} ev/s, used_memory "
                         f"{mem['used_memory'] / 2**20:.1f} MiB, lost {row['lost_events']}")
            finally:
                if bar is not None:
                    bar.close()
                producer.close()
        doc["rows"] = rows
        doc["ticks"] = ticks
        doc["wall_s"] = round(time.perf_counter() - t_start, 1)
    finally:
        if tmp is not None:
            tmp.cleanup()
    fit = _fit(ticks)
    bands = tick_bands(ticks)
    big = rows[-1]
    mem_rows = [{"users": 0, "used_memory_population": doc["empty"]["used_memory"], "events": 0}] + rows
    per_user = marginal(mem_rows, "used_memory_population")
    per_event = marginal(mem_rows, "used_memory_population", per="events")
    at10k = bands.get("10000")
    doc["tick_fit"] = fit
    doc["tick_bands"] = bands
    doc["ticks_paused"] = sum(1 for t in ticks if t.get("paused"))  # left out of the bands and the fit
    doc["tick_predicted_s"] = {str(b): _predict(fit, b, big["users"]) for b in TICK_BANDS}
    doc["redis_marginal_bytes_per_user"] = per_user
    doc["redis_marginal_bytes_per_event"] = per_event
    doc["redis_marginal_between"] = [mem_rows[-2]["users"], mem_rows[-1]["users"]]
    doc["ingest_ratio"] = big["ingest_ratio"]
    doc["tick_p99_s"] = at10k["p99_s"] if at10k else _predict(fit, 10_000, big["users"])
    doc["tick_p99_basis"] = (f"{at10k['ticks']} ticks that folded 5k..20k users" if at10k else
                             f"extrapolated: the fit tick_s = a + b * folded + c * N at 10,000 folded users and "
                             f"N = {big['users']:,} (no tick folded 5k..20k users here)")
    doc["lost_events"] = big["lost_events"]
    doc["capped_events"] = big["capped_events"]
    doc["unaccounted_events"] = big["unaccounted_events"]
    doc["seconds_per_user"] = round(doc["wall_s"] / big["users"], 5)
    doc["yardstick_after_us"] = yardstick_us()
    return doc


def plot(doc: dict[str, Any], path: Path) -> None:
    """Cost against N: memory per user, ingest rates, tick times, /recommend p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    n = [r["users"] for r in rows]
    fig, ax = plt.subplots(2, 2, figsize=(10, 7))
    ax[0, 0].plot(n, [r["used_memory"] / 2**20 for r in rows], "o-")
    ax[0, 0].set(title="Redis used_memory at rest (MiB)", xlabel="users N")
    ax[0, 1].plot(n, [r["ingest_events_per_s"] for r in rows], "o-", label="ingest (end to end)")
    ax[0, 1].plot(n, [r["consume_json_events_per_s"] for r in rows], "s--", label="consume + json.loads")
    ax[0, 1].set(title="events/s", xlabel="users N")
    ax[0, 1].legend()
    t = [x for x in doc["ticks"] if x.get("folded", 0) > 0]
    sc = ax[1, 0].scatter([x["folded"] for x in t], [x["tick_s"] for x in t], c=[x["population"] for x in t], s=8)
    fig.colorbar(sc, ax=ax[1, 0], label="population N")
    ax[1, 0].set(title="release tick wall time (s)", xlabel="users folded in the tick")
    ax[1, 1].plot(n, [r["serving"]["recommend_new_user"]["p99_ms"] for r in rows], "o-", label="/recommend p99")
    ax[1, 1].plot(n, [r["serving"]["budget_operator"]["p50_ms"] for r in rows], "s--", label="/budget (operator)")
    ax[1, 1].set(title="ms", xlabel="users N", yscale="log")
    ax[1, 1].legend()
    for a in ax.flat:
        a.set_xscale("log")
    fig.suptitle(f"privrec bench population (yardstick {doc['yardstick_before_us']} µs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def register(bsub: Any) -> None:
    p = bsub.add_parser("population", help="what each user costs the live default stack as N grows",
                        description=__doc__.split("\n\n")[0] + " Writes population.json and population.png to --out.")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--sizes", default="10000,100000,1000000",
                   help="population sizes N, increasing, comma-separated (default 10000,100000,1000000)")
    p.add_argument("--events-per-user", default="3,5", help="low,high events per user (default 3,5)")
    p.add_argument("--active", type=int, default=10_000,
                   help="users per wave: released before the next wave is produced (default 10000)")
    p.add_argument("--requests", type=int, default=1000, help="/recommend requests for new users per size (p99: the 10th slowest of the default 1,000)")
    p.add_argument("--workers", type=int, default=1, help="workers of the one consumer group (default 1)")
    p.add_argument("--tick-seconds", type=float, default=None,
                   help="release tick period (default: the setting's); longer lets one tick fold a whole wave")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"`{name}` must be comma-separated integers, got {text!r}.") from None


def _run(args: argparse.Namespace) -> int:
    sizes = _ints(args.sizes, "--sizes")
    epu = _ints(args.events_per_user, "--events-per-user")
    if len(epu) != 2:
        raise ValueError(f"`--events-per-user` must be low,high, got {args.events_per_user!r}.")
    doc = bench_population(sizes, events_per_user=(epu[0], epu[1]), active=args.active, requests=args.requests,
                           progress=not args.no_progress, workers=args.workers, tick_seconds=args.tick_seconds,
                           say=lambda line: print(f"bench population: {line}", file=sys.stderr, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "population.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, args.out / "population.png")
    for r in doc["rows"]:
        s = r["serving"]
        print(f"N = {r['users']:>9,}: used_memory {r['used_memory'] / 2**20:8.1f} MiB, ingest "
              f"{r['ingest_events_per_s']:>7,} ev/s ({r['ingest_ratio']} of consume + json.loads), worker "
              f"{r['worker_rss_mb']} MB, web {r['web_rss_mb']} MB, /recommend new user p99 "
              f"{s['recommend_new_user']['p99_ms']} ms, /budget operator {s['budget_operator']['p50_ms']} ms, "
              f"lost {r['lost_events']}")
    for k in HEADLINE:
        print(f"{k}: {doc[k]}")
    print(f"of the lost events, capped by design (a user's events straddling a tick, user_cap 1): "
          f"{doc['capped_events']}; unaccounted: {doc['unaccounted_events']}")
    print(f"tick_p99_s basis: {doc['tick_p99_basis']}; ticks by users folded: {doc['tick_bands']}")
    print(f"machine yardstick sum(range(1000)): {doc['yardstick_before_us']} µs before, {doc['yardstick_after_us']} "
          f"µs after; {doc['wall_s']} s in all ({doc['seconds_per_user'] * 1e3:.2f} ms per user)")
    print(f"wrote {args.out}/population.json and population.png", file=sys.stderr)
    return 0
