"""``privrec bench acl``: the cost of least privilege — ingest, release and /recommend with and without Redis ACL.

One real redis-server (AOF on, the users of :func:`pipeline.config.acl.global_rules` loaded from its ACL file, as
``privrec up`` starts it) holds two namespaces of the same catalog: ``aclon``, used through the ``worker`` and
``web`` users (key patterns checked by Redis on every command), and ``acloff``, used through the administrator
(``~* +@all``: what every process used before least privilege, and with ``--no-acl``). The two sides alternate
in short rounds (which side goes first alternates too), so the shared machine's drift hits both alike; each
round measures, per side:

* **ingest**: one batch of ``batch`` events through the user-level ingest (``UserIngestProcessor``: the pending
  contributions and the offset in one Lua script), µs per event;
* **release**: one release tick (fold, release, durable persist, publish), ms;
* **/recommend**: a real ``pipeline.apps.web`` server per side (connected as ``web`` / as the administrator),
  ``block`` sequential keep-alive ``GET /recommend`` from one client, µs per request (client included);
* **Redis alone**: 2,000 pipelined ``HGET`` of the model's metadata as the web's user / as the administrator,
  µs per command — the permission check with the least around it.

The figures are the medians over ``rounds`` and the median of the per-round ratios ACL / no ACL (paired: the
two sides of a round ran seconds apart). Writes ``acl.json`` (every round, the machine yardstick) to ``--out``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["bench_acl", "register"]

SIDES = ("acl", "no_acl")


def _events(n: int, n_users: int, n_arms: int, start: int, seed: int) -> list[tuple[int, bytes]]:
    rng = random.Random(seed)
    return [(start + i, json.dumps({"event_id": f"e{start + i}", "user": str(rng.randrange(n_users)),
                                    "arm": str(rng.randrange(n_arms)), "reward": float(rng.random() < 0.3),
                                    "ts": 1.7e12 + start + i}).encode()) for i in range(n)]


def _web(state: Path, name: str, redis_url: str, env_settings: dict[str, str]) -> Any:
    from pipeline import services

    port = services.free_port()
    env = {**os.environ, **env_settings, "REDIS_URL": redis_url, "OPENBLAS_NUM_THREADS": "1"}
    env.pop("KAFKA_BOOTSTRAP", None)

    def ready() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/recommend?user=1&k=10")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    return services.start_process(name, [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], state,
                                  env=env, address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}",
                                  ready=ready, timeout=120)


def _requests(address: str, n: int, n_users: int, seed: int) -> float:
    """µs per sequential keep-alive ``GET /recommend`` (every answer checked: 200)."""
    host, port = address.rsplit(":", 1)
    rng = random.Random(seed)
    paths = [f"/recommend?user={rng.randrange(n_users)}&k=10" for _ in range(n)]
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    t0 = time.perf_counter()
    for path in paths:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {resp.status}")
    took = time.perf_counter() - t0
    conn.close()
    return took / n * 1e6


def bench_acl(*, rounds: int = 40, batch: int = 500, block: int = 100, d: int = 25, n_users: int = 10,
              n_arms: int = 1000) -> dict[str, Any]:
    """Measure both sides, interleaved; return the document written to ``acl.json``."""
    import redis

    from pipeline.config import acl
    from pipeline import services
    from pipeline.data.catalog import SyntheticCatalog
    from pipeline.ingestion.ingest import UserIngestProcessor
    from pipeline.config.settings import Settings
    from pipeline.release.stages import ReleaseStage, SolveStage
    from privrec.experiments.runner import machine_info

    machine = machine_info()
    catalog = SyntheticCatalog(n_users=n_users, d=d, n_arms=n_arms)
    with tempfile.TemporaryDirectory(prefix="privrec-bench-acl-") as tmp:
        state = Path(tmp)
        rules = acl.global_rules("aclon")
        creds = acl.new_credentials(list(rules))
        acl.write_aclfile(state / "redis", rules, creds)
        rds = services.start_redis(state)
        webs: dict[str, Any] = {}
        try:
            admin_url = acl.role_url(rds.url, "default", creds["default"])
            urls = {"acl": (acl.role_url(rds.url, "worker", creds["worker"]), acl.role_url(rds.url, "web", creds["web"])),
                    "no_acl": (admin_url, admin_url)}
            namespaces = {"acl": "aclon", "no_acl": "acloff"}
            settings = {side: Settings(namespace=ns, d=d, n_users=n_users, n_arms=n_arms, partitions=1,
                                       redis_url=urls[side][0]) for side, ns in namespaces.items()}
            clients = {side: redis.Redis.from_url(urls[side][0]) for side in SIDES}
            procs = {side: UserIngestProcessor(clients[side], namespaces[side], catalog) for side in SIDES}
            stages = {side: ReleaseStage(settings[side], catalog, clients[side]) for side in SIDES}
            for side in SIDES:  # a first release and model, so /recommend answers
                stages[side].tick(force=True)
                SolveStage(settings[side], clients[side], stages[side].statement).run()
                env = {"PRIVREC_NAMESPACE": namespaces[side], "PRIVREC_D": str(d), "PRIVREC_N_USERS": str(n_users),
                       "PRIVREC_N_ARMS": str(n_arms), "PRIVREC_PARTITIONS": "1", "PRIVREC_LOGLEVEL": "WARNING"}
                webs[side] = _web(state, f"web-{side}", urls[side][1], env)
            runs: dict[str, dict[str, list[float]]] = {s: {"ingest_us_per_event": [], "release_ms": [],
                                                          "recommend_us": [], "redis_hget_us": []} for s in SIDES}
            web_clients = {side: redis.Redis.from_url(urls[side][1]) for side in SIDES}
            offset = {s: 0 for s in SIDES}
            for r in range(rounds):
                for side in (SIDES if r % 2 == 0 else SIDES[::-1]):  # alternate which side goes first
                    msgs = _events(batch, n_users, n_arms, offset[side], seed=r)
                    offset[side] += batch
                    t0 = time.perf_counter()
                    procs[side].process(0, msgs)
                    runs[side]["ingest_us_per_event"].append((time.perf_counter() - t0) / batch * 1e6)
                    t0 = time.perf_counter()
                    stages[side].tick()
                    runs[side]["release_ms"].append((time.perf_counter() - t0) * 1e3)
                    runs[side]["recommend_us"].append(_requests(webs[side].address, block, n_users, seed=r))
                    meta = f"{namespaces[side]}:model:{{{namespaces[side]}:model}}:meta"
                    with web_clients[side].pipeline(transaction=False) as pipe:
                        for _ in range(2000):
                            pipe.hget(meta, "version")
                        t0 = time.perf_counter()
                        pipe.execute()
                    runs[side]["redis_hget_us"].append((time.perf_counter() - t0) / 2000 * 1e6)
            for c in [*clients.values(), *web_clients.values()]:
                c.close()
        finally:
            for h in webs.values():
                services.stop(h)
            services.stop(rds)
    medians = {s: {k: round(statistics.median(v), 2) for k, v in runs[s].items()} for s in SIDES}
    ratios = {k: round(statistics.median(a / b for a, b in zip(runs["acl"][k], runs["no_acl"][k])), 3)
              for k in medians["acl"]}
    return {"rounds": rounds, "batch": batch, "block": block, "d": d, "n_users": n_users,
            "n_arms": n_arms, "median": medians, "acl_over_no_acl": ratios,
            "runs": {s: {k: [round(x, 2) for x in v] for k, v in runs[s].items()} for s in SIDES},
            "machine": machine, "machine_after": machine_info()}


def register(bsub: Any) -> None:
    p = bsub.add_parser("acl", help="the cost of least privilege: ingest, release and /recommend with and without "
                                    "Redis ACL users, side by side",
                        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="output directory (acl.json)")
    p.add_argument("--rounds", type=int, default=40, help="interleaved rounds (default 40)")
    p.add_argument("--batch", type=int, default=500, help="events ingested per side and round (default 500)")
    p.add_argument("--block", type=int, default=100, help="GET /recommend per side and round (default 100)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    for name in ("rounds", "batch", "block"):
        if getattr(args, name) < 1:
            raise ValueError(f"`--{name}` must be at least 1, got {getattr(args, name)}.")
    doc = bench_acl(rounds=args.rounds, batch=args.batch, block=args.block)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "acl.json").write_text(json.dumps(doc, indent=2) + "\n")
    m, q = doc["median"], doc["acl_over_no_acl"]
    print(f"{'median of ' + str(doc['rounds']) + ' interleaved rounds':<40}{'ACL users':>12}{'no ACL':>12}{'ratio':>8}")
    for key, label in (("ingest_us_per_event", "ingest (µs per event)"), ("release_ms", "release tick (ms)"),
                       ("recommend_us", "GET /recommend (µs, sequential)"),
                       ("redis_hget_us", "Redis HGET, pipelined (µs)")):
        print(f"{label:<40}{m['acl'][key]:>12.2f}{m['no_acl'][key]:>12.2f}{q[key]:>8.3f}")
    print(f"machine yardstick: sum(range(1000)) takes {doc['machine']['python_speed_us']:.1f} µs before, "
          f"{doc['machine_after']['python_speed_us']:.1f} µs after")
    print(f"wrote {args.out}/acl.json", file=sys.stderr)
    return 0
