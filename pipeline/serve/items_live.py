"""New items while the stack runs: ``POST /items``, the compacted ``items`` topic, and its followers.

``POST /items`` (operator only: ``Authorization: Bearer $PRIVREC_ADMIN_TOKEN``) takes
``{"item": id, "name": text?, "tags": [label, ...]?, "features": [d numbers]?}`` (``tags`` or ``features``;
features win). Features from tags come from the catalog's fitted tag transform
(:meth:`pipeline.data.catalog_open.OpenCatalog.features_from_tags`), so the new item lands in the space of the
built ones. The server publishes ``{"item", "name", "tags", "features"}`` (features always filled in) to the
``items`` topic, keyed by the item id (compacted: the log keeps the last message of every id).

Every worker and every web server process follows the topic from its beginning (:func:`follow_items`) and
appends each new item to its catalog (:meth:`~pipeline.data.catalog_open.OpenCatalog.add_items`). Workers add an
item as soon as they read it (ingest then accepts feedback whose shown list holds it); web servers add it one
release tick after it was published, so that by the time ``/recommend`` shows it the workers (polling every
0.2 s) know it: a new item is recommendable within two release ticks. A malformed message on the topic is skipped;
the workers send it to ``dead-letters`` with the reason, once (a Redis ``SET NX`` per topic offset decides
which worker). Items are immutable: a message for a known id is ignored.

The set of items is public (the catalog is public data, DESIGN); adding one reads no one's data and spends
no privacy. The item term's reward sums are sized at start for :attr:`OpenCatalog.item_capacity` items, so
every release's sensitivity and guarantee are those of the start (docs/privacy.md: new items).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition

from .appkeys import CATALOG, PRODUCER, SETTINGS
from .httpio import error as _error
from ..data.catalog import Catalog
from ..config.kafkaconn import client_kwargs
from ..data.records import MAX_ID_CHARS, TOPICS, dead_letter_value
from ..config.settings import Settings

__all__ = ["ITEMS_TOPIC", "ADMIN_TOKEN_ENV", "MalformedItem", "parse_item", "item_message", "add_routes",
           "ensure_items_topic", "follow_items", "register", "MAX_ITEM_ID"]

log = logging.getLogger(__name__)

#: The compacted topic of items added while running (key: item id).
ITEMS_TOPIC = "items"
#: The operator token that ``POST /items`` requires as ``Authorization: Bearer <token>``.
ADMIN_TOKEN_ENV = "PRIVREC_ADMIN_TOKEN"
#: Longest item id accepted (characters): the stack's id limit, as feedback and ingest take it.
MAX_ITEM_ID = MAX_ID_CHARS


class MalformedItem(ValueError):
    """An item that cannot be added; ``field`` names the offending field."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message if field is None else f"`{field}`: {message}")
        self.field = field
        self.message = message


