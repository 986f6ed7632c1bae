"""The shown lists written behind ``/recommend``'s answer (:mod:`pipeline.serve.shown`): what feedback sees, what a crash costs.

A real ``pipeline.apps.web`` app in its own process, over the session's broker and redis-server, with a model
published in-process by the worker's own stages. The write-behind window is held open (60 s, set on the
app's :class:`~pipeline.serve.shown.ShownLists` at start-up) so that lists are certainly pending when the test acts:

* a feedback on a pending list is accepted (202) and its event is on ``interactions``, though the list is
  not in Redis yet;
* ``kill -9`` with lists pending: after a restart a feedback on one of them answers 404 (the list is lost,
  and absent from ``recommendations``), while the feedback acknowledged before the crash is on
  ``interactions``;
* a clean stop (SIGTERM) writes the pending lists: after a restart they take feedback and are logged;
* the log's own window (``log_seconds``, held open at 60 s too): ``kill -9`` after the lists were stored costs
  only their log entries; they still take feedback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer

from pipeline import services
from pipeline.data.catalog import SyntheticCatalog
from pipeline.config.keys import PublicKeys
from pipeline.config.settings import Settings

from stacks import publish_model, wait_for

pytestmark = pytest.mark.integration

N_USERS, D, N_ARMS = 6, 5, 30

#: the app of ``pipeline.apps.web`` with its write-behind window set from argv (seconds) once it has started
LAUNCHER = """
import sys
from aiohttp import web
from pipeline.data.catalog import load_catalog
from pipeline.config.settings import Settings
from pipeline.serve.shown import SHOWN
from pipeline.apps.web import create_web_app

settings = Settings.from_mapping({})
app = create_web_app(settings, load_catalog(settings))

async def hold(app):
    app[SHOWN].flush_seconds = float(sys.argv[2])
    app[SHOWN].log_seconds = float(sys.argv[3])

app.on_startup.append(hold)  # after the clients' start-up, which made app[SHOWN]
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


class Web:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env, self.n = tmp, env, 0
        (tmp / "launch.py").write_text(LAUNCHER)
        self.handle: Any = None

    def start(self, window: float, log_window: float = 0.1) -> None:
        self.n += 1
        port = services.free_port()
        self.url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        self.handle = services.start_process(f"web{self.n}", [sys.executable, str(self.tmp / "launch.py"), str(port),
                                                              str(window), str(log_window)], self.tmp, env=self.env,
                                             ready=ready,
                                             timeout=60)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def recommend(self, user: str) -> dict[str, Any]:
        status, doc = self.call("GET", f"/recommend?user={user}&k=3")
        assert status == 200, doc
        return dict(doc)


@pytest.fixture
def web(tmp_path: Path, broker: services.ServiceHandle, redis_server: services.ServiceHandle) -> Iterator[Web]:
    services.create_topics(broker.address, {"interactions": 4, "recommendations": 1})
    ns = f"shown{os.getpid()}"
    s = Settings(namespace=ns, d=D, n_users=N_USERS, n_arms=N_ARMS, epsilon=2.0, privacy_unit="event",
                 redis_url=redis_server.url, kafka=broker.address)
    publish_model(redis_server.url, s, SyntheticCatalog(n_users=N_USERS, d=D, n_arms=N_ARMS))
    env = {**os.environ, "REDIS_URL": redis_server.url, "KAFKA_BOOTSTRAP": broker.address, "PRIVREC_NAMESPACE": ns,
           "PRIVREC_CATALOG": "synthetic", "PRIVREC_D": str(D), "PRIVREC_N_USERS": str(N_USERS),
           "PRIVREC_N_ARMS": str(N_ARMS), "PRIVREC_PRIVACY_UNIT": "event", "PRIVREC_LOGLEVEL": "WARNING"}
    w = Web(tmp_path, env)
    w.keys = PublicKeys(ns)  # type: ignore[attr-defined]
    w.redis = redis.Redis.from_url(redis_server.url)  # type: ignore[attr-defined]
    try:
        yield w
    finally:
        if w.handle is not None:
            services.stop(w.handle, grace_seconds=5)
        w.redis.close()  # type: ignore[attr-defined]


