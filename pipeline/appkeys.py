"""The typed keys of the web application's shared state (aiohttp's `web.AppKey`).

`pipeline.web` fills them when it builds the app; `pipeline.local_http` reads them. Typed keys
let a type checker see what each holds and keep aiohttp's `NotAppKeyWarning` quiet.
"""

from __future__ import annotations

from aiohttp import web
from aiokafka import AIOKafkaProducer
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from models.local import LocalConfig

from .catalog import Catalog
from .keys import PublicKeys
from .settings import Settings

__all__ = ["CATALOG", "KEYS", "LOCAL_CONFIG", "LOG_PRODUCER", "METRICS", "MODEL_KEYS", "PRODUCER",
           "RECOMMENDER", "REDIS", "SETTINGS", "SHOWN", "SYNC"]

SETTINGS = web.AppKey("settings", Settings)
CATALOG = web.AppKey("catalog", Catalog)
KEYS = web.AppKey("keys", PublicKeys)  # this server's own namespace
MODEL_KEYS = web.AppKey("model_keys", list)  # list[PublicKeys]: the namespaces users are served from
RECOMMENDER = web.AppKey("recommender", object)  # Recommender, or SiteRouter in federated mode
SYNC = web.AppKey("sync", Redis)  # the recommender's blocking client
REDIS = web.AppKey("redis", AsyncRedis)
SHOWN = web.AppKey("shown", object)  # pipeline.web._ShownLists
METRICS = web.AppKey("metrics", object)  # pipeline.web._Metrics
PRODUCER = web.AppKey("producer", AIOKafkaProducer)  # None when the app runs without Kafka
LOG_PRODUCER = web.AppKey("log_producer", AIOKafkaProducer)
LOCAL_CONFIG = web.AppKey("local_config", LocalConfig)
