"""The typed keys of the web application's shared state (aiohttp's `web.AppKey`).

`pipeline.web` fills them when it builds the app; `pipeline.local_http` reads them. Typed keys
let a type checker see what each holds and keep aiohttp's `NotAppKeyWarning` quiet. The web
server's private state has its keys beside it: the metrics in `pipeline.web`, the shown lists'
writer in `pipeline.shown`.
"""

from __future__ import annotations

from aiohttp import web
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis as AsyncRedis

from models.local import LocalConfig

from .catalog import Catalog
from .federated_serving import SiteRouter
from .keys import PublicKeys
from .serving import Recommender
from .settings import Settings

__all__ = ["CATALOG", "KEYS", "LOCAL_CONFIG", "LOG_PRODUCER", "MODEL_KEYS", "PRODUCER", "RECOMMENDER", "REDIS",
           "SETTINGS"]

SETTINGS = web.AppKey("settings", Settings)
CATALOG = web.AppKey("catalog", Catalog)
KEYS = web.AppKey("keys", PublicKeys)  # this server's own namespace
# the namespaces users are served from: this one, or (federated, decentralized) each site's own
MODEL_KEYS: web.AppKey[list[PublicKeys]] = web.AppKey("model_keys")
RECOMMENDER: web.AppKey[Recommender | SiteRouter] = web.AppKey("recommender")
REDIS = web.AppKey("redis", AsyncRedis)
# None when the app runs without Kafka
PRODUCER: web.AppKey[AIOKafkaProducer | None] = web.AppKey("producer")
LOG_PRODUCER: web.AppKey[AIOKafkaProducer | None] = web.AppKey("log_producer")
LOCAL_CONFIG = web.AppKey("local_config", LocalConfig)
