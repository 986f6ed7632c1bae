"""User-level privacy against the real broker and redis-server: clipping, the cap, the ledger, the metrics.

A user pushed past the cap stops changing the released statistics, and ``/budget``, the web's and the
worker's ``/metrics`` say so (and ``promtool check metrics`` accepts both); kill -9 of the worker and a
restart: the ledger continues — nothing reset, nothing counted twice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from models.streaming import ReleasedStats
from pipeline import services
from pipeline.config.keys import PublicKeys
from pipeline.config.ledger import LedgerRecord
from privrec.ops.stackfile import read_tokens, stack_tokens

from stacks import REPO, Stack, http, shown_as_served, wait_for

pytestmark = pytest.mark.integration

USER_WORLD = {"PRIVREC_D": "4", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "20", "PRIVREC_TICK_SECONDS": "0.4",
              "PRIVREC_LOGLEVEL": "WARNING", "PRIVREC_PRIVACY_UNIT": "user",
              "PRIVREC_MODEL": "flat"}  # the flat model's clipping of b (the hierarchy's: test_hierarchy_stack.py)
STACK = {"partitions": 2, "world": USER_WORLD, "env": {"PRIVREC_PARTITIONS": "2"}}  # the `stack` fixture's (conftest.py)


def _send(stack: Stack, user: str, n: int, tag: str) -> None:
    """``n`` events of ``user``, all with the same unit context and reward 1 (unclipped: a sum of norm n)."""
    x = [0.5, 0.5, 0.5, 0.5]
    prod = stack.producer()
    events = [{"event_id": f"{tag}-{i}", "user": user, "arm": "1", "context": x, "reward": 1.0, "ts": 1.7e12 + i}
              for i in range(n)]
    for ev in shown_as_served(stack, events):  # the flat model: each answers a list recorded as served
        prod.send("interactions", key=user.encode(), value=json.dumps(ev).encode())
    prod.flush()
    prod.close()


def _record(stack: Stack, user: str) -> LedgerRecord:
    keys = PublicKeys(stack.namespace)
    for p in range(2):
        raw = stack.client.hget(keys.ledger_participation(p), user)
        if raw is not None:
            return LedgerRecord.loads(raw)
    return LedgerRecord()


def _released(stack: Stack) -> ReleasedStats:
    return ReleasedStats.from_mapping(stack.released())


def _pending_empty(stack: Stack) -> bool:
    return all(stack.client.hlen(f"{stack.namespace}:trusted:{{{stack.namespace}:p{p}}}:pending") == 0
               for p in range(2))


def _counted(stack: Stack) -> int:
    keys = [f"{stack.namespace}:trusted:{{{stack.namespace}:p{p}}}:offset" for p in range(2)]
    return sum(int(v or 0) for v in stack.client.mget(keys))


def test_a_user_past_the_cap_stops_changing_the_releases_and_everyone_says_so(stack: Stack) -> None:
    stack.env.update({"PRIVREC_EPSILON": "inf", "PRIVREC_USER_CAP": "3"})
    stack.start_worker()
    stack._sent = 0  # type: ignore[attr-defined]
    snapshots = []
    for r in range(5):
        _send(stack, "1", 4, f"r{r}")
        stack._sent += 4  # type: ignore[attr-defined]
        wait_for(lambda: _counted(stack) >= stack._sent and _pending_empty(stack), 30,  # type: ignore[attr-defined]
                 f"round {r} folded")
        time.sleep(0.5)  # the fold's release (or none, at the cap) is published
        snapshots.append((_record(stack, "1").k, _released(stack)))
    ks = [k for k, _ in snapshots]
    assert ks[-1] == 3 and ks == sorted(ks) and ks[0] >= 1  # at most one participation per tick, then the cap
    capped_at = ks.index(3)
    b_at_cap = snapshots[capped_at][1].b_tilde.reshape(6, 4)[1]
    for k, rel in snapshots[capped_at:]:  # past the cap: user 1's statistics no longer change
        assert np.array_equal(rel.b_tilde.reshape(6, 4)[1], b_at_cap)
        assert int(rel.count[1]) == int(snapshots[capped_at][1].count[1])
    # per-tick clipping: three ticks of 4 events of norm 1 each add at most norm 1 (unclipped: 12)
    assert np.linalg.norm(b_at_cap) <= 3.0 + 1e-9
    assert np.linalg.norm(b_at_cap) == pytest.approx(3.0, rel=1e-9)  # same direction each tick: exactly 3
    summary = stack.client.hgetall(PublicKeys(stack.namespace).ledger_summary(_partition_of(stack, "1")))
    assert int(summary[b"dropped"]) == 20 - int(snapshots[capped_at][1].count[1])
    # the web process (its own /budget and /metrics) and the worker's /metrics
    web = _start_web(stack)
    try:
        base = f"http://{web.address}"
        token = read_tokens(stack.state_dir).for_user("1")  # user 1's own token (the web's secret, _start_web)
        b = wait_for(lambda: (r := http("GET", f"{base}/budget?user=1", token=token, timeout=5)).status == 200 and r.body,
                     30, "the web's budget")
        assert b["user"]["at_cap"] is True and b["user"]["ticks_this_epoch"] == 3 and b["user"]["cap"] == 3
        assert b["ledger"]["users_at_cap"] == 1 and b["ledger"]["capped_events"] == int(summary[b"dropped"])
        web_metrics = http("GET", f"{base}/metrics", timeout=5).expect(200)
        assert "privrec_users_at_cap 1.0" in web_metrics
        status = f"{stack.namespace}:ops:{{{stack.namespace}:ops}}:workers"
        worker_url = json.loads(stack.client.hget(status, "worker-0"))["metrics"]
        worker_metrics = http("GET", worker_url, timeout=5).expect(200)
        assert "privrec_users_at_cap 1.0" in worker_metrics
        assert "privrec_releases_total" in worker_metrics and "privrec_events_ingested_total 20.0" in worker_metrics
        promtool = shutil.which("promtool")
        assert promtool, "promtool is missing: scripts/bootstrap.sh installs Debian's prometheus package"
        for text in (web_metrics, worker_metrics):
            out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
    finally:
        services.stop(web, grace_seconds=5)


def test_the_ledger_class_counts_follow_the_records_also_when_rebuilt(stack: Stack) -> None:
    """The fold's per-class user counts equal the participation records counted afresh, after users reach the cap
    and after the counts were deleted (a namespace from before them: the next fold rebuilds them); the ledger's
    figures from the counts equal those from the records."""
    from pipeline.config.ledger import class_counts
    from pipeline.config.metrics import ledger_figures

    stack.env.update({"PRIVREC_EPSILON": "2", "PRIVREC_USER_CAP": "2"})
    stack.start_worker()
    keys = PublicKeys(stack.namespace)
    sent = 0
    for r in range(4):
        for user in [str(u) for u in range(3 + r % 3)]:
            _send(stack, user, 2, f"c{r}-{user}")
            sent += 2
        wait_for(lambda: _counted(stack) >= sent and _pending_empty(stack), 30, f"round {r} folded")
        if r == 1:  # nothing pending: no fold is under way that could write the counts back half-built
            assert all(stack.client.exists(keys.ledger_classes(p)) for p in range(2))
            stack.client.delete(*[keys.ledger_classes(p) for p in range(2)])
    for p in range(2):
        kept = {k.decode(): int(v) for k, v in stack.client.hgetall(keys.ledger_classes(p)).items() if int(v)}
        assert kept == dict(class_counts(stack.client.hvals(keys.ledger_participation(p))))

    def records_only(key: str) -> dict[bytes, bytes]:
        return {} if key.endswith(":classes") else stack.client.hgetall(key)

    args: dict[str, Any] = {"epoch": 0, "cap": 2, "mu_cap": 1.0, "delta": 1e-5, "ratio": lambda k: min(k, 2) / 2}
    from_classes = ledger_figures(stack.client.hgetall, stack.namespace, 2, **args)
    assert from_classes == ledger_figures(records_only, stack.namespace, 2, **args)
    assert from_classes["users"] == 5 and from_classes["users_at_cap"] == 4  # users 0 to 3: two ticks or more and from_classes["capped_events"] > 0


def test_kill9_and_restart_the_ledger_continues_nothing_counted_twice(stack: Stack) -> None:
    stack.env.update({"PRIVREC_EPSILON": "inf", "PRIVREC_USER_CAP": "10"})
    worker = stack.start_worker()
    sent = 0
    for r in range(2):
        _send(stack, "2", 3, f"a{r}")
        sent += 3
        wait_for(lambda: _counted(stack) >= sent and _pending_empty(stack), 30, f"round {r} folded")  # noqa: B023
    k_before = _record(stack, "2").k
    assert 1 <= k_before <= 2
    stack.kill9(worker)
    _send(stack, "2", 3, "during")  # waits in Kafka while no worker runs
    sent += 3
    stack.start_worker("worker-1")
    for r in range(2):
        wait_for(lambda: _counted(stack) >= sent and _pending_empty(stack), 40, "the restart folded")  # noqa: B023
        _send(stack, "2", 3, f"b{r}")
        sent += 3
    wait_for(lambda: _counted(stack) >= sent and _pending_empty(stack), 40, "the last round folded")
    wait_for(lambda: int(_released(stack).count[2]) == sent, 20, "every event of user 2 released")
    rec = _record(stack, "2")
    assert rec.k > k_before  # continued, not reset
    assert rec.k <= 5  # five sends: at most five participations (never two folds of one tick)
    assert int(_released(stack).count.sum()) == sent  # below the cap nothing is dropped, nothing counted twice


def _partition_of(stack: Stack, user: str) -> int:
    keys = PublicKeys(stack.namespace)
    return next(p for p in range(2) if stack.client.hexists(keys.ledger_participation(p), user))


def _start_web(stack: Stack) -> services.ServiceHandle:
    port = services.free_port()
    tokens = stack_tokens(stack.state_dir, {})  # as privrec up gives them to the web server
    env = {**__import__("os").environ, **stack.env, "PYTHONPATH": str(REPO), **tokens.env()}
    return services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--host", "127.0.0.1", "--port",
                                          str(port)], stack.state_dir, env=env, address=f"127.0.0.1:{port}",
                                  ready=lambda: http("GET", f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200)
