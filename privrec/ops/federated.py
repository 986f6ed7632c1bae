"""``privrec up --mode federated``: one worker per site, the star's coordinator, Redis ACL users.

Processes (besides the broker, Redis and web, which :mod:`privrec.ops.up` starts):

* ``site-0`` … ``site-{M-1}``: ``python -m pipeline.apps.worker`` with ``PRIVREC_SITE=i`` — each ingests its
  own topic ``interactions-site-<i>`` into its own namespace ``<ns>-site<i>`` and shares its releases
  on ``federated-updates`` (:mod:`pipeline.modes.federated.sites`);
* ``coordinator`` (star only): ``python -m pipeline.modes.federated.coordinator``.

Every process connects as its own ACL user (:mod:`pipeline.config.acl`, set by :mod:`privrec.ops.redis_users` as in
every mode): a site can read only its own namespace, the coordinator only its public keys, the web only public
kinds; the ``default`` user gets a password, kept with the others in ``<state>/redis-users.json`` (0600).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from pipeline import services
from pipeline.modes.federated.federation import site_namespace, site_topic
from pipeline.data.records import TOPICS
from pipeline.services import ServiceHandle
from pipeline.config.settings import Settings

from .stackfile import child_env, worker_status_key
from .workers import check_namespace, check_topic, reset_offsets, wait_workers

__all__ = ["start_federated", "federated_topics", "COORDINATOR"]

COORDINATOR = "coordinator"


def federated_topics(settings: Settings) -> dict[str, int]:
    """Each site's input topic (``partitions`` each) and ``federated-updates`` (one partition)."""
    return {**{site_topic(i): settings.partitions for i in range(settings.sites)}, TOPICS["federated_updates"]: 1}


def start_federated(settings: Settings, state: Path, *, catalog: Any, external: dict[str, bool],
                    stack: dict[str, Any], record: Callable[[str], None], started: list[ServiceHandle],
                    note: Callable[[str], None], took: Callable[[], str], loglevel: str | None,
                    timeout: float, urls: dict[str, str]) -> dict[str, str]:
    """Start the sites (and the coordinator); return the web process's environment.

    ``urls``: each role's Redis URL and ``admin`` (:func:`privrec.ops.redis_users.enable`).
    """
    assert settings.kafka is not None and settings.redis_url is not None
    topics = federated_topics(settings)
    services.create_topics(settings.kafka, topics)
    for t, n in topics.items():
        check_topic(settings.kafka, t, n)
    note(f"topics   {', '.join(f'{t} ({n})' for t, n in topics.items())}")
    star = settings.topology == "star"
    client = redis.Redis.from_url(urls["admin"], socket_timeout=10)
    try:
        site_handles: list[tuple[ServiceHandle, str]] = []
        for i in range(settings.sites):
            own = settings.replace(namespace=site_namespace(settings.namespace, i))
            check_namespace(client, own, catalog.fingerprint)
            if not external["kafka"]:
                counted, old = reset_offsets(client, own)
                if any(o is not None for o in old):
                    note(f"site {i} keeps {counted} events counted by an earlier run; its ingest offsets {old} "
                         f"were reset for the new (memory-only) broker")
        for i in range(settings.sites):
            name = f"site-{i}"
            env = child_env(settings.replace(site=i, redis_url=urls.get(f"site{i}", settings.redis_url)), state,
                            loglevel=loglevel)
            ns = site_namespace(settings.namespace, i)
            client.hdel(worker_status_key(ns), name)
            record(name)
            h = services.start_process(name, [sys.executable, "-m", "pipeline.apps.worker"], state,
                                       env={**env, "PRIVREC_WORKER_ID": name}, timeout=timeout)
            started.append(h)
            site_handles.append((h, ns))
        for h, ns in site_handles:
            assigned = wait_workers(client, ns, [h], settings.partitions, timeout)
            note(f"{h.name:<8} pid {h.pid}  {site_topic(int(h.name.split('-')[1]))} partitions "
                 f"{assigned[h.name]} {took()}")
        if star:
            env = child_env(settings.replace(redis_url=urls.get(COORDINATOR, settings.redis_url)), state,
                            loglevel=loglevel)
            key = worker_status_key(settings.namespace)
            client.hdel(key, COORDINATOR)
            record(COORDINATOR)
            h = services.start_process(COORDINATOR, [sys.executable, "-m", "pipeline.modes.federated.coordinator"], state, env=env,
                                       timeout=timeout, ready=lambda: client.hget(key, COORDINATOR) is not None)
            started.append(h)
            note(f"{COORDINATOR} pid {h.pid}  sums the sites' releases {took()}")
    finally:
        client.close()
    return child_env(settings.replace(redis_url=urls.get("web", settings.redis_url)), state, loglevel=loglevel)
