"""Checks and waits shared by the modes' start-up: topics, namespace settings, ingest offsets, workers ready."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis

from pipeline import services
from pipeline.services import ServiceHandle
from pipeline.config.settings import Settings

from .stackfile import POLL_SECONDS, TOPIC_PARTITIONS, OpsError, worker_status_key

__all__ = ["check_topic", "check_namespace", "create_stack_topics", "reset_after_new_broker", "reset_offsets",
           "wait_workers"]


def check_topic(address: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=address, client_id="privrec-ops")
    try:
        (desc,) = admin.describe_topics([topic])
    finally:
        admin.close()
    found = len(desc.get("partitions") or [])
    if found != partitions:
        raise OpsError(
            f"topic {topic!r} on {address} has {found} partitions but setting `partitions` "
            f"(PRIVREC_PARTITIONS) is {partitions}; ingest offsets are kept per partition, so "
            f"they must agree: use --partitions {found} or another broker")


def check_namespace(client: redis.Redis, settings: Settings, fingerprint: str) -> dict[str, Any] | None:
    """Refuse settings that differ from those the namespace was created with (read-only).

    The worker enforces the same rule when it starts (``TrustedStore.ensure_config``);
    checking here fails before any worker runs, with the same information.
    """
    from pipeline.state.trusted import TrustedKeys

    raw = client.get(TrustedKeys(settings.namespace).config)
    if raw is None:
        return None
    stored: dict[str, Any] = json.loads(raw)
    wanted = json.loads(json.dumps(settings.model_config() | {"catalog_fingerprint": fingerprint},
                                   sort_keys=True))
    if stored != wanted:
        diff = {k: {"stored": stored.get(k), "requested": wanted.get(k)}
                for k in sorted(set(stored) | set(wanted)) if stored.get(k) != wanted.get(k)}
        raise OpsError(
            f"namespace {settings.namespace!r} in {settings.redis_url} was created with other "
            f"model/privacy settings: {json.dumps(diff)}; start with the stored settings, "
            f"or use another --namespace")
    return stored


def reset_offsets(client: redis.Redis, settings: Settings) -> tuple[int, list[int | None]]:
    """Forget the namespace's stored ingest offsets (see :meth:`pipeline.state.trusted.TrustedStore.reset_offsets`).

    Called only right after starting the embedded broker, which is memory-only.
    """
    from pipeline.state.trusted import TrustedStore

    return TrustedStore(client, settings.namespace).reset_offsets(settings.partitions)


def create_stack_topics(settings: Settings, note: Callable[[str], None]) -> None:
    """Create the missing topics of a global- or local-mode stack; refuse an ``interactions`` of another size."""
    assert settings.kafka is not None
    topics = {"interactions": settings.partitions, **TOPIC_PARTITIONS}
    if settings.mode == "local":  # reports keyed by user; the shuffler's batches keyed by unit
        topics.update({"ldp-reports": settings.partitions, "ldp-shuffled": settings.partitions})
    created = services.create_topics(settings.kafka, topics)
    check_topic(settings.kafka, "interactions", settings.partitions)
    listed = ", ".join(f"{t} ({n})" for t, n in topics.items())
    kept = [t for t in topics if t not in created]
    note(f"topics   {listed}" + (f"; already there: {', '.join(kept)}" if kept else ""))


def reset_after_new_broker(client: redis.Redis, settings: Settings, stack: dict[str, Any],
                           note: Callable[[str], None]) -> None:
    """After starting a new (memory-only) broker: forget the namespace's ingest offsets, and say so."""
    counted, old_offsets = reset_offsets(client, settings)
    if any(o is not None for o in old_offsets):
        stack["offsets_reset"] = {"previous": old_offsets, "events_kept": counted}
        note(f"namespace {settings.namespace!r} keeps {counted} events counted by an earlier "
             f"run; the new (memory-only) broker's log starts at offset 0, so the stored "
             f"ingest offsets {old_offsets} were reset")


def wait_workers(client: redis.Redis, namespace: str, workers: list[ServiceHandle], partitions: int,
                  timeout: float) -> dict[str, list[int]]:
    """Wait until every worker has registered and their partitions cover the topic exactly once."""
    key = worker_status_key(namespace)
    deadline = time.monotonic() + timeout
    while True:
        for h in workers:
            if not services.is_running(h):
                raise OpsError(f"{h.name} (pid {h.pid}) exited while starting; {h.log_path}:\n"
                               f"{services.tail(h.log_path)}")
        raw = client.hmget(key, [h.name for h in workers])
        assigned: dict[str, list[int]] = {}
        for h, value in zip(workers, raw):
            if value is None:
                continue
            report = json.loads(value)
            if report.get("pid") == h.pid and report.get("partitions"):
                assigned[h.name] = sorted(report["partitions"])
        owned = [p for ps in assigned.values() for p in ps]
        if len(assigned) == len(workers) and sorted(owned) == list(range(partitions)):
            return assigned
        if time.monotonic() > deadline:
            missing = [h.name for h in workers if h.name not in assigned]
            h = next((w for w in workers if w.name in missing), workers[0])
            raise OpsError(f"workers not ready after {timeout:g} s (registered with partitions: {assigned}; "
                           f"waiting for {missing or 'a rebalance to settle'}); {h.log_path}:\n"
                           f"{services.tail(h.log_path)}")
        time.sleep(POLL_SECONDS)
