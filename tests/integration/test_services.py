"""The embedded services, started for real: Tansu broker, redis-server, PID bookkeeping."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pipeline import services
from pipeline.services import PortInUseError, ServiceError, ServiceHandle

pytestmark = pytest.mark.integration


def _pid_gone(pid: int) -> bool:
    """No process ``pid``, or only a zombie (a stopped service reparented to init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _consume_all(address: str, topic: str, expected: int, timeout: float = 10.0) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


# --- Kafka -----------------------------------------------------------------------------


def test_kafka_round_trip_keeps_every_event_and_key_partitioning(
    broker: ServiceHandle, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=4)
    sent = {
        f"e{i}": json.dumps({"event_id": f"e{i}", "user": f"u{i % 7}", "reward": i % 2}).encode()
        for i in range(200)
    }
    producer = KafkaProducer(bootstrap_servers=broker.address, linger_ms=5)
    try:
        for i, (event_id, value) in enumerate(sent.items()):
            producer.send(topic, key=f"u{i % 7}".encode(), value=value)
        producer.flush(timeout=10)
    finally:
        producer.close()

    records = _consume_all(broker.address, topic, expected=len(sent))

    assert sorted(r.value for r in records) == sorted(sent.values())
    partitions_by_key: dict[bytes, set[int]] = {}
    for r in records:
        partitions_by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions_by_key.values()), partitions_by_key
    assert len({r.partition for r in records}) > 1  # 7 keys spread over 4 partitions


def test_create_topics_sets_partitions_and_is_idempotent(broker: ServiceHandle) -> None:
    assert services.create_topics(broker.address, {"svc-idem": 3}) == ["svc-idem"]
    assert services.create_topics(broker.address, {"svc-idem": 5, "svc-other": 2}) == ["svc-other"]

    consumer = KafkaConsumer(bootstrap_servers=broker.address)
    try:
        assert consumer.partitions_for_topic("svc-idem") == {0, 1, 2}
        assert consumer.partitions_for_topic("svc-other") == {0, 1}
    finally:
        consumer.close()


def test_create_topics_rejects_zero_partitions(broker: ServiceHandle) -> None:
    with pytest.raises(ValueError, match="partitions must be >= 1, got 0"):
        services.create_topics(broker.address, {"svc-zero": 0})


def test_second_broker_on_a_taken_port_fails_instead_of_reusing_the_first(
    broker: ServiceHandle, tmp_path: Path
) -> None:
    # The taken port answers Kafka requests, so only the socket-ownership check can tell.
    with pytest.raises(PortInUseError, match="kafka exited"):
        services.start_broker(tmp_path, port=broker.port)
    assert services.read_handles(tmp_path) == {}
    assert services.kafka_ready(broker.address)


# --- Redis -----------------------------------------------------------------------------


def test_redis_set_get(redis_client: redis.Redis) -> None:
    assert redis_client.set("{t}:k", b"\x00\x01") is True
    assert redis_client.get("{t}:k") == b"\x00\x01"
    assert redis_client.config_get("appendonly") == {"appendonly": "yes"}


def test_redis_aof_survives_restart_on_same_dir(tmp_path: Path) -> None:
    first = services.start_redis(tmp_path)
    client = redis.Redis.from_url(first.url)
    client.set("kept", "1")
    client.hset("h", mapping={"a": "x", "b": "y"})
    client.close()
    assert services.stop(first) is True
    assert list((tmp_path / "redis" / "appendonlydir").iterdir())

    second = services.start_redis(tmp_path)
    try:
        client = redis.Redis.from_url(second.url)
        assert client.get("kept") == b"1"
        assert client.hgetall("h") == {b"a": b"x", b"b": b"y"}
        client.close()
    finally:
        services.stop(second)


def test_redis_retries_on_a_fresh_port_when_the_picked_one_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind((services.LOOPBACK, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken, services.free_port()])
        # start_on_free_port (pipeline.services.process) picks the ports
        monkeypatch.setattr(services.process, "free_port", lambda host=services.LOOPBACK: next(picks))

        handle = services.start_redis(tmp_path)
        try:
            assert handle.port != taken
            assert services.redis_ready(handle.url)
            assert "Address already in use" in handle.log_path.read_text()
        finally:
            services.stop(handle)


# --- process bookkeeping ---------------------------------------------------------------


def test_stop_leaves_no_process_and_no_pid_files(tmp_path: Path) -> None:
    broker = services.start_broker(tmp_path)
    server = services.start_redis(tmp_path)
    assert int((tmp_path / "kafka.pid").read_text()) == broker.pid
    (tmp_path / "settings.json").write_text("{}")  # other files may share the directory
    assert set(services.read_handles(tmp_path)) == {"kafka", "redis"}

    # a handle listed but removed before it is read (the supervisor between a crash and the restart): left out
    (tmp_path / "worker-0.service.json").symlink_to(tmp_path / "gone.service.json.tmp")
    assert set(services.read_handles(tmp_path)) == {"kafka", "redis"}
    (tmp_path / "worker-0.service.json").unlink()

    assert services.stop_all(tmp_path) == ["redis", "kafka"]  # last started, first stopped

    assert _pid_gone(broker.pid) and _pid_gone(server.pid)
    assert not services.is_running(broker) and not services.is_running(server)
    assert services.read_handles(tmp_path) == {}
    assert not list(tmp_path.glob("*.pid"))
    with socket.socket() as sock:  # the port is free again
        sock.bind((services.LOOPBACK, broker.port))
    assert services.stop(broker) is False  # stopping twice is harmless


def test_stop_never_kills_a_process_it_did_not_start(
    broker: ServiceHandle, tmp_path: Path
) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        # A stale handle whose PID now belongs to someone else.
        stale = replace(broker, name="stale", pid=stranger.pid, log_path=tmp_path / "stale.log")
        assert services.is_running(stale) is False
        assert services.stop(stale, grace_seconds=0.1) is False
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_start_failure_quotes_the_log_and_cleans_up(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match=r"(?s)exit code 3.*boom on stderr"):
        services.start_process(
            "bad",
            ["sh", "-c", "echo boom on stderr >&2; exit 3"],
            tmp_path,
            ready=lambda: False,  # without a probe, "launched" already counts as ready
            timeout=10,
        )
    assert services.read_handles(tmp_path) == {}


def test_start_timeout_stops_the_process(tmp_path: Path) -> None:
    address = f"{services.LOOPBACK}:{services.free_port()}"  # `sleep` never listens there
    with pytest.raises(ServiceError, match=r"mute \(pid \d+\) was not ready .* after 0.3 s") as err:
        services.start_process("mute", ["sleep", "30"], tmp_path, address=address, timeout=0.3)
    pid = int(str(err.value).split("(pid ")[1].split(")")[0])
    assert _pid_gone(pid)
    assert services.read_handles(tmp_path) == {}


def test_start_refuses_a_name_that_is_already_running(tmp_path: Path) -> None:
    first = services.start_process("solo", ["sleep", "30"], tmp_path)
    try:
        with pytest.raises(ServiceError, match=f"solo is already running \\(pid {first.pid}"):
            services.start_process("solo", ["sleep", "30"], tmp_path)
        assert services.is_running(first)
    finally:
        assert services.stop(first, grace_seconds=2) is True
