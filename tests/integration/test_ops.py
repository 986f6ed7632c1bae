"""``privrec up`` / ``status`` / ``down`` as a user runs them: the real CLI in a subprocess.

Real Tansu broker, real redis-server, real faust workers and HTTP server; nothing mocked.
A stack start costs ~5-9 s (the worker's group join), so the embedded-mode checks share one
sequence of commands and the external-services mode has one test of its own.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pipeline import services

from stacks import admin_url, alive, produce_synthetic as produce, released_events, wait_for

pytestmark = pytest.mark.integration

#: A small synthetic world, as flags (the pipeline tests use the same sizes as environment).
# a cap above the ticks these tests span: every event they produce is learned (counted in the release)
WORLD_FLAGS = ["--d", "5", "--n-users", "6", "--n-arms", "40", "--tick-seconds", "0.3", "--loglevel", "WARNING",
               "--user-cap", "8"]
CONTRACT_KEYS = ("kafka", "redis", "http", "processes")

_ns = itertools.count()


def _clean_env() -> dict[str, str]:
    """Our environment without pipeline settings, so only the flags a test passes count."""
    return {k: v for k, v in os.environ.items()
            if not (k.startswith("PRIVREC_") or k in ("KAFKA_BOOTSTRAP", "REDIS_URL"))}


def privrec(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "privrec.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env if env is not None else _clean_env())


def status_json(state: Path) -> tuple[int, dict[str, Any]]:
    proc = privrec("status", "--state-dir", str(state), "--json")
    return proc.returncode, json.loads(proc.stdout)


def healthz(http: str) -> int:
    try:
        with urllib.request.urlopen(f"{http}/healthz", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_up_status_refuse_down_then_up_again(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    up = privrec("up", "--state-dir", str(state), *WORLD_FLAGS)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        assert "page: http://127.0.0.1:" in up.stdout

        code, st = status_json(state)
        assert code == 0 and st["running"] is True
        assert all(k in st for k in CONTRACT_KEYS)
        assert set(st["processes"]) == {"kafka", "redis", "worker-0", "web"}
        assert all(alive(pid) for pid in st["processes"].values())
        assert st["kafka"].startswith("127.0.0.1:") and services.kafka_ready(st["kafka"])
        assert st["redis"].startswith("redis://127.0.0.1:") and services.redis_ready(admin_url(state))
        assert st["http"].startswith("http://127.0.0.1:")
        assert healthz(st["http"]) in (200, 503)  # 503 "starting" before the first model
        assert st["workers"]["worker-0"]["partitions"] == [0, 1, 2, 3]
        assert st["settings"]["d"] == 5 and st["external"] == {"kafka": False, "redis": False}
        for name, pid in st["processes"].items():
            assert (state / f"{name}.pid").read_text().strip() == str(pid)

        again = privrec("up", "--state-dir", str(state), *WORLD_FLAGS)
        assert again.returncode == 1
        assert "already running" in again.stderr
        assert status_json(state)[1]["processes"] == st["processes"]  # nothing new, nothing stopped

        produce(st["kafka"], 400, seed=1)
        wait_for(lambda: released_events(admin_url(state), "privrec") == 400, 60, "400 events released")
        wait_for(lambda: healthz(st["http"]) == 200, 30, "/healthz 200 once a model exists")
    finally:
        down = privrec("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert "stopped web" in down.stdout and down.stdout.index("web") < down.stdout.index("kafka")
    assert not any(alive(pid) for pid in st["processes"].values())
    assert not list(state.glob("*.pid")) and not list(state.glob("*.service.json"))
    assert not (state / "stack.json").exists()
    code, gone = status_json(state)
    assert code == 1 and gone["processes"] == {} and all(k in gone for k in CONTRACT_KEYS)

    # down then up on the same state dir: the processes stopped above are zombies (nobody
    # reaps them here) and must not count; redis keeps the statistics (AOF), and the new
    # memory-only broker's log must not be skipped as "already counted"
    up2 = privrec("up", "--state-dir", str(state), *WORLD_FLAGS)
    try:
        assert up2.returncode == 0, up2.stderr + up2.stdout
        assert "offsets" in up2.stdout and "reset" in up2.stdout
        _, st2 = status_json(state)
        assert set(st2["processes"]) == {"kafka", "redis", "worker-0", "web"}
        assert not set(st2["processes"].values()) & set(st["processes"].values())
        assert released_events(admin_url(state), "privrec") == 400
        produce(st2["kafka"], 300, seed=2)
        wait_for(lambda: released_events(admin_url(state), "privrec") == 700, 60, "400 + 300 events released")
    finally:
        down2 = privrec("down", "--state-dir", str(state))
    assert down2.returncode == 0
    assert not any(alive(pid) for pid in st2["processes"].values())
    assert not list(state.glob("*.pid"))


def test_external_services_start_no_broker_or_redis(tmp_path: Path, broker: services.ServiceHandle,
                                                    redis_server: services.ServiceHandle) -> None:
    state = tmp_path / "ext"
    ns = f"ops{next(_ns)}x{os.getpid()}"
    services.create_topics(broker.address, {"interactions": 4})  # the session broker may already have it
    # external endpoints through the environment, as a deployment would set them
    env = {**_clean_env(), "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": redis_server.url}
    up = privrec("up", "--state-dir", str(state), "--namespace", ns, "--redis-admin-url", redis_server.url, *WORLD_FLAGS,
                 env=env)  # the administrator creates the stack's ACL users
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        code, st = status_json(state)
        assert code == 0
        assert set(st["processes"]) == {"worker-0", "web"}
        assert st["kafka"] == broker.address and st["redis"] == redis_server.url
        assert st["external"] == {"kafka": True, "redis": True}
        assert not (state / "kafka.pid").exists() and not (state / "redis.pid").exists()
        assert not (state / "redis").exists()  # no redis data directory either
        assert healthz(st["http"]) in (200, 503)
    finally:
        down = privrec("down", "--state-dir", str(state), env=env)
    assert down.returncode == 0
    assert "kafka" not in down.stdout and "redis" not in down.stdout
    assert not any(alive(pid) for pid in st["processes"].values())
    assert services.is_running(broker) and services.is_running(redis_server)  # external: left alone


@pytest.mark.parametrize(("args", "env_extra", "setting"), [
    (["--epsilon", "-1"], {}, "epsilon"),
    (["--algorithm", "nope"], {}, "algorithm"),
    ([], {"PRIVREC_DELTA": "2"}, "delta"),
    (["--namespace", "a:b"], {}, "namespace"),
    (["--partitions", "x"], {}, "partitions"),
], ids=["flag_epsilon", "flag_algorithm", "env_delta", "flag_namespace", "flag_partitions"])
def test_invalid_settings_fail_before_anything_starts(tmp_path: Path, args: list[str], env_extra: dict[str, str],
                                                      setting: str) -> None:
    state = tmp_path / "bad"
    proc = privrec("up", "--state-dir", str(state), *args, env={**_clean_env(), **env_extra}, timeout=60)
    assert proc.returncode == 2
    assert f"setting `{setting}`" in proc.stderr
    assert not state.exists()  # not even the state directory: nothing started


def test_bad_worker_count_and_unreachable_external_kafka_start_nothing(tmp_path: Path) -> None:
    state = tmp_path / "bad"
    proc = privrec("up", "--state-dir", str(state), "--workers", "5", timeout=60)
    assert proc.returncode == 1 and "`--workers` must be between 1 and the partition count (4" in proc.stderr
    assert not state.exists()

    port = services.free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = privrec("up", "--state-dir", str(state), "--kafka", f"127.0.0.1:{port}", timeout=60)
    assert proc.returncode == 1 and f"Kafka at 127.0.0.1:{port}" in proc.stderr
    assert time.monotonic() - t0 < 30
    assert not list(state.glob("*.pid")) and not (state / "stack.json").exists()
    assert not (state / "redis").exists()  # the embedded redis was not started either


def test_status_and_down_of_an_empty_state_dir(tmp_path: Path) -> None:
    code, st = status_json(tmp_path)
    assert code == 1 and st["running"] is False and st["processes"] == {}
    assert all(k in st for k in CONTRACT_KEYS)
    proc = privrec("down", "--state-dir", str(tmp_path / "never"))
    assert proc.returncode == 0 and "nothing was running" in proc.stdout