def parse_item(obj: Any, catalog: Catalog) -> tuple[str, str, list[str], np.ndarray]:
    """``(item, name, tags, features)`` of a ``POST /items`` body or an ``items`` message, checked.

    Raises
    ------
    MalformedItem
        Naming the field: not an object, ``item`` missing or not a non-empty string, ``name`` not a string,
        ``tags`` not a list of non-empty strings or none known to the tag transform, ``features`` not ``d``
        finite numbers, neither ``tags`` nor ``features``, or a catalog that takes no new items.

    Examples
    --------
    >>> from pipeline.data.catalog import SyntheticCatalog
    >>> parse_item({"item": "x", "features": [1, 0]}, SyntheticCatalog(n_users=1, d=2, n_arms=2))
    Traceback (most recent call last):
    ...
    pipeline.serve.items_live.MalformedItem: the 'synthetic' catalog takes no new items (start the stack with --catalog DIR)
    """
    if not isinstance(obj, dict):
        raise MalformedItem(None, 'must be a JSON object {"item", "name", "tags" or "features"}')
    if not hasattr(catalog, "add_items"):
        raise MalformedItem(None, f"the {catalog.name!r} catalog takes no new items (start the stack with "
                                  f"--catalog DIR)")
    item = obj.get("item")
    if not isinstance(item, str) or not item.strip():
        raise MalformedItem("item", "is required: a non-empty item id string")
    item = item.strip()
    if len(item) > MAX_ITEM_ID or not _utf8(item):
        raise MalformedItem("item", f"must be valid text of at most {MAX_ITEM_ID} characters")
    name = obj.get("name", "")
    if name is None:
        name = ""
    if not isinstance(name, str) or not _utf8(name):
        raise MalformedItem("name", "must be a string")
    tags = obj.get("tags")
    if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() and _utf8(t)
                                                                   for t in tags)):
        raise MalformedItem("tags", "must be a list of non-empty strings")
    tags = [t.strip() for t in tags or []]
    feats = obj.get("features")
    d = catalog.d
    if feats is not None:
        if (not isinstance(feats, list) or len(feats) != d
                or not all(type(v) in (int, float) for v in feats)):
            raise MalformedItem("features", f"must be a list of d = {d} numbers")
        try:
            x = np.asarray([float(v) for v in feats], dtype=np.float64)
        except OverflowError:
            raise MalformedItem("features", "holds an integer too large for a float") from None
        if not all(math.isfinite(v) for v in x):
            raise MalformedItem("features", "must be finite numbers")
        if not np.any(x):
            raise MalformedItem("features", "must not be all zero")
    elif tags:
        try:
            x = catalog.features_from_tags([tags])[0]  # type: ignore[attr-defined]
        except ValueError as exc:
            raise MalformedItem("tags", str(exc)) from None
    else:
        raise MalformedItem("tags", "an item needs non-empty `tags` or `features`")
    return item, name, tags, x


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def item_message(item: str, name: str, tags: Sequence[str], features: np.ndarray) -> bytes:
    """The ``items`` topic value (features as plain floats: ``repr`` round-trips exactly)."""
    return json.dumps({"item": item, "name": name, "tags": list(tags), "features": [float(v) for v in features]},
                      ensure_ascii=False).encode("utf-8")


def ensure_items_topic(kafka_kwargs: dict[str, Any]) -> None:
    """Create the ``items`` topic (1 partition, ``cleanup.policy=compact``) unless it exists."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    kw = {k: v for k, v in kafka_kwargs.items() if k in ("bootstrap_servers", "security_protocol", "sasl_mechanism",
                                                         "sasl_plain_username", "sasl_plain_password")}
    admin = KafkaAdminClient(**kw, client_id="privrec-items")
    try:
        if ITEMS_TOPIC in admin.list_topics():
            return
        try:
            admin.create_topics([NewTopic(ITEMS_TOPIC, 1, 1, topic_configs={"cleanup.policy": "compact"})])
        except TopicAlreadyExistsError:
            pass
    finally:
        admin.close()


async def post_items(request: web.Request) -> web.Response:
    """``POST /items``: validate, publish to ``items`` (keyed by id), add to this server's catalog; 202."""
    token = os.environ.get(ADMIN_TOKEN_ENV, "")
    if not token:
        return _error(403, None, f"adding items is disabled: the operator sets {ADMIN_TOKEN_ENV} for the server")
    given = request.headers.get("Authorization", "")
    if not (given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), token.encode())):
        resp = _error(401, "Authorization", f"must be 'Bearer <the operator token {ADMIN_TOKEN_ENV}>'")
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        return _error(400, "body", 'must be a JSON object {"item", "name", "tags" or "features"}')
    catalog = request.app[CATALOG]
    try:
        item, name, tags, x = parse_item(body, catalog)
    except MalformedItem as exc:
        return _error(400, exc.field or "body", exc.message)
    if item in getattr(catalog, "_arm_rows", {}):
        return _error(409, "item", f"item {item!r} is already in the catalog (items are immutable)")
    producer = request.app[PRODUCER]
    if producer is None:
        return _error(503, None, "no Kafka producer configured (KAFKA_BOOTSTRAP)")
    await producer.send_and_wait(ITEMS_TOPIC, key=item.encode("utf-8"), value=item_message(item, name, tags, x))
    # served from the topic (every web process alike), one release tick from now: the workers know it by then
    return web.json_response({"accepted": True, "item": item, "features": [float(v) for v in x],
                              "recommendable_in_seconds": request.app[SETTINGS].tick_seconds}, status=202)


