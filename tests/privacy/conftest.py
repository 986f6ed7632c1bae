"""Fixtures of the privacy audit: a real ``redis-server`` of its own, and the ``slow`` twins kept opt-in.

The redis-server is started once per session on a free loopback port (no AOF: nothing here needs
durability) and stopped by PID (:func:`pipeline.services.stop`). The larger ``slow`` versions of the audit
run only when the ``-m`` expression names ``slow`` (``pytest -m slow tests/privacy``); the default run
deselects them (the rule of every ``slow`` test, in ``tests/conftest.py``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import redis

from pipeline import services

@pytest.fixture(scope="session")
def audit_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A client of a fresh redis-server (skipped when ``redis-server`` is not installed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    handle = services.start_redis(tmp_path_factory.mktemp("audit-redis"), appendonly=False)
    client = redis.Redis.from_url(handle.url)
    try:
        yield client
    finally:
        client.close()
        services.stop(handle)
