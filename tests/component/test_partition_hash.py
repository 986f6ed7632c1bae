"""partition_of's murmur2 is Kafka's default partitioner hash: the same value as kafka-python's, on any bytes."""

from __future__ import annotations

import random

from kafka.partitioner.default import murmur2 as kafka_murmur2

from pipeline.config.keys import murmur2, partition_of


def test_murmur2_equals_kafka_python_on_every_length_and_byte() -> None:
    rng = random.Random(0)
    keys = [bytes(rng.randrange(256) for _ in range(n)) for n in range(64) for _ in range(50)]
    keys += [f"u{u:07d}".encode() for u in range(2000)] + ["ü-user-é".encode(), b"\xff" * 7]
    assert [murmur2(k) for k in keys] == [kafka_murmur2(k) for k in keys]


def test_partition_of_is_the_default_partitioner_of_the_user_key() -> None:
    for user in ("42", "u0000001", "ünïcode", "x" * 37):
        for partitions in (1, 4, 7):
            assert partition_of(user, partitions) == (kafka_murmur2(user.encode()) & 0x7FFFFFFF) % partitions