async def follow_items(settings: Settings, catalog: Catalog, *, dead_letters: Any = None, redis_client: Any = None,
                       poll_ms: int = 200, delay: float = 0.0) -> None:
    """Append every item of the ``items`` topic to ``catalog``, from the beginning, until cancelled.

    ``delay``: add an item only ``delay`` seconds after it was published (the message's timestamp).

    With ``dead_letters`` (an ``AIOKafkaProducer``) and ``redis_client``, a malformed message goes to
    ``dead-letters`` with its reason, once across the followers (``SET NX`` on :func:`_dead_key`).
    """
    kw = client_kwargs(settings)
    await asyncio.get_running_loop().run_in_executor(None, ensure_items_topic, kw)
    consumer = AIOKafkaConsumer(**kw, enable_auto_commit=False, group_id=None)
    await consumer.start()
    tp = TopicPartition(ITEMS_TOPIC, 0)
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        waiting: list[tuple[float, str, str, np.ndarray]] = []  # (due, item, name, features), in log order
        while True:
            batches = await consumer.getmany(timeout_ms=poll_ms)
            for records in [*batches.values(), []]:  # (the empty batch: add the waiting items now due)
                ids: list[str] = []
                names: list[str] = []
                rows: list[np.ndarray] = []
                now = time.time()
                while waiting and waiting[0][0] <= now:
                    _, item, name, x = waiting.pop(0)
                    ids.append(item)
                    names.append(name)
                    rows.append(x)
                for r in records:
                    if r.value is None:  # a tombstone: items are never removed
                        continue
                    try:
                        item, name, _, x = parse_item(json.loads(r.value), catalog)
                    except (MalformedItem, ValueError, RecursionError) as exc:
                        reason = f"malformed item: {exc}"
                        log.warning("items topic offset %d: %s", r.offset, reason)
                        if dead_letters is not None and redis_client is not None and redis_client.set(
                                _dead_key(settings.namespace, r.offset), 1, nx=True):
                            await dead_letters.send_and_wait(TOPICS["dead_letters"], value=dead_letter_value(
                                r.value, reason, r.topic, r.partition, r.offset))
                        continue
                    due = r.timestamp / 1000.0 + delay
                    if waiting or due > now:
                        waiting.append((due, item, name, x))
                        continue
                    ids.append(item)
                    names.append(name)
                    rows.append(x)
                if ids:
                    added = catalog.add_items(ids, np.vstack(rows), names)  # type: ignore[attr-defined]
                    if added:
                        log.info("%d new items from the items topic (now %d)", len(added),
                                 len(catalog.feature_matrix))
    finally:
        await consumer.stop()


def _dead_key(namespace: str, offset: int) -> str:
    """The operational key that claims the dead letter of ``items`` offset ``offset`` (``ops`` kind, its slot)."""
    return f"{namespace}:ops:{{{namespace}:ops}}:items-dead:{offset}"


def add_routes(app: web.Application) -> None:
    """``POST /items``, and (a catalog directory with Kafka) the follower of the ``items`` topic."""
    app.router.add_post("/items", post_items)
    app.cleanup_ctx.append(_follower)


async def _follower(app: web.Application) -> Any:
    s: Settings = app[SETTINGS]
    task = None
    if s.kafka and hasattr(app[CATALOG], "add_items"):
        task = asyncio.create_task(follow_items(s, app[CATALOG], delay=s.tick_seconds))
    yield
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def register(app: Any, settings: Settings, catalog: Catalog) -> None:
    """A worker's follower of the ``items`` topic (a faust app task), dead-lettering malformed messages."""
    if not hasattr(catalog, "add_items"):
        return

    @app.task
    async def items_task() -> None:
        from aiokafka import AIOKafkaProducer

        from ..config.redisconn import connect

        producer = AIOKafkaProducer(**client_kwargs(settings))
        await producer.start()
        try:
            await follow_items(settings, catalog, dead_letters=producer,
                               redis_client=connect(settings.redis_url or "redis://127.0.0.1:6379/0"))
        finally:
            await producer.stop()
