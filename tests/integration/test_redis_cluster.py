"""The stack against a three-node Redis Cluster started by the test (issue 12).

Every Lua script's keys and every transaction's keys share one hash slot (the key layout puts a
partition's, the release's and the model's keys under one hash tag each), so ingest, release, solve and
serving run unchanged on a cluster client: the statistics equal the offline computation, every release its
deterministic recomputation, and the web serves from the cluster.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import services
from privrec.ops.stackfile import stack_tokens

from stacks import Stream, assert_exact, assert_releases_deterministic, open_stack, synthetic_events, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[services.ServiceHandle]]:
    handles = services.start_redis_cluster(tmp_path / "cluster", nodes=3)
    yield handles
    for h in handles:
        services.stop(h)


def test_the_stack_runs_on_a_three_node_redis_cluster(tmp_path: Path, cluster: list[services.ServiceHandle]) -> None:
    with open_stack(tmp_path / "stack", cluster[0].url, "cl") as stack:
        stack.env.update({"PRIVREC_EPSILON": "2", "PRIVREC_ALGORITHM": "colin"})
        stack.start_worker()
        catalog = stack.catalog()
        stream = Stream(stack, list(synthetic_events(catalog, 1500, seed=12)), rate=1000)
        stream.join()
        wait_for(lambda: stack.released_count() == 1500, 90, "all events in a release")
        stream.watcher.stop()
        client = stack.client
        assert type(client).__name__ == "RedisCluster"
        nodes = {client.keyslot(k) for k in (f"cl:trusted:{{cl:p{p}}}:stats" for p in range(4))}
        assert len(nodes) > 1  # the partitions' keys are spread over slots (and nodes)
        assert_exact(stack, catalog, stream.produced)
        assert_releases_deterministic(stack, catalog, stream.produced, stream.watcher, "colin")
        # and the web serves from the cluster
        port = services.free_port()
        tokens = stack_tokens(stack.state_dir, {})  # as privrec up gives them to the web server
        web = services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)],
                                     stack.state_dir, env={**os.environ, **stack.env, **tokens.env()}, timeout=60,
                                     address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}",
                                     ready=lambda: _ok(f"http://127.0.0.1:{port}/healthz"))
        try:
            assert _ok(f"http://127.0.0.1:{port}/recommend?user=1&k=3")
            assert _ok(f"http://127.0.0.1:{port}/budget?user=1", tokens.for_user("1"))
        finally:
            services.stop(web)


def _ok(url: str, token: str | None = None) -> bool:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
