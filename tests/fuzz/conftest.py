"""Fuzzing fixtures: hypothesis profiles, the selection of the 10,000-example runs, and live web apps.

Two hypothesis profiles (registered in :mod:`.strategies`, applied per test):

* ``fuzz-default`` — 150 examples per target (``PRIVREC_FUZZ_EXAMPLES`` overrides), derandomized (the same
  examples on every run: CI is reproducible), no example database; all default targets take ~15 s;
* ``fuzz-slow`` — 10,000 examples per target, also derandomized.

Every target has a default test and a ``slow``-marked ``*_10k`` twin. The 10k twins run only when the
``-m`` expression names ``slow`` (``pytest -m slow tests/fuzz``) or ``PRIVREC_FUZZ_SLOW=1`` is set; the
default run deselects them (the rule of every ``slow`` test, in ``tests/conftest.py``).
The HTTP targets are also marked ``integration`` (they need ``redis-server``).

The HTTP fixture ``web`` starts a real ``redis-server`` (:func:`pipeline.services.start_redis`), seeds one
served model per namespace in-process through the pipeline's own stages (ingest → release → solve, the
worker's code without Kafka or faust), and serves three real apps (:func:`pipeline.apps.web.create_web_app`)
with aiohttp's ``TestServer``/``TestClient`` on one event loop:

* ``global`` — global mode, event-level privacy, 40 events ingested;
* ``userlevel`` — global mode, user-level privacy (the default mechanism) with ``cap_policy = reject``,
  so ``/feedback`` and ``/listen`` also go through the contribution-cap check and ``/budget`` through the
  ledger;
* ``local`` — local mode (``tree``): ``/report`` parses reports, ``/feedback`` and ``/listen`` refuse.

No Kafka: ``KAFKA_BOOTSTRAP`` is unset, the apps' producers are ``None``, and a request that passed every
check and would produce answers 503 "no Kafka producer configured" (documented in ``pipeline.apps.web``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from .webapps import D, N_ARMS, N_USERS, WebApps

def _seed(url: str, settings: Any, catalog: Any) -> None:
    """One release and its served model, as the worker makes them (in-process, no Kafka)."""
    import redis

    from pipeline.ingestion.ingest import IngestProcessor, UserIngestProcessor
    from pipeline.modes.local.release import LocalReleaseStage
    from pipeline.release.stages import ReleaseStage, SolveStage

    client = redis.Redis.from_url(url)
    try:
        release: Any
        if settings.mode == "local":
            release = LocalReleaseStage(settings, catalog, client)
        else:
            events = [json.dumps({"event_id": f"e{i}", "user": str(i % N_USERS), "arm": str(i % N_ARMS),
                                  "reward": float(i % 2), "ts": 1.7e12 + i}).encode() for i in range(40)]
            proc = (UserIngestProcessor if settings.user_level else IngestProcessor)(client, settings.namespace,
                                                                                     catalog)
            proc.process(0, list(enumerate(events)))
            release = ReleaseStage(settings, catalog, client)
        assert release.tick(force=True) is not None
        assert SolveStage(settings, client, release.statement).run() is not None
    finally:
        client.close()


@pytest.fixture(scope="session")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebApps]:
    """The three seeded apps over a real redis-server (skipped when ``redis-server`` is not installed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    from aiohttp.test_utils import TestClient, TestServer

    from pipeline import services
    from pipeline.data.catalog import SyntheticCatalog
    from pipeline.config.settings import Settings
    from pipeline.apps.web import create_web_app
    from pipeline.serve.auth import Tokens, new_token

    handle = services.start_redis(tmp_path_factory.mktemp("fuzz-redis"), appendonly=False)
    loop = asyncio.new_event_loop()
    clients: dict[str, Any] = {}
    try:
        catalog = SyntheticCatalog(n_users=N_USERS, d=D, n_arms=N_ARMS)
        base: dict[str, Any] = dict(d=D, n_users=N_USERS, n_arms=N_ARMS, epsilon=2.0, redis_url=handle.url, kafka=None)
        all_settings = {
            "global": Settings(namespace="fuzzglobal", privacy_unit="event", **base),
            "userlevel": Settings(namespace="fuzzuser", cap_policy="reject", user_cap=2, **base),
            "local": Settings(namespace="fuzzlocal", mode="local", **base),
        }
        assert all_settings["userlevel"].user_level
        tokens = Tokens(secret=new_token(), operator=new_token())  # as privrec up makes them
        for name, s in all_settings.items():
            _seed(handle.url, s, catalog)
            client = TestClient(TestServer(create_web_app(s, catalog, tokens=tokens), loop=loop), loop=loop)
            loop.run_until_complete(client.start_server())
            clients[name] = client
        yield WebApps(loop, clients, handle.url, all_settings, tokens)
    finally:
        for client in clients.values():
            loop.run_until_complete(client.close())
        loop.close()
        services.stop(handle)
