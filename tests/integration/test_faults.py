"""Faults that must cost nothing (issue 12): each against the real broker and a real redis-server, bounded in time.

* redis-server killed (SIGKILL) mid-stream and restarted on the same port from its append-only file: the worker
  retries with backoff and does not crash, the web answers 503 with Retry-After while Redis is down and 200 after,
  every event is counted exactly once (the exact statistics equal the offline computation), and every published
  release is the deterministic release of the events it covered (no version published twice with other values).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import redis

from pipeline.config import acl
from pipeline import services
from pipeline.state.trusted import TrustedKeys, TrustedStore

from stacks import (Stack, Stream, assert_exact, assert_releases_deterministic, http, offline_stats, open_stack,
                    produce, start_redis, synthetic_events, wait_for)

pytestmark = pytest.mark.integration

_ns = itertools.count()


def test_redis_kill9_and_restart_loses_nothing_and_redraws_nothing(tmp_path: Path,
                                                                     own_redis: services.ServiceHandle) -> None:
    with open_stack(tmp_path / "stack", own_redis.url, f"rf{next(_ns)}") as stack:
        _redis_fault(stack, own_redis, tmp_path)


def test_under_acl_a_redis_kill9_loses_nothing_and_redraws_nothing(tmp_path: Path) -> None:
    """The same fault with least privilege (issue 22): the worker and the web connect as their own ACL users, which
    the restarted redis-server loads again from its ACL file; the release is still made durable by the worker."""
    ns = f"rf{next(_ns)}"
    rules = acl.global_rules(ns)
    creds = acl.new_credentials(list(rules))
    acl.write_aclfile(tmp_path / "redis-own", rules, creds)
    with start_redis(tmp_path, name="redis-own") as rds, \
            open_stack(tmp_path / "stack", acl.role_url(rds.url, "default", creds["default"]), ns) as stack:
        stack.env["REDIS_URL"] = acl.role_url(rds.url, "worker", creds["worker"])
        _redis_fault(stack, rds, tmp_path, web_url=acl.role_url(rds.url, "web", creds["web"]))


def _redis_fault(stack: Stack, rds: services.ServiceHandle, tmp_path: Path, *, web_url: str | None = None) -> None:
    stack.env.update({"PRIVREC_EPSILON": "2", "PRIVREC_ALGORITHM": "colin"})
    worker = stack.start_worker()
    catalog = stack.catalog()
    web = _start_web(stack, web_url)  # before the stream: a slow start must not let it finish before the kill
    wait_for(lambda: http("GET", web.url + "/recommend?user=1&k=3", timeout=5)[0] == 200, 30, "the web to serve")
    stream = Stream(stack, list(synthetic_events(catalog, 3000, seed=4)), rate=600)
    wait_for(lambda: stack.released_count() > 600, 30, "a release in the middle of the stream")
    at_kill = stack.released_count()
    os.kill(rds.pid, 9)
    wait_for(lambda: not services.is_running(rds), 10, "redis-server to exit")
    time.sleep(2.0)  # the stream goes on while Redis is down
    assert services.is_running(worker), "the worker crashed while Redis was down"
    reply = http("GET", web.url + "/recommend?user=1&k=3", timeout=5)
    status, body, headers = reply.status, reply.body, reply.headers
    assert status == 503 and headers.get("Retry-After") == "1" and "Redis" in body["error"]["message"]
    assert at_kill < 3000
    port = int(rds.address.rsplit(":", 1)[1])
    back = services.start_redis(tmp_path, name="redis-own", port=port)  # the same data directory: the AOF
    try:
        stream.join()
        wait_for(lambda: stack.released_count() == 3000, 90, "all 3000 events in a release after Redis came back")
        stream.watcher.stop()
        assert services.is_running(worker) and services.is_running(web), "a process crashed"
        assert http("GET", web.url + "/recommend?user=1&k=3", timeout=5)[0] == 200  # the web reconnected by itself
        assert b"Redis unavailable" in Path(worker.log_path).read_bytes()
        assert int(assert_exact(stack, catalog, stream.produced).count.sum()) == 3000  # nothing lost or doubled
        assert_releases_deterministic(stack, catalog, stream.produced, stream.watcher, "colin")
        if web_url:  # the restarted server loaded the ACL users again: the web's user still reads no trusted key
            with pytest.raises(redis.exceptions.NoPermissionError):
                redis.Redis.from_url(web_url).get(TrustedKeys(stack.namespace).secret)
    finally:
        services.stop(web)
        services.stop(back)


def _start_web(stack: Stack, redis_url: str | None = None) -> services.ServiceHandle:
    port = services.free_port()
    env = {**os.environ, **stack.env, **({"REDIS_URL": redis_url} if redis_url else {})}
    return services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], stack.state_dir,
                                  env=env, address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}", timeout=60,
                                  ready=lambda: http("GET", f"http://127.0.0.1:{port}/healthz", timeout=5)[0]
                                  in (200, 503))


@pytest.mark.parametrize("point", ["release-persisted", "solve-before-write"])
def test_kill9_inside_a_release_or_a_solve_redraws_nothing_and_counts_nothing_twice(
        tmp_path: Path, redis_server: services.ServiceHandle, point: str) -> None:
    """The worker SIGKILLs itself at its 3rd pass through ``point`` (pipeline.config.faults); a new worker finishes the
    stream: the persisted release is published as it was, every version equals its deterministic release."""
    with open_stack(tmp_path, redis_server.url, f"kp{next(_ns)}") as stack:
        stack.env.update({"PRIVREC_EPSILON": "2", "PRIVREC_ALGORITHM": "colin"})
        faulty = dict(stack.env)
        stack.env["PRIVREC_FAULT"] = f"{point}@3"
        worker = stack.start_worker()
        stack.env.clear()
        stack.env.update(faulty)
        catalog = stack.catalog()
        stream = Stream(stack, list(synthetic_events(catalog, 2000, seed=6)), rate=800)
        wait_for(lambda: not services.is_running(worker), 30, f"the worker to kill itself at {point}")
        stack.workers.remove(worker)
        at_crash = stack.released_count()
        stack.start_worker("worker-1")
        stream.join()
        wait_for(lambda: stack.released_count() == 2000, 90, "all events in a release after the restart")
        stream.watcher.stop()
        assert at_crash < 2000
        assert_exact(stack, catalog, stream.produced)
        versions = assert_releases_deterministic(stack, catalog, stream.produced, stream.watcher, "colin")
        assert len(versions) >= 4


def test_two_workers_one_killed_its_partitions_move_and_the_statistics_stay_exact(
        tmp_path: Path, redis_server: services.ServiceHandle) -> None:
    with open_stack(tmp_path, redis_server.url, f"tw{next(_ns)}") as stack:
        stack.env.update({"PRIVREC_EPSILON": "2", "PRIVREC_ALGORITHM": "linucb"})
        first = stack.start_worker("worker-0")
        second = stack.start_worker("worker-1")
        status = f"{stack.namespace}:ops:{{{stack.namespace}:ops}}:workers"

        def owned(name: str) -> list[int]:
            raw = stack.client.hget(status, name)
            return json.loads(raw)["partitions"] if raw else []

        wait_for(lambda: owned("worker-0") and owned("worker-1"), 30, "both workers to own partitions")
        catalog = stack.catalog()
        stream = Stream(stack, list(synthetic_events(catalog, 3000, seed=8)), rate=600)
        wait_for(lambda: stack.released_count() > 500, 30, "a release in the middle of the stream")
        stack.kill9(second)
        stack.workers.remove(second)
        stream.join()
        wait_for(lambda: sorted(owned("worker-0")) == [0, 1, 2, 3], 60, "worker-0 to take every partition")
        wait_for(lambda: stack.released_count() == 3000, 90, "all events in a release with one worker left")
        stream.watcher.stop()
        assert services.is_running(first)
        assert_exact(stack, catalog, stream.produced)
        assert_releases_deterministic(stack, catalog, stream.produced, stream.watcher, "linucb")


def test_broker_restart_new_logs_are_neither_skipped_nor_counted_twice(
        tmp_path: Path, redis_server: services.ServiceHandle) -> None:
    """The embedded broker is memory-only: SIGKILL it and start a new one on the same port (empty logs, a new
    identity). Events produced to the new broker are counted exactly once; events already ingested stay counted;
    statistics, noise and releases are kept."""
    with open_stack(tmp_path, redis_server.url, f"br{next(_ns)}") as stack:
        stack.env.update({"PRIVREC_EPSILON": "2", "PRIVREC_ALGORITHM": "linucb"})
        worker = stack.start_worker()
        catalog = stack.catalog()
        s = stack.settings()
        first = produce(stack, list(synthetic_events(catalog, 800, seed=10)))
        wait_for(lambda: stack.released_count() == 800, 60, "the first 800 events in a release")
        old_identity = services.read_identity(stack.broker.address)
        port = int(stack.broker.address.rsplit(":", 1)[1])
        os.kill(stack.broker.pid, 9)
        wait_for(lambda: not services.is_running(stack.broker), 10, "the broker to exit")
        stack.broker = services.start_broker(tmp_path / "broker2", port=port)
        services.create_topics(stack.broker.address, {"interactions": s.partitions, "dead-letters": 1,
                                                      "recommendations": 1})
        assert services.read_identity(stack.broker.address) not in (None, old_identity)
        second = produce(stack, list(synthetic_events(catalog, 700, seed=11)))
        wait_for(lambda: stack.released_count() == 1500, 90, "all 1,500 events in a release")
        time.sleep(1.0)
        assert stack.released_count() == 1500 and services.is_running(worker)
        streamed, _ = TrustedStore(stack.client, s.namespace).snapshot(s.partitions, catalog.n_units, catalog.d)
        expected = offline_stats(catalog, first, s.partitions)
        later = offline_stats(catalog, second, s.partitions)
        np.testing.assert_array_equal(streamed.count, expected.count + later.count)
        np.testing.assert_allclose(streamed.b, expected.b + later.b, rtol=0, atol=1e-9)
        np.testing.assert_allclose(streamed.gram, expected.gram + later.gram, rtol=0, atol=1e-9)
        assert b"a new broker" in Path(worker.log_path).read_bytes()
