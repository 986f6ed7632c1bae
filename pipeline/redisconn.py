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

__all__ = ["connect", "connect_async"]

_ERRORS = [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]


def connect(url: str, **kwargs: object) -> redis.Redis:
    """A blocking client of ``url`` with retries on connection errors."""
    return redis.Redis.from_url(url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                                retry_on_error=list(_ERRORS), **kwargs)  # type: ignore[arg-type]


def connect_async(url: str, **kwargs: object) -> aioredis.Redis:
    """An asyncio client of ``url`` with retries on connection errors."""
    return aioredis.Redis.from_url(url, retry=AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                                   retry_on_error=list(_ERRORS), **kwargs)  # type: ignore[arg-type]