def _on_topic(broker: services.ServiceHandle, topic: str, wanted: set[str], field: str) -> set[str]:
    """Which of ``wanted`` (values of ``field``) are on ``topic`` (read to its end)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.address, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000)
    found = set()
    try:
        for msg in consumer:
            value = json.loads(msg.value).get(field)
            if value in wanted:
                found.add(value)
    finally:
        consumer.close()
    return found


def test_feedback_on_a_pending_list_writes_it_at_once_and_a_crash_loses_only_pending_lists(
        web: Web, broker: services.ServiceHandle) -> None:
    r: redis.Redis = web.redis  # type: ignore[attr-defined]
    keys: PublicKeys = web.keys  # type: ignore[attr-defined]
    web.start(window=60.0)
    answered, unanswered = web.recommend("1"), web.recommend("2")
    for rec in (answered, unanswered):  # held back by the 60 s window: not in Redis yet
        assert r.get(keys.recommendation(rec["rec_id"])) is None
    item = answered["items"][0]["item"]
    status, acc = web.call("POST", "/feedback", {"rec_id": answered["rec_id"], "item": item, "reward": 1.0})
    assert status == 202, acc
    assert acc["event_id"].startswith(answered["rec_id"])
    # the feedback wrote its list at once (ingest matches a feedback against the stored list), and only its list
    stored = r.get(keys.recommendation(answered["rec_id"]))
    assert stored is not None and json.loads(stored)["items"] == [it["item"] for it in answered["items"]]
    assert r.get(keys.recommendation(unanswered["rec_id"])) is None
    status, again = web.call("POST", "/feedback", {"rec_id": answered["rec_id"], "item": item, "reward": 1.0})
    assert status == 409, again  # claimed once

    os.kill(web.handle.pid, signal.SIGKILL)  # a crash with the other list pending
    wait_for(lambda: not services.is_running(web.handle), 10, "the killed server to exit")
    web.start(window=0.01)
    status, lost = web.call("POST", "/feedback", {"rec_id": unanswered["rec_id"],
                                                  "item": unanswered["items"][0]["item"], "reward": 0.0})
    assert status == 404 and lost["error"]["parameter"] == "rec_id", lost  # the crash cost the pending list
    assert _on_topic(broker, "recommendations", {unanswered["rec_id"]}, "rec_id") == set()  # never logged
    # the feedback acknowledged before the crash reaches interactions: it was in the durable outbox, which the
    # restarted server's forwarder drains (pipeline/serve/outbox.py)
    wait_for(lambda: _on_topic(broker, "interactions", {acc["event_id"]}, "event_id") == {acc["event_id"]}, 30,
             "the acknowledged feedback on interactions")


def test_a_clean_stop_writes_the_pending_lists(web: Web, broker: services.ServiceHandle) -> None:
    r: redis.Redis = web.redis  # type: ignore[attr-defined]
    keys: PublicKeys = web.keys  # type: ignore[attr-defined]
    web.start(window=60.0)
    recs = [web.recommend(str(u)) for u in range(3)]
    assert all(r.get(keys.recommendation(rec["rec_id"])) is None for rec in recs)
    services.stop(web.handle, grace_seconds=20)  # SIGTERM: the app's cleanup writes what is pending
    for rec in recs:
        stored = r.get(keys.recommendation(rec["rec_id"]))
        assert stored is not None and json.loads(stored)["items"] == [it["item"] for it in rec["items"]]
        assert 0 < r.ttl(keys.recommendation(rec["rec_id"])) <= 24 * 3600
    ids = {rec["rec_id"] for rec in recs}
    assert wait_for(lambda: _on_topic(broker, "recommendations", ids, "rec_id") == ids, 20, "the lists' log")
    web.start(window=0.01)
    rec = recs[0]
    status, acc = web.call("POST", "/feedback", {"rec_id": rec["rec_id"], "item": rec["items"][1]["item"],
                                                 "reward": 0.0})
    assert status == 202, acc


def test_a_crash_after_the_store_costs_only_the_log_entries(web: Web, broker: services.ServiceHandle) -> None:
    r: redis.Redis = web.redis  # type: ignore[attr-defined]
    keys: PublicKeys = web.keys  # type: ignore[attr-defined]
    web.start(window=0.01, log_window=60.0)  # stored at once, logged only after 60 s
    recs = [web.recommend(str(u)) for u in range(2)]
    wait_for(lambda: all(r.get(keys.recommendation(rec["rec_id"])) is not None for rec in recs), 10,
             "the lists stored in Redis")
    os.kill(web.handle.pid, signal.SIGKILL)  # a crash with both lists stored and their log entries queued
    wait_for(lambda: not services.is_running(web.handle), 10, "the killed server to exit")
    web.start(window=0.01)
    ids = {rec["rec_id"] for rec in recs}
    assert _on_topic(broker, "recommendations", ids, "rec_id") == set()  # the crash cost the log entries
    rec = recs[0]
    status, acc = web.call("POST", "/feedback", {"rec_id": rec["rec_id"], "item": rec["items"][0]["item"],
                                                 "reward": 1.0})
    assert status == 202, acc  # ... and nothing else: the stored list takes feedback
