"""Redis clients that ride out a Redis restart: a dead pooled connection is retried on a new one.

A command that fails with a connection error or a timeout is retried up to three times with exponential
backoff (50 ms doubling, at most 1 s); callers still see the error if Redis stays down (the worker then
backs off and re-reads from the stored offsets, the web answers 503 with ``Retry-After``).
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

__all__ = ["connect", "connect_async", "is_cluster"]

_ERRORS = [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]


_CLUSTER: dict[str, bool] = {}


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a node of a Redis Cluster (asked once per URL: ``INFO cluster``)."""
    if url not in _CLUSTER:
        probe = redis.Redis.from_url(url, socket_timeout=5)
        try:
            _CLUSTER[url] = bool(probe.info("cluster").get("cluster_enabled"))
        except redis.exceptions.RedisError:
            return False  # not reachable now: a plain client (it will retry); ask again next time
        finally:
            probe.close()
    return _CLUSTER[url]


def connect(url: str, **kwargs: object) -> redis.Redis:
    """A blocking client of ``url`` with retries on connection errors (a cluster client for a cluster node).

    In a cluster every script's keys and every transaction's keys share a hash slot: the key layout
    (:mod:`pipeline.config.keys`) puts each partition's, the release's and the model's keys under one hash tag.
    """
    if is_cluster(url):
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                                     **kwargs)  # type: ignore[return-value,arg-type]
    return redis.Redis.from_url(url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                                retry_on_error=list(_ERRORS), **kwargs)  # type: ignore[arg-type]


def connect_async(url: str, **kwargs: object) -> aioredis.Redis:
    """An asyncio client of ``url`` with retries on connection errors (a cluster client for a cluster node)."""
    if is_cluster(url):
        from redis.asyncio.cluster import RedisCluster as AsyncCluster

        return AsyncCluster.from_url(url, **kwargs)  # type: ignore[return-value,arg-type]
    return aioredis.Redis.from_url(url, retry=AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                                   retry_on_error=list(_ERRORS), **kwargs)  # type: ignore[arg-type]
