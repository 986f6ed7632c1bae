"""The typed keys of the web application's shared state (aiohttp's `web.AppKey`).

`pipeline.apps.web` fills them when it builds the app; `pipeline.modes.local.local_http` reads them. Typed keys
let a type checker see what each holds and keep aiohttp's `NotAppKeyWarning` quiet. The web
server's private state has its keys beside it: the metrics in `pipeline.apps.web`, the shown lists'
writer in `pipeline.serve.shown`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis as AsyncRedis

from models.local import LocalConfig

from ..data.catalog import Catalog
from ..config.keys import PublicKeys
from .serving import Recommender
from ..config.settings import Settings
from .auth import Tokens

if TYPE_CHECKING:  # an annotation only: serving does not import a mode
    from ..modes.federated.federated_serving import SiteRouter

__all__ = ["CATALOG", "KEYS", "LOCAL_CONFIG", "LOG_PRODUCER", "MODEL_KEYS", "PRODUCER", "RECOMMENDER", "REDIS",
           "SETTINGS", "TOKENS"]

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
# the secret of the user tokens and the operator token (pipeline.serve.auth): who may read a per-user view
TOKENS = web.AppKey("tokens", Tokens)
