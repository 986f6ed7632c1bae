"""Real services for integration tests: a Tansu broker and a redis-server.

Both are started once per test session by :mod:`pipeline.services`, on loopback, on free
ports, with their PID files and logs in a pytest temporary directory, and stopped by PID at
teardown (which pytest runs also when tests fail or the run is interrupted). Tests that need
a clean slate use ``redis_client`` (flushes the database) and ``new_topic`` (a fresh,
uniquely named topic); ``stack`` is a pipeline of the test's own (:func:`stacks.open_stack`), and
``own_redis`` a redis-server of the test's own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from pipeline import services
from pipeline.services import ServiceHandle
from stacks import Stack, open_stack, start_redis


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """State directory of the session's services (PID files, logs, redis data)."""
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def broker(services_dir: Path) -> Iterator[ServiceHandle]:
    """A memory-only Tansu broker; ``broker.address`` is the bootstrap ``host:port``."""
    handle = services.start_broker(services_dir)
    try:
        yield handle
    finally:
        services.stop(handle)


@pytest.fixture(scope="session")
def redis_server(services_dir: Path) -> Iterator[ServiceHandle]:
    """A redis-server with AOF on; ``redis_server.url`` is ``redis://127.0.0.1:PORT/0``."""
    with start_redis(services_dir) as handle:
        yield handle


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[ServiceHandle]:
    """A redis-server of this test's own (one it may kill, restart or give ACL users), AOF on, its data in
    ``tmp_path / "redis-own"`` (a restart with ``services.start_redis(tmp_path, name="redis-own", port=...)`` loads
    it again)."""
    with start_redis(tmp_path, name="redis-own") as handle:
        yield handle


@pytest.fixture
def redis_client(redis_server: ServiceHandle) -> Iterator[redis.Redis]:
    """A client of the session's redis-server, on an emptied database."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def new_topic(broker: ServiceHandle, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory: ``new_topic(partitions=4)`` creates a topic unique to this test and returns its name."""
    counter = itertools.count()
    base = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]

    def make(partitions: int = 4) -> str:
        name = f"{base}-{next(counter)}"
        services.create_topics(broker.address, {name: partitions})
        return name

    return make


_stack_ids = itertools.count()


@pytest.fixture
def stack(tmp_path: Path, redis_server: ServiceHandle, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A fresh broker (its topics start empty) and a fresh namespace on the session's redis-server, every worker the
    test starts stopped at the end: :func:`stacks.open_stack` with the test module's ``STACK``, a dict of its keyword
    arguments (``env``, ``partitions``, ``world``), when the module has one. A module that needs another kind of
    stack defines its own fixture of this name."""
    with open_stack(tmp_path, redis_server.url, f"st{next(_stack_ids)}", **getattr(request.module, "STACK", {})) as st:
        yield st
