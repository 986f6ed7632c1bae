"""``privrec replay lastfm`` against a live LastFM stack (broker, redis, worker, HTTP server)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pipeline import services
from privrec.cli import main
from producers.lastfm.raw import resolve_data_dir

from stacks import REPO, wait_for

pytestmark = pytest.mark.integration


def _data_available() -> bool:
    try:
        resolve_data_dir(None)
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def lastfm_stack(tmp_path_factory: pytest.TempPathFactory, redis_server: services.ServiceHandle) -> Iterator[str]:
    if not _data_available():
        pytest.skip("the HetRec LastFM data directory is not available (set PRIVREC_DATA_DIR)")
    tmp = tmp_path_factory.mktemp("lastfm")
    broker = services.start_broker(tmp)
    services.create_topics(broker.address, {"interactions": 4, "dead-letters": 1, "recommendations": 1})
    env = {**os.environ, "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": redis_server.url, "PRIVREC_NAMESPACE": "lf",
           "PRIVREC_CATALOG": "lastfm", "PRIVREC_EPSILON": "inf", "PRIVREC_TICK_SECONDS": "0.3",
           "PRIVREC_PRIOR_STRENGTH": "10000",  # the public prior through the worker's solve stage and /budget
           "PRIVREC_STATE_DIR": str(tmp), "PRIVREC_LOGLEVEL": "WARNING", "PYTHONPATH": str(REPO)}
    client = redis.Redis.from_url(redis_server.url)
    started = []
    try:
        started.append(services.start_process(
            "worker-0", [sys.executable, "-m", "pipeline.apps.worker"], tmp, env=env, timeout=90,
            ready=lambda: bool(client.hgetall("lf:ops:{lf:ops}:workers"))))
        port = services.free_port()
        web = services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], tmp,
                                     env=env, address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}")
        started.append(web)
        yield web.url
    finally:
        for h in reversed(started):
            services.stop(h, grace_seconds=5)
        services.stop(broker)


def test_replay_writes_reward_ratio_and_learns(lastfm_stack: str, tmp_path: Path) -> None:
    out = tmp_path / "replay"
    assert main(["replay", "lastfm", "--events", "1500", "--out", str(out), "--http", lastfm_stack,
                 "--no-progress"]) == 0
    doc = json.loads((out / "replay.json").read_text())
    assert doc["events"] == 1500
    assert doc["random_reward"] == pytest.approx(1500 / 25)  # every pool has 25 artists
    assert doc["ratio"] == pytest.approx(doc["reward"] / doc["random_reward"])
    assert doc["last_model_version"] > doc["first_model_version"]  # the model moved during the replay
    assert doc["model"]["algorithm"] == "linucb" and doc["privacy"]["private"] is False
    assert doc["model"]["prior"] == {"strength": 10000.0, "reward": 0.04}  # served with the catalog's prior
    assert (out / "replay.png").stat().st_size > 0
    # every feedback reached the model: the released statistics count the replayed events
    wait_for(lambda: _released(lastfm_stack) >= 1500, 30, "the replayed events in a release")


def _released(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{url}/budget") as resp:
        return int(json.loads(resp.read())["events_released"])


def test_replay_without_an_api_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if not _data_available():
        pytest.skip("LastFM data not available")
    monkeypatch.delenv("PRIVREC_HTTP_URL", raising=False)
    rc = main(["replay", "lastfm", "--events", "5", "--out", str(tmp_path), "--state-dir", str(tmp_path / "none"),
               "--no-progress"])
    assert rc == 2
    assert "no API URL" in capsys.readouterr().err
