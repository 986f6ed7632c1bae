"""``privrec bench serve``: ``/recommend`` latency and throughput over loopback.

What it measures: the HTTP server (``python -m pipeline.apps.web``) answering
``GET /recommend?user=U&k=10&candidates=<25 ids>`` for a synthetic catalog
with ``d = 25`` whose serving model was published by a real worker from a few
thousand real events (so the model is not the empty prior). Every request is a
full one: parse, score K = 25 candidates, answer JSON, and store the shown list in
Redis and log it to the ``recommendations`` topic (behind the answer, in batches:
:mod:`pipeline.serve.shown`).

How: a fresh local stack (Tansu broker, redis-server, one worker, the web
server; :func:`local_stack`), then ``wrk`` — a C load generator, in its own
process, one thread — with ``C`` keep-alive connections for ``--duration``
seconds per run, ``--repeats`` runs per concurrency level, interleaved, after a
warm-up; the headline numbers are medians over the repeats. ``wrk`` rather than a Python
client because on 2 cores an asyncio client saturates at ~3k req/s and takes the
server's CPU (measured here). ``wrk`` comes from Debian (``apt-get install wrk``,
done here when missing, not in bootstrap). Each request's path is drawn from
2,000 pre-generated (user, 25 random candidates) pairs by a Lua script.

Reported per concurrency: p50/p90/p99 latency (wrk's per-request histogram),
requests/s, non-2xx count, and the server's CPU time per request (from
``/proc``, robust to other jobs on the machine, unlike wall time); plus the
settings and machine info (load average before and after: the machine is
shared). Target (issue 4): p99 ≤ 5 ms and ≥ 2,000 req/s.

Issue 13, at every concurrency (8 connections always among them), interleaved run by run:
``/recommend`` with K = 25 and with K = 1,000 candidates beside a minimal aiohttp endpoint
returning a constant JSON (:mod:`privrec.bench.minimal`: aiohttp on uvloop's loop with no access
log, as ``pipeline.apps.web`` runs) under the same wrk load; reported: requests/s, p50/p99 and server
CPU per request of each, the ratios of requests/s to the minimal endpoint's, and, at 8
connections, the verdicts of issue 24's target: K = 25 at ≥ 0.4× the minimal endpoint's requests/s and its
p99 ≤ 5 ms (each condition, and both together).
K = 1,000 uses the same ``GET ...&candidates=<ids>`` form, the only one ``pipeline.apps.web`` takes
(no POST or pool-size parameter): with the synthetic catalog's ids ("0".."999") the request line
is ~4 kB, under aiohttp's 8,190-byte limit; longer ids would not fit.

Examples
--------
>>> parse_wrk(_WRK_SAMPLE)["p99_ms"], parse_wrk(_WRK_SAMPLE)["requests_per_s"]
(4.12, 2345.67)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.serve.auth import OPERATOR_ENV, SECRET_ENV, Tokens

__all__ = ["LocalStack", "local_stack", "seed_events", "parse_wrk", "bench_serve", "register"]

#: Candidates per request (the papers' pool size) and the list length asked for.
K_CANDIDATES = 25
TOP_K = 10

#: Settings of the benchmark's world: d = 25, the synthetic catalog (DESIGN §6 sizes).
WORLD = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "25", "PRIVREC_N_USERS": "10", "PRIVREC_N_ARMS": "1000",
         "PRIVREC_ALGORITHM": "colin", "PRIVREC_EPSILON": "2", "PRIVREC_TICK_SECONDS": "0.5",
         "PRIVREC_LOGLEVEL": "WARNING"}

# ---------------------------------------------------------------------------------------
# A local stack: broker, redis, worker, web server
# ---------------------------------------------------------------------------------------


@dataclass
class LocalStack:
    """A running broker, redis, worker(s) and web server, all on loopback.

    Attributes
    ----------
    state_dir
        PID files and logs of every process.
    namespace
        Redis key namespace of this stack.
    env
        Environment the worker and the web server were started with.
    broker
        The Tansu broker (``broker.address`` is the bootstrap ``host:port``).
    redis_url
        URL of the redis-server.
    web
        The HTTP server; :attr:`base_url` is where it answers.
    handles
        Every process started by this stack, in start order.
    tokens
        The web server's token secret and operator token (``<state_dir>/tokens.json``, made as ``privrec up``
        makes them: :func:`privrec.ops.stackfile.stack_tokens`); :meth:`user_token` is a user's.
    """

    state_dir: Path
    namespace: str
    env: dict[str, str]
    broker: Any
    redis_url: str
    web: Any = None
    handles: list[Any] = field(default_factory=list)
    tokens: Tokens | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.web.address}"

    @property
    def operator_token(self) -> str:
        assert self.tokens is not None and self.tokens.operator is not None, "the stack was started without tokens"
        return self.tokens.operator

    def user_token(self, user: str) -> str:
        """``user``'s token: it opens their per-user views (``/budget?user=``)."""
        assert self.tokens is not None, "the stack was started without tokens"
        return self.tokens.for_user(user)

    def get_json(self, path: str, timeout: float = 10.0, *, token: str | None = None) -> tuple[int, Any]:
        """``GET`` a path of the web server: ``(status, decoded JSON body)``; ``token`` goes as ``Authorization:
        Bearer``."""
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        try:
            with urllib.request.urlopen(urllib.request.Request(self.base_url + path, headers=headers),
                                        timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def post_json(self, path: str, body: Any, timeout: float = 10.0) -> tuple[int, Any]:
        """``POST`` JSON to a path of the web server: ``(status, decoded JSON body)``."""
        req = urllib.request.Request(self.base_url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


_stack_ids = itertools.count()


@contextlib.contextmanager
def local_stack(state_dir: str | os.PathLike[str], *, settings: Mapping[str, str] | None = None,
                redis_url: str | None = None, namespace: str | None = None,
                worker_timeout: float = 90.0, workers: int = 1) -> Iterator[LocalStack]:
    """Start a fresh broker, redis-server (unless ``redis_url``), one worker and the web server.

    Parameters
    ----------
    state_dir
        Directory for PID files, logs and redis data (created).
    settings
        ``PRIVREC_*`` environment values for the worker and the web server (over the
        caller's environment).
    redis_url
        Use this redis-server instead of starting one.
    namespace
        Redis key namespace (default: a fresh one).
    worker_timeout
        Seconds to wait until the worker has partitions.
    workers
        Workers of the one consumer group (``worker-0``, ``worker-1``, ...; the first to start leads the release);
        ready once each owns partitions.

    Yields
    ------
    LocalStack
        Ready: the worker owns partitions and ``/healthz`` answers 200 (a model is
        published). Everything is stopped by PID on exit, also after an error.
    """
    from pipeline import services
    from privrec.ops.stackfile import stack_tokens

    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    ns = namespace or f"s{os.getpid()}x{next(_stack_ids)}"
    started: list[Any] = []
    try:
        broker = services.start_broker(state)
        started.append(broker)
        if redis_url is None:
            rh = services.start_redis(state)
            started.append(rh)
            redis_url = rh.url
        parts = int((settings or {}).get("PRIVREC_PARTITIONS", 4))
        topics = {"interactions": parts, "dead-letters": 1, "recommendations": 1}
        if (settings or {}).get("PRIVREC_MODE") == "local":
            topics.update({"ldp-reports": parts, "ldp-shuffled": parts})
        services.create_topics(broker.address, topics)
        env = {**os.environ, **(settings or {}), "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": redis_url,
               "PRIVREC_NAMESPACE": ns, "PRIVREC_STATE_DIR": str(state), "PRIVREC_WORKER_ID": "worker-0"}
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        for name in (SECRET_ENV, OPERATOR_ENV):  # the web server's alone (below), as privrec up does
            env.pop(name, None)
        tokens = stack_tokens(state, {})
        stack = LocalStack(state, ns, env, broker, redis_url, handles=started, tokens=tokens)

        import redis

        client = redis.Redis.from_url(redis_url)
        status_key = f"{ns}:ops:{{{ns}:ops}}:workers"

        def worker_ready(name: str) -> bool:
            raw = client.hget(status_key, name)
            return raw is not None and bool(json.loads(raw)["partitions"])

        for i in range(workers):
            name = f"worker-{i}"
            started.append(services.start_process(name, [sys.executable, "-m", "pipeline.apps.worker"], state,
                                                  env={**env, "PRIVREC_WORKER_ID": name},
                                                  ready=functools.partial(worker_ready, name),
                                                  timeout=worker_timeout))
        # the group rebalanced as each joined: every worker owns partitions again before the stack is ready
        deadline = time.monotonic() + worker_timeout
        while workers > 1 and not all(worker_ready(f"worker-{i}") for i in range(workers)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every one of {workers} workers owns partitions after {worker_timeout:g} s")
            time.sleep(0.2)
        for attempt in range(3):
            port = services.free_port()
            try:
                web = services.start_process(
                    "web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], state,
                    env={**env, **tokens.env()},
                    address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}",
                    ready=functools.partial(_http_ok, f"http://127.0.0.1:{port}/healthz"), timeout=60)
                break
            except services.PortInUseError:
                if attempt == 2:
                    raise
        started.append(web)
        stack.web = web
        client.close()
        yield stack
    finally:
        for h in reversed(started):
            services.stop(h, grace_seconds=5)


def seed_events(stack: LocalStack, n: int, *, seed: int = 0, timeout: float = 120.0) -> int:
    """Produce ``n`` interactions (catalog contexts, rewards from the synthetic world) and wait
    until a published model covers them; return the model version."""
    from kafka import KafkaProducer  # type: ignore[import-untyped]  # kafka-python ships no type hints

    from pipeline.data.catalog import load_catalog
    from pipeline.config.settings import Settings

    s = Settings.from_mapping({}, environ=stack.env)
    catalog = load_catalog(s)
    rng = random.Random(seed)
    arms = list(catalog.arm_ids)
    users = list(catalog.users)
    theta = getattr(getattr(catalog, "env", None), "theta", None)
    prod = KafkaProducer(bootstrap_servers=stack.broker.address, linger_ms=5)
    # where the model publishes the exact Gram (the flat model), ingest takes feedback only on a list the server
    # recorded: the seed events answer one-item lists recorded as GET /recommend records them
    import redis

    from pipeline.config.keys import PublicKeys
    from pipeline.ingestion.shown_lists import rec_id_required

    recs = redis.Redis.from_url(stack.redis_url) if rec_id_required(s) else None
    keys = PublicKeys(s.namespace)
    for i in range(n):
        user, arm = rng.choice(users), rng.choice(arms)
        if theta is not None:  # reward ~ Bernoulli(clip(x . theta_u)), as the synthetic world has it
            p = float(catalog.feature_matrix[catalog.arm_row(arm)] @ theta[catalog.unit_of(user)])
            reward = 1.0 if rng.random() < min(1.0, max(0.0, p)) else 0.0
        else:
            reward = float(rng.random() < 0.3)
        ev = {"event_id": f"bench-{seed}-{i}", "user": user, "arm": arm, "reward": reward,
              "ts": time.time() * 1000, "rec_id": None}
        if recs is not None:
            ev["rec_id"], ev["shown"] = f"bench-{seed}-{i}", [arm]
            recs.set(keys.recommendation(ev["rec_id"]), json.dumps({"rec_id": ev["rec_id"], "user": user,
                                                                   "items": [arm]}), ex=86400)
        prod.send("interactions", key=user.encode(), value=json.dumps(ev).encode())
    prod.flush()
    prod.close()
    if recs is not None:
        recs.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = stack.get_json("/budget")
        if status == 200 and body["events_released"] >= n:
            return int(body["releases"])
        time.sleep(0.2)
    raise TimeoutError(f"the {n} seeded events were not all in a published model after {timeout:.0f} s "
                       f"(worker log: {stack.state_dir / 'worker-0.log'})")


# ---------------------------------------------------------------------------------------
# The load generator: wrk
# ---------------------------------------------------------------------------------------

_WRK_SAMPLE = """\
Running 10s test @ http://127.0.0.1:1
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.10ms    1.00ms  20.00ms   90.00%
  Latency Distribution
     50%    2.50ms
     75%    3.00ms
     90%    3.50ms
     99%    4.12ms
  23457 requests in 10.00s, 30.00MB read
Requests/sec:   2345.67
"""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if m is None:
        raise ValueError(f"cannot read a wrk duration from {text!r}")
    return round(float(m.group(1)) * _UNITS[m.group(2)], 4)


def parse_wrk(output: str) -> dict[str, Any]:
    """Latency percentiles (ms), requests/s, request and error counts from ``wrk --latency`` output."""
    out: dict[str, Any] = {}
    for pct in ("50", "75", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+(\S+)\s*$", output, re.MULTILINE)
        if m is None:
            raise ValueError(f"wrk output has no {pct}% latency line:\n{output}")
        out[f"p{pct}_ms"] = _ms(m.group(1))
    m = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.MULTILINE)
    if m is None:
        raise ValueError(f"wrk output has no Requests/sec line:\n{output}")
    out["requests_per_s"] = float(m.group(1))
    m = re.search(r"(\d+) requests in ([\d.]+\w+)", output)
    out["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    out["non_2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors:(.*)", output)
    out["socket_errors"] = m.group(1).strip() if m else None
    return out


def ensure_wrk() -> str:
    """Path of ``wrk``; installs Debian's package when missing (needs root and the package mirror)."""
    path = shutil.which("wrk")
    if path:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("`wrk` is not installed and cannot be installed here; install it "
                           "(Debian/Ubuntu: apt-get install wrk) and run again")
    print("bench serve: installing wrk (apt-get install wrk)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "wrk"]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(cmd, env=env, capture_output=True, check=True)
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError("apt-get install wrk finished but `wrk` is not on PATH")
    return path


def _lua_script(paths: Sequence[str]) -> str:
    body = ",\n".join(json.dumps(p) for p in paths)  # JSON strings are valid Lua strings here (ASCII)
    return ("-- generated by privrec bench serve: cycle through fixed request paths\n"
            f"local paths = {{\n{body}\n}}\n"
            "local i = 0\n"
            "request = function()\n"
            "  i = i % #paths + 1\n"
            "  return wrk.format(\"GET\", paths[i])\n"
            "end\n")


def request_paths(users: Sequence[str], arms: Sequence[str], n: int = 2000, *, seed: int = 0,
                  k_candidates: int = K_CANDIDATES) -> list[str]:
    """``n`` request paths: a random user and ``k_candidates`` distinct random candidates each.

    >>> request_paths(["7"], [str(a) for a in range(30)], 1)[0].startswith("/recommend?user=7&k=10&candidates=")
    True
    >>> len(request_paths(["7"], [str(a) for a in range(30)], 1, k_candidates=30)[0].split("candidates=")[1].split(","))
    30
    """
    rng = random.Random(seed)
    return [f"/recommend?user={rng.choice(users)}&k={TOP_K}&candidates=" + ",".join(rng.sample(list(arms),
                                                                                                 k_candidates))
            for _ in range(n)]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(wrk: str, url: str, script: Path, *, connections: int, duration: float, server_pid: int | None = None,
            threads: int = 1) -> dict[str, Any]:
    """One wrk run; adds the server's CPU seconds per request when ``server_pid`` is given."""
    cpu0 = _cpu_seconds(server_pid) if server_pid else None
    proc = subprocess.run([wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency",
                           "-s", str(script), url], capture_output=True, text=True, timeout=duration + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr or proc.stdout}")
    res = parse_wrk(proc.stdout)
    if server_pid and cpu0 is not None and res.get("requests"):
        res["server_cpu_us_per_request"] = round((_cpu_seconds(server_pid) - cpu0) / res["requests"] * 1e6, 1)
    res["concurrency"] = connections
    res["duration_s"] = duration
    return res


# ---------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------

TARGET = {"p99_ms": 5.0, "requests_per_s": 2000.0}
#: Issue 24: at 8 connections, /recommend (K = 25) at >= 0.4x the minimal endpoint's requests/s and p99 <= 5 ms.
PEER_CONNECTIONS = 8
PEER_TARGET = {"ratio_k25": 0.4, "p99_ms": 5.0}
#: The large request: every arm of the synthetic catalog as a candidate.
K_LARGE = 1000


@contextlib.contextmanager
def minimal_server(state_dir: Path) -> Iterator[Any]:
    """``python -m privrec.bench.minimal`` on a free loopback port (a :class:`pipeline.services.ServiceHandle`)."""
    from pipeline import services

    port = services.free_port()
    handle = services.start_process(
        "minimal-web", [sys.executable, "-m", "privrec.bench.minimal", "--port", str(port)], state_dir,
        env={**os.environ}, address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}",
        ready=lambda: _http_ok(f"http://127.0.0.1:{port}/recommend"), timeout=60)
    try:
        yield handle
    finally:
        services.stop(handle, grace_seconds=5)


#: The three servers under the same load, in run order: /recommend at K = 25, at K = 1,000, the minimal endpoint.
PEERS = ("recommend_k25", "recommend_k1000", "minimal")


def compare_at(runs: list[dict[str, Any]], connections: int) -> dict[str, Any]:
    """Medians per server at one concurrency and each ``/recommend``'s ratios to the minimal endpoint.

    ``ratio_k25`` and ``ratio_k1000`` are requests/s over the minimal endpoint's; ``cpu_ratio_k25`` and
    ``cpu_ratio_k1000`` are the minimal endpoint's server CPU µs per request over ``/recommend``'s (the same
    sense: 1 means as cheap as the minimal endpoint), which other jobs on a shared machine do not move.

    >>> runs = [{"target": t, "concurrency": 8, "duration_s": 5, "p50_ms": 1.0, "p99_ms": 2.0, "non_2xx": 0,
    ...          "requests_per_s": r, "server_cpu_us_per_request": u}
    ...         for t, r, u in (("recommend_k25", 3000.0, 200.0), ("minimal", 6000.0, 40.0))]
    >>> c = compare_at(runs, 8)
    >>> c["ratio_k25"], c["cpu_ratio_k25"], "ratio_k1000" in c
    (0.5, 0.2, False)
    """
    at = [r for r in runs if r["concurrency"] == connections]
    by = {t: _median_run([r for r in at if r["target"] == t]) for t in PEERS if any(r["target"] == t for r in at)}
    if "minimal" not in by or "recommend_k25" not in by:
        raise ValueError(f"`runs` at {connections} connections need both recommend_k25 and minimal, "
                         f"got {sorted(by)}.")
    base = by["minimal"]
    out: dict[str, Any] = {"connections": connections, **by}
    for t, key in (("recommend_k25", "k25"), ("recommend_k1000", "k1000")):
        if t in by:
            out[f"ratio_{key}"] = round(by[t]["requests_per_s"] / base["requests_per_s"], 3)
            cpu, cpu_base = by[t].get("server_cpu_us_per_request"), base.get("server_cpu_us_per_request")
            if cpu and cpu_base:
                out[f"cpu_ratio_{key}"] = round(cpu_base / cpu, 3)
    return out


def peer_verdict(ratio_k25: float, p99_ms: float, non_2xx: int = 0) -> dict[str, bool]:
    """Issue 24's target at :data:`PEER_CONNECTIONS`, condition by condition and whole (``"both"``): K = 25 at
    >= 0.4x the minimal endpoint's requests/s, and its p99 <= 5 ms with every answer a 2xx.

    >>> peer_verdict(0.4, 5.0)
    {'ratio_k25': True, 'p99_ms': True, 'both': True}
    >>> peer_verdict(0.39, 2.0), peer_verdict(0.9, 2.0, non_2xx=1)
    ({'ratio_k25': False, 'p99_ms': True, 'both': False}, {'ratio_k25': True, 'p99_ms': False, 'both': False})
    """
    ratio_ok = ratio_k25 >= PEER_TARGET["ratio_k25"]
    p99_ok = p99_ms <= PEER_TARGET["p99_ms"] and non_2xx == 0
    return {"ratio_k25": ratio_ok, "p99_ms": p99_ok, "both": ratio_ok and p99_ok}


def peer_summary(runs: list[dict[str, Any]], connections: int = PEER_CONNECTIONS) -> dict[str, Any]:
    """:func:`compare_at` at ``connections`` (default :data:`PEER_CONNECTIONS`) with the verdicts.

    >>> runs = [{"target": t, "concurrency": 8, "duration_s": 5, "p50_ms": 1.0, "p99_ms": p, "non_2xx": 0,
    ...          "requests_per_s": r} for t, p, r in (("recommend_k25", 4.0, 3000.0), ("minimal", 1.0, 5000.0),
    ...                                                ("recommend_k1000", 9.0, 1000.0))]
    >>> s = peer_summary(runs)
    >>> s["ratio_k25"], s["ratio_k1000"], s["met"]
    (0.6, 0.2, {'ratio_k25': True, 'p99_ms': True, 'both': True})
    """
    out = compare_at(runs, connections)
    k25 = out["recommend_k25"]
    out["target"] = PEER_TARGET
    out["met"] = peer_verdict(out["ratio_k25"], k25["p99_ms"], k25["non_2xx"])
    return out


def bench_serve(out: Path, *, concurrency: Sequence[int] = (1, 4, 8, 32), duration: float = 5.0,
                repeats: int = 3, warmup: float = 3.0, events: int = 5000, settings: Mapping[str, str] | None = None,
                state_dir: Path | None = None, peers: bool = True) -> dict[str, Any]:
    """Start a stack, seed the model, run wrk ``repeats`` times at each concurrency (interleaved, so
    that a burst of other jobs on the machine does not hit one level only); return the JSON document
    with the raw runs and, per concurrency, the median of each number over the repeats.

    ``peers``: at every concurrency (and at :data:`PEER_CONNECTIONS` in any case), each run of ``/recommend``
    with K = 25 is followed by one with K = 1,000 candidates and one of the minimal aiohttp endpoint
    (:mod:`privrec.bench.minimal`) under the same wrk load (connections, duration, repeats; the minimal endpoint
    gets the K = 25 request paths): ``doc["peers"]`` has each one's medians at :data:`PEER_CONNECTIONS`, the
    ratios of requests/s to the minimal endpoint and the verdicts; ``doc["peers_by_concurrency"]`` the same at
    every level."""
    from privrec.experiments.runner import machine_info

    wrk = ensure_wrk()
    world = {**WORLD, **(settings or {})}
    levels = sorted(set(concurrency) | ({PEER_CONNECTIONS} if peers else set()))
    t_start = time.time()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as es:
        sd = state_dir or Path(es.enter_context(tempfile.TemporaryDirectory(prefix="privrec-bench-serve-")))
        stack = es.enter_context(local_stack(sd, settings=world))
        version = seed_events(stack, events)
        status, users = stack.get_json("/users")
        if status != 200:
            raise RuntimeError(f"/users answered {status}: {users}")
        from pipeline.data.catalog import load_catalog
        from pipeline.config.settings import Settings

        catalog = load_catalog(Settings.from_mapping({}, environ=stack.env))
        arm_ids = list(catalog.arm_ids)
        paths = request_paths(users["users"], arm_ids)
        status, probe = stack.get_json(paths[0])
        if status != 200 or len(probe["items"]) != TOP_K:
            raise RuntimeError(f"probe request {paths[0]} answered {status}: {probe}")
        out.mkdir(parents=True, exist_ok=True)
        script = out / "serve-requests.lua"
        script.write_text(_lua_script(paths))
        targets = [("recommend_k25", stack.base_url, script, stack.web.pid)]
        k_large = min(K_LARGE, len(arm_ids))
        large_path_chars = 0
        if peers:  # the K = 1,000 request in the same GET form (the server takes no other) and the minimal endpoint
            large = request_paths(users["users"], arm_ids, 200, k_candidates=k_large)
            large_path_chars = max(len(p) for p in large)
            status, probe = stack.get_json(large[0])
            if status != 200 or len(probe["items"]) != TOP_K:
                raise RuntimeError(f"probe request with {k_large} candidates answered {status}: {probe}")
            script_large = out / "serve-requests-k1000.lua"
            script_large.write_text(_lua_script(large))
            minimal = es.enter_context(minimal_server(sd))
            targets += [("recommend_k1000", stack.base_url, script_large, stack.web.pid),
                        ("minimal", minimal.url, script, minimal.pid)]
        for _, url, scr, _ in targets:
            run_wrk(wrk, url, scr, connections=max(levels), duration=warmup)
        all_runs = [dict(run_wrk(wrk, url, scr, connections=c, duration=duration, server_pid=pid),
                         repeat=rep, target=name)
                    for rep in range(repeats) for c in levels for name, url, scr, pid in targets]
    load_after = os.getloadavg()
    runs = [r for r in all_runs if r["target"] == "recommend_k25"]
    peer_runs = [r for r in all_runs if r["target"] != "recommend_k25"]
    summary = [_median_run([r for r in runs if r["concurrency"] == c]) for c in levels]
    best = _verdict(summary)
    peer_doc: dict[str, Any] = {}
    if peers:
        peer_doc = {"peers": peer_summary(all_runs),
                    "peers_by_concurrency": [compare_at(all_runs, c) for c in levels],
                    "peer_runs": peer_runs}
    return {
        "benchmark": "serve",
        "what": "GET /recommend over loopback: K=25 candidates, top 10, d=25; wrk (1 thread) in its own process",
        "target": TARGET,
        **best,
        "by_concurrency": summary,
        "runs": runs,
        **peer_doc,
        "settings": {"k_candidates": K_CANDIDATES, "top_k": TOP_K, "d": int(world["PRIVREC_D"]),
                     "n_users": int(world["PRIVREC_N_USERS"]), "n_arms": int(world["PRIVREC_N_ARMS"]),
                     "algorithm": world["PRIVREC_ALGORITHM"], "epsilon": float(world["PRIVREC_EPSILON"]),
                     "seeded_events": events, "model_version": version, "distinct_requests": len(paths),
                     "concurrency": levels, "duration_s": duration, "repeats": repeats,
                     "warmup_s": warmup,
                     **({"k_large_candidates": k_large, "k_large_distinct_requests": 200,
                         "k_large_max_path_chars": large_path_chars,
                         "k_large_form": "GET /recommend?candidates=<comma-separated ids> (the only form "
                                         "pipeline.apps.web takes)",
                         "minimal_server": "python -m privrec.bench.minimal: aiohttp + uvloop like pipeline.apps.web, "
                                           "constant JSON, the K = 25 request paths"} if peers else {}),
                     "load_generator": _wrk_version(wrk), "server": "python -m pipeline.apps.web (one process)"},
        "machine": {**machine_info(), "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in load_after],
                    "note": "2 shared cores: wrk, the server, redis, the broker and the worker share them, and "
                            "other jobs may run; see loadavg"},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t_start)),
        "wall_s": round(time.time() - t_start, 1),
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-number median over repeated runs at one concurrency (non-2xx: the sum).

    >>> _median_run([{"concurrency": 4, "duration_s": 5, "p50_ms": 1.0, "p99_ms": 9.0, "non_2xx": 0},
    ...              {"concurrency": 4, "duration_s": 5, "p50_ms": 2.0, "p99_ms": 3.0, "non_2xx": 1},
    ...              {"concurrency": 4, "duration_s": 5, "p50_ms": 3.0, "p99_ms": 4.0, "non_2xx": 0}])
    {'concurrency': 4, 'duration_s': 5, 'repeats': 3, 'p50_ms': 2.0, 'p99_ms': 4.0, 'non_2xx': 1}
    """
    import statistics

    out: dict[str, Any] = {"concurrency": runs[0]["concurrency"], "duration_s": runs[0]["duration_s"],
                           "repeats": len(runs)}
    for key in ("p50_ms", "p75_ms", "p90_ms", "p99_ms", "requests_per_s", "server_cpu_us_per_request"):
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = round(statistics.median(values), 4)
    out["non_2xx"] = sum(r["non_2xx"] for r in runs)
    return out


def _verdict(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline: the (median) run with the most requests/s among those meeting the p99 target
    (else the lowest p99), and whether the target is met."""
    ok = [r for r in runs if r["p99_ms"] <= TARGET["p99_ms"] and r["non_2xx"] == 0]
    head = max(ok, key=lambda r: r["requests_per_s"]) if ok else min(runs, key=lambda r: r["p99_ms"])
    met = bool(ok) and head["requests_per_s"] >= TARGET["requests_per_s"]
    return {"p50_ms": head["p50_ms"], "p99_ms": head["p99_ms"], "requests_per_s": head["requests_per_s"],
            "concurrency": head["concurrency"], "duration_s": head["duration_s"], "target_met": met}


def _wrk_version(wrk: str) -> str:
    proc = subprocess.run([wrk, "--version"], capture_output=True, text=True)
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return text[0] if text else "wrk"


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def _int_list(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {value!r}") from None
    if not out or any(v < 1 for v in out):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {value!r}")
    return out


def register(bsub: Any) -> None:
    p = bsub.add_parser(
        "serve", help="/recommend latency p50/p99 and requests/s over loopback (K=25, d=25)",
        description="Start a local stack (broker, redis, worker, web server) on free loopback ports, seed "
                    "the model with --events interactions, then load GET /recommend (25 candidates, top 10, "
                    "d=25) with wrk at each --concurrency; print p50/p99 and requests/s and write "
                    "serve.json to --out. Installs Debian's wrk when missing. Target: p99 <= 5 ms and "
                    ">= 2,000 req/s.")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--concurrency", type=_int_list, default=[1, 4, 8, 32], metavar="C[,C...]",
                   help="open connections of each run (default 1,4,8,32)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per run (default 5)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per concurrency, interleaved; medians are reported (default 3)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up load (default 3)")
    p.add_argument("--events", type=int, default=5000, help="interactions that seed the model (default 5000)")
    p.add_argument("--no-peers", action="store_true",
                   help="skip the K = 1,000 and minimal-endpoint runs (and the forced 8-connection level)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.duration < 1:
        raise ValueError(f"`--duration` must be at least 1 s, got {args.duration}.")
    if args.events < 1:
        raise ValueError(f"`--events` must be positive, got {args.events}.")
    if args.repeats < 1:
        raise ValueError(f"`--repeats` must be positive, got {args.repeats}.")
    doc = bench_serve(args.out, concurrency=args.concurrency, duration=args.duration, repeats=args.repeats,
                      warmup=args.warmup, events=args.events, peers=not args.no_peers)
    (args.out / "serve.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("\n".join(summary_lines(doc)))
    print(f"wrote {args.out}/serve.json", file=sys.stderr)
    return 0


_PEER_LABELS = {"recommend_k25": "/recommend K = 25", "recommend_k1000": "/recommend K = 1,000",
                "minimal": "minimal endpoint"}


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """The printed summary of a ``serve.json`` document.

    >>> run = {"concurrency": 8, "p50_ms": 1.0, "p90_ms": 1.5, "p99_ms": 2.0, "requests_per_s": 4000.0,
    ...        "server_cpu_us_per_request": 250.0, "non_2xx": 0}
    >>> doc = {"settings": {"repeats": 1, "duration_s": 3.0}, "by_concurrency": [run], "target_met": True,
    ...        "concurrency": 8, "p50_ms": 1.0, "p99_ms": 2.0, "requests_per_s": 4000.0,
    ...        "machine": {"loadavg_before": [0.1], "loadavg_after": [0.5], "python_speed_us": 9.1}}
    >>> print("\\n".join(summary_lines(doc)))
    medians of 1 runs of 3 s at each concurrency C (/recommend, K = 25):
       C   p50 ms   p90 ms   p99 ms     req/s  cpu µs/req  non-2xx
       8     1.00     1.50     2.00      4000         250        0
    headline (C=8): p50 1.00 ms, p99 2.00 ms, 4000 req/s; target p99 <= 5 ms and >= 2,000 req/s: met; loadavg [0.1] -> [0.5]; machine yardstick sum(range(1000)) = 9.1 µs
    """
    st = doc["settings"]
    lines = [f"medians of {st['repeats']} runs of {st['duration_s']:g} s at each concurrency C (/recommend, K = 25):",
             f"{'C':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'req/s':>9} {'cpu µs/req':>11} {'non-2xx':>8}"]
    for r in doc["by_concurrency"]:
        lines.append(f"{r['concurrency']:>4} {r['p50_ms']:>8.2f} {r['p90_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                     f"{r['requests_per_s']:>9.0f} {r.get('server_cpu_us_per_request', float('nan')):>11.0f} "
                     f"{r['non_2xx']:>8}")
    m = doc["machine"]
    lines.append(f"headline (C={doc['concurrency']}): p50 {doc['p50_ms']:.2f} ms, p99 {doc['p99_ms']:.2f} ms, "
                 f"{doc['requests_per_s']:.0f} req/s; target p99 <= 5 ms and >= 2,000 req/s: "
                 f"{_met(doc['target_met'])}; loadavg {m['loadavg_before']} -> {m['loadavg_after']}; "
                 f"machine yardstick sum(range(1000)) = {m['python_speed_us']:.1f} µs")
    if "peers" not in doc:
        return lines
    lines += [f"beside the minimal aiohttp endpoint (constant JSON, uvloop), same wrk load, runs interleaved, "
              f"medians of {st['repeats']}:",
              f"{'C':>4}  {'server':<22} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'cpu µs/req':>11} "
              f"{'req/s ratio':>12} {'cpu ratio':>10}"]
    for level in doc.get("peers_by_concurrency", [doc["peers"]]):
        for name in PEERS:
            if name not in level:
                continue
            r, key = level[name], name.removeprefix("recommend_")
            ratio, cpu = level.get(f"ratio_{key}"), level.get(f"cpu_ratio_{key}")
            lines.append(f"{level['connections']:>4}  {_PEER_LABELS[name]:<22} {r['requests_per_s']:>9.0f} "
                         f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                         f"{r.get('server_cpu_us_per_request', float('nan')):>11.0f} "
                         f"{'' if ratio is None else format(ratio, '.3f'):>12} "
                         f"{'' if cpu is None else format(cpu, '.3f'):>10}")
    pe = doc["peers"]
    k25 = pe["recommend_k25"]
    lines.append(f"at {pe['connections']} connections: requests/s of /recommend over the minimal endpoint's: "
                 f"K = 25 {pe['ratio_k25']:.3f} (target >= {PEER_TARGET['ratio_k25']}: {_met(pe['met']['ratio_k25'])})"
                 + (f", K = 1,000 {pe['ratio_k1000']:.3f} (no target)" if "ratio_k1000" in pe else "")
                 + f"; p99 at K = 25 {k25['p99_ms']:.2f} ms (target <= {PEER_TARGET['p99_ms']:g} ms: "
                 f"{_met(pe['met']['p99_ms'])})")
    both = pe["met"].get("both", pe["met"]["ratio_k25"] and pe["met"]["p99_ms"])  # (documents written before "both")
    lines.append(f"verdict (issue 24, K = 25 at {pe['connections']} connections): ratio {pe['ratio_k25']:.3f} >= "
                 f"{PEER_TARGET['ratio_k25']} and p99 {k25['p99_ms']:.2f} ms <= {PEER_TARGET['p99_ms']:g} ms: "
                 f"{_met(both)} (yardstick {m['python_speed_us']:.1f} µs)")
    return lines
