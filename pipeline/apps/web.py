"""The HTTP API and the web page: ``python -m pipeline.apps.web`` (settings from the environment).

Routes (DESIGN §7):

* ``GET /recommend?user=U&k=K[&candidates=a,b,c]`` →
  ``{"user", "rec_id", "model_version", "items": [{"item", "name", "score", "mean", "bonus"}]}``;
  without candidates the catalog's default pool is ranked. The shown list is
  logged to the ``recommendations`` topic and kept (24 h) so feedback can name it, both written
  behind the answer in batches (:mod:`pipeline.serve.shown`: what a crash may cost).
* ``POST /feedback`` with ``{"rec_id", "item", "reward"}`` → records the interaction in the
  durable outbox (a Redis stream; :mod:`pipeline.serve.outbox` forwards it to ``interactions``, also after
  a broker outage) → ``202`` ``{"accepted", "event_id", "learning"}``; federated stacks produce it directly
  (acknowledged by the broker). ``learning`` says whether the interaction will be learned from, and if not why
  (``"cap"``, ``"budget"``; :func:`pipeline.serve.budget_view.learning`); ``POST /listen`` answers the same.
  One feedback per shown list. Redis not answering: ``503`` with ``Retry-After``. ``cap_policy = reject``: ``403``
  for a user at the cap, with the same ``learning`` beside the error.
* ``GET /budget[?user=U]`` — the privacy guarantee of the released statistics,
  releases so far, and for a user the guarantee covering all their interactions. ``?user=U`` answers only a
  caller presenting ``Authorization: Bearer <U's token or the operator token>`` (:mod:`pipeline.serve.auth`):
  ``401`` without a token, ``403`` with another one.
* ``POST /session`` — a new user and their token (``201 {"user", "token"}``) on a catalog that takes new users;
  ``409`` on a catalog with a fixed list of users (a listed user's token comes from the operator).
* ``GET /metrics`` (Prometheus), ``GET /healthz``, ``GET /users``, and the page at ``/``.
* ``GET /openapi.json`` — the OpenAPI 3 document of every route (:mod:`pipeline.serve.openapi`).

Errors are JSON ``{"error": {"parameter": ..., "message": ...}}`` with 400
(bad parameter), 404 (unknown user or rec_id), 409 (feedback repeated) or
503 (no model yet). Recommendation scoring reads only ``{ns}:model:*`` keys
(:mod:`pipeline.serve.serving`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import secrets
import signal
import time
import uuid
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis
import uvloop
from aiohttp import web
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from models.accounting import event_from_dict

from ..serve.appkeys import CATALOG, KEYS, LOG_PRODUCER, MODEL_KEYS, PRODUCER, RECOMMENDER, REDIS, SETTINGS, TOKENS
from ..serve.auth import Tokens, bearer
from ..data.catalog import Catalog, UnknownArmError, UnknownUserError, load_catalog
from ..serve.httpio import BodyError, Field, check_id, error as _error, read_body
from ..serve.httpstats import RequestStats
from ..modes.federated.federated_serving import SiteRouter, federated_view, interactions_topic, model_namespaces
from ..modes.federated.federation import site_namespace
from ..serve.budget_view import (LEARNED, BudgetQuery, global_view, learning, ledger_overview, release_history,
                                serving_isolation)
from ..config.keys import PublicKeys, partition_of
from ..config.kafkaconn import PRODUCE_TIMEOUT_MS, client_kwargs
from ..config.redisconn import connect, connect_async
from ..serve.items_live import add_routes as add_items_routes
from ..modes.local.local_http import add_routes as add_local_routes, local_view, refuse_raw_reward, with_contexts
from ..serve.openapi import add_routes as add_openapi_routes
from ..serve.outbox import OUTBOX, BrokerUnavailable, accept, observe_outbox, outbox_metrics, start_forwarding, stop_forwarding
from ..data.records import TOPICS
from ..serve.serving import MAX_K, BadRequest, ModelNotReadyError, Recommender
from ..serve.shown import SHOWN, ShownLists
from ..config.settings import Settings

__all__ = ["create_web_app", "main"]

log = logging.getLogger("privrec.web")
STATIC = Path(__file__).parent / "static"
REC_TTL_SECONDS = 24 * 3600


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # requests and their latency: plain counts, Prometheus families at scrape time (pipeline/serve/httpstats.py)
        self.http = RequestStats(self.registry)
        self.observe = self.http.observe
        self.feedback = Counter("privrec_feedback_total", "Feedback accepted", ["reward"], registry=self.registry)
        self.listens = Counter("privrec_listens_total", "Organic listens accepted (POST /listen)",
                               registry=self.registry)
        self.model_version = Gauge("privrec_model_version", "Version of the served model", registry=self.registry)
        self.released_events = Gauge("privrec_released_events", "Interactions in the latest release",
                                     registry=self.registry)
        self.dead_letters = Gauge("privrec_dead_letters", "Malformed events sent to dead-letters",
                                  registry=self.registry)
        self.users_at_cap = Gauge("privrec_users_at_cap", "Users at the contribution cap in the current epoch",
                                  registry=self.registry)
        self.users_at_budget = Gauge("privrec_users_at_budget", "Users at their lifetime budget (user_budget)",
                                     registry=self.registry)
        self.spent_max = Gauge("privrec_budget_spent_max_epsilon", "Largest privacy loss (epsilon) of any user",
                               registry=self.registry)
        self.spent_median = Gauge("privrec_budget_spent_median_epsilon", "Median privacy loss (epsilon) of the "
                                  "users with at least one contribution", registry=self.registry)
        self.shown_lost = Gauge("privrec_shown_lists_lost", "Shown lists whose write-behind to Redis failed since "
                                "this server process started (feedback on them answers 404)", registry=self.registry)
        self.outbox = outbox_metrics(self.registry)


def create_web_app(settings: Settings, catalog: Catalog, *, client: redis.Redis | None = None,
                   tokens: Tokens | None = None) -> web.Application:
    """The aiohttp application (the Kafka producer starts with the app).

    ``tokens``: who may read per-user views (:mod:`pipeline.serve.auth`); ``None`` reads ``PRIVREC_TOKEN_SECRET``
    and ``PRIVREC_OPERATOR_TOKEN`` from the environment, and without a secret makes one for this app alone.
    """
    if settings.redis_url is None:
        raise ValueError("setting `redis_url` (REDIS_URL) is required to serve")
    sync = client or connect(settings.redis_url)
    app = web.Application(middlewares=[_observe])
    app[SETTINGS] = settings
    app[CATALOG] = catalog
    app[KEYS] = PublicKeys(settings.namespace)
    app[MODEL_KEYS] = [PublicKeys(ns) for ns in model_namespaces(settings)]
    app[RECOMMENDER] = (SiteRouter(sync, settings, catalog, meta_ttl=0.2) if settings.mode == "federated"
                        else Recommender(sync, settings.namespace, catalog, meta_ttl=0.2))
    app[_METRICS] = _Metrics()
    app[TOKENS] = tokens or _tokens_from_env()
    app.router.add_get("/recommend", recommend)
    app.router.add_post("/feedback", feedback)
    app.router.add_post("/listen", listen)
    app.router.add_get("/budget", budget)
    app.router.add_get("/budget/history", budget_history)
    app.router.add_get("/dashboard", dashboard)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/users", users)
    app.router.add_post("/session", session)
    app.router.add_get("/", index)
    add_local_routes(app)  # GET /local/config, POST /report (local mode; a clear 400 elsewhere)
    add_items_routes(app)  # POST /items (operator), and the follower of the items topic (pipeline.serve.items_live)
    add_openapi_routes(app)  # GET /openapi.json: the contract of every route (pipeline/serve/openapi.py)
    if STATIC.is_dir():
        app.router.add_static("/static/", STATIC)
    app.cleanup_ctx.append(_clients)
    return app


_METRICS = web.AppKey("metrics", _Metrics)


def _tokens_from_env() -> Tokens:
    """The environment's tokens, else a secret of this process's own (user tokens then last as long as it)."""
    tokens = Tokens.from_env(os.environ)
    if tokens is None:
        log.warning("no PRIVREC_TOKEN_SECRET: user tokens are made with a secret of this process (a restart "
                    "invalidates them) and no operator token opens per-user views")
        return Tokens.ephemeral()
    return tokens


def _authorize(request: web.Request, user: str) -> web.Response | None:
    """``None`` when the request presents ``user``'s token or the operator token; else the 401 (no token) or 403
    (another token) to answer, a JSON error naming ``Authorization``."""
    token = bearer(request.headers.get("Authorization"))
    if token is None:
        resp = _error(401, "Authorization", f"a token is needed to read user {user!r}'s view: send "
                                            f"'Authorization: Bearer <their token or the operator token>' (a new "
                                            f"user gets theirs from POST /session, a listed one from the operator)")
        resp.headers["WWW-Authenticate"] = 'Bearer realm="privrec"'
        return resp
    if request.app[TOKENS].grant(token, user) is None:
        return _error(403, "Authorization", f"this token does not open user {user!r}'s view (a user's token opens "
                                            f"only their own; the operator token opens every user's)")
    return None


def _is_operator(request: web.Request) -> bool:
    """Whether the request presents the operator token (``Authorization: Bearer``)."""
    return request.app[TOKENS].is_operator(bearer(request.headers.get("Authorization")))


#: What a caller without the operator token is told in place of the participation figures (add/remove relation).
OPERATOR_ONLY = ("under the add/remove relation the exact counts, the ledger's figures and dead letters depend on "
                 "who took part: they are answered to the operator token only (Authorization: Bearer); the counts "
                 "here are the release's noisy ones")


async def _clients(app: web.Application) -> Any:
    s: Settings = app[SETTINGS]
    app[REDIS] = connect_async(s.redis_url)  # type: ignore[arg-type]
    producer = log_producer = None
    if s.kafka:
        # feedback waits for the broker's ack, so its producer does not linger; the log of
        # shown lists is fire-and-forget and batched by pipeline.serve.shown (one record batch per
        # partition every 100 ms: docs/serving-performance.md), so its producer does not linger either
        producer = AIOKafkaProducer(**client_kwargs(s), linger_ms=0, request_timeout_ms=PRODUCE_TIMEOUT_MS)
        log_producer = AIOKafkaProducer(**client_kwargs(s), linger_ms=0, max_batch_size=512 * 1024)
        await producer.start()
        await log_producer.start()
    app[PRODUCER] = producer
    app[LOG_PRODUCER] = log_producer
    # the shown lists are stored and logged behind the answer (pipeline/serve/shown.py: what a crash may cost);
    # with sibling processes a feedback's miss is read again after the write-behind window
    app[SHOWN] = ShownLists(app[REDIS], app[KEYS], REC_TTL_SECONDS, producer=log_producer,
                            topic=TOPICS["recommendations"], reread_seconds=0.05 if s.web_processes > 1 else 0.0)
    # feedback goes through a durable outbox that the forwarder drains into Kafka (pipeline/serve/outbox.py)
    forwarding = None if producer is None else await start_forwarding(app, s, app[REDIS], producer)
    yield
    await stop_forwarding(app, forwarding)
    await app[SHOWN].close()  # a clean stop writes every pending list
    for p in (producer, log_producer):
        if p is not None:
            await p.stop()
    await app[REDIS].aclose()


@web.middleware
async def _observe(request: web.Request, handler: Any) -> web.StreamResponse:
    t0 = time.perf_counter()
    endpoint = request.path if request.path in ("/recommend", "/feedback", "/budget", "/healthz") else "other"
    try:
        resp = await handler(request)
    except BodyError as exc:  # a JSON body breaking its route's rules (pipeline.serve.httpio.read_body)
        resp = exc.response()
    except web.HTTPException as exc:
        resp = _error(exc.status, None, exc.reason or "error")
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.BusyLoadingError,
            OSError) as exc:
        # Redis restarting (or unreachable): say so, and when to come back; the client reconnects by itself
        log.warning("Redis unavailable on %s: %s", request.path, exc)
        resp = _error(503, None, f"the model store (Redis) is unavailable ({type(exc).__name__}); try again in a "
                                 f"moment")
        resp.headers["Retry-After"] = "1"
    except BrokerUnavailable as exc:  # a direct produce (no outbox): nothing recorded, the client may retry
        resp = _error(503, None, f"{exc}; try again in a moment")
        resp.headers["Retry-After"] = "2"
    except Exception as exc:  # a bug must not take the server down; report it as JSON
        log.exception("unhandled error on %s", request.path)
        resp = _error(500, None, f"internal error: {type(exc).__name__}")
    request.app[_METRICS].observe(endpoint, resp.status, time.perf_counter() - t0)
    return resp


_RECOMMEND_PARAMETERS = frozenset({"user", "k", "candidates"})


async def recommend(request: web.Request) -> web.Response:
    q = request.query
    if not _RECOMMEND_PARAMETERS.issuperset(q):
        unknown = sorted(set(q) - _RECOMMEND_PARAMETERS)
        return _error(400, unknown[0], f"unknown parameter(s) {unknown}; use user, k, candidates")
    user = q.get("user")
    if not user:
        return _error(400, "user", "is required, e.g. /recommend?user=2&k=10")
    check_id(user, "user")  # the ids of a query follow a body's rules (pipeline.serve.httpio)
    k_raw = q.get("k", "10")
    try:
        k = int(k_raw)
    except ValueError:
        return _error(400, "k", f"must be an integer in [1, {MAX_K}], got {k_raw!r}")
    candidates = None
    if "candidates" in q:
        candidates = [p.strip() for p in q["candidates"].split(",")]
        if not all(candidates):
            return _error(400, "candidates", "must be a comma-separated list of item ids without empty entries")
        for c in candidates:
            check_id(c, "candidates")
    app = request.app  # (a property: read once)
    rec: Recommender | SiteRouter = app[RECOMMENDER]
    try:
        out = rec.recommend(user, candidates, k)
    except BadRequest as exc:
        status = 404 if exc.parameter == "user" and "unknown user" in str(exc) else 400
        return _error(status, exc.parameter, str(exc))
    except ModelNotReadyError as exc:
        resp = _error(503, None, f"{exc}; try again in a moment")
        resp.headers["Retry-After"] = "1"  # about one release tick (the client waits at least this)
        return resp
    if app[SETTINGS].mode == "local":  # the devices need each item's context for r x
        with_contexts(out, app[CATALOG])
    items = [it["item"] for it in out["items"]]
    record = {"rec_id": out["rec_id"], "user": user, "items": items, "model_version": out["model_version"],
              "ts": time.time() * 1000}
    app[SHOWN].put(out["rec_id"], user, orjson.dumps(record))  # stored and logged behind the answer
    # orjson: the same JSON (scores are finite floats, see serving._num), ~5x faster to encode
    return web.Response(body=orjson.dumps(out), content_type="application/json")


#: ``POST /feedback``'s body (:mod:`pipeline.serve.httpio`).
_FEEDBACK = (Field("rec_id", "id", what="the rec_id string of a /recommend response"),
             Field("item", "id", what="an item id string"), Field("reward", "reward"))
#: ``POST /listen``'s body: no other field.
_LISTEN = (Field("user", "id", what="a user id string"), Field("item", "id", what="an item id string"),
           Field("reward", "reward", required=False, default=1.0))


async def feedback(request: web.Request) -> web.Response:
    refused = refuse_raw_reward(request)  # local mode: raw rewards never reach the server
    if refused is not None:
        return refused
    body = await read_body(request, _FEEDBACK)
    rec_id, item, reward = body["rec_id"], body["item"], body["reward"]
    keys: PublicKeys = request.app[KEYS]
    r = request.app[REDIS]
    raw = await request.app[SHOWN].get(rec_id)  # a list whose write is still pending counts
    if raw is None:
        return _error(404, "rec_id", f"unknown rec_id {rec_id!r} (never shown by /recommend, or expired after "
                                     f"{REC_TTL_SECONDS // 3600} h)")
    shown = json.loads(raw)
    if item not in shown["items"]:
        return _error(400, "item", f"item {item!r} was not in the list {rec_id!r} showed")
    if not await request.app[SHOWN].stored(rec_id):  # ingest matches the feedback against the stored list
        return _error(503, "rec_id", f"the list {rec_id!r} showed could not be stored (Redis unavailable); ask "
                                     f"/recommend again")
    learned = await _learning(request, shown["user"])
    refused = _refuse_at_cap(request, shown["user"], learned)
    if refused is not None:
        return refused
    producer: AIOKafkaProducer | None = request.app[PRODUCER]
    if producer is None:
        return _error(503, None, "no Kafka producer configured (KAFKA_BOOTSTRAP)")
    # one feedback per shown list: the first claims it atomically with recording the event; the shown list
    # itself stays, so a repeat is told apart from an unknown rec_id (409, not 404)
    answered = keys.recommendation(rec_id) + ":answered"
    # the marker says *that* the list was answered (public), never which item: the choice is protected
    # the whole shown list travels with the feedback: the Gram matrix takes every shown item (public), so it
    # never reveals which one the user chose (DESIGN §2)
    event = {"event_id": f"{rec_id}:fb", "user": shown["user"], "arm": item, "context": None,
             "reward": reward, "ts": time.time() * 1000, "rec_id": rec_id, "shown": shown["items"]}
    topic = interactions_topic(request.app[SETTINGS], request.app[CATALOG], shown["user"])
    if not await accept(r, request.app.get(OUTBOX), producer, topic, shown["user"].encode(),
                        json.dumps(event).encode(), claim=(answered, "1", REC_TTL_SECONDS)):
        return _error(409, "rec_id", f"feedback for {rec_id!r} was already recorded (one feedback per shown list)")
    request.app[_METRICS].feedback.labels("1" if reward >= 0.5 else "0").inc()
    return web.json_response({"accepted": True, "event_id": event["event_id"], "learning": learned}, status=202)


async def listen(request: web.Request) -> web.Response:
    """An organic listen: ``{"user", "item"[, "reward"]}`` — a positive the user chose, not a shown list's answer.

    It becomes an ``interactions`` event with ``"kind": "listen"``: it counts in the item's reward sum (the
    item term) and, with weight ``listen_weight``, in the user's unit's ``b`` — never in the Gram matrix (the item is
    the user's own choice).
    """
    refused = refuse_raw_reward(request)
    if refused is not None:
        return refused
    body = await read_body(request, _LISTEN, closed=True)
    user, item, reward = body["user"], body["item"], body["reward"]
    catalog: Catalog = request.app[CATALOG]
    try:
        catalog.unit_of(user)
    except UnknownUserError as exc:
        return _error(404, "user", str(exc))
    try:
        catalog.arm_row(item)
    except UnknownArmError as exc:
        return _error(400, "item", str(exc))
    learned = await _learning(request, user)
    refused = _refuse_at_cap(request, user, learned)
    if refused is not None:
        return refused
    producer: AIOKafkaProducer | None = request.app[PRODUCER]
    if producer is None:
        return _error(503, None, "no Kafka producer configured (KAFKA_BOOTSTRAP)")
    event = {"event_id": f"listen:{uuid.uuid4().hex}", "user": user, "arm": item, "context": None,
             "reward": reward, "ts": time.time() * 1000, "rec_id": None, "kind": "listen"}
    topic = interactions_topic(request.app[SETTINGS], catalog, user)
    await accept(request.app[REDIS], request.app.get(OUTBOX), producer, topic, user.encode(),
                 json.dumps(event).encode())
    request.app[_METRICS].listens.inc()
    return web.json_response({"accepted": True, "event_id": event["event_id"], "learning": learned}, status=202)


#: ``/budget``'s part of each trust mode: a view of one :class:`~pipeline.serve.budget_view.BudgetQuery`, plugged
#: in by the setting ``mode``.
BUDGET_VIEWS: dict[str, Callable[[BudgetQuery], Awaitable[dict[str, Any]]]] = {
    "global": global_view, "federated": federated_view, "local": local_view}


async def budget(request: web.Request) -> web.Response:
    """``GET /budget[?user=U]``: the served release's statement and figures (:func:`_release_view`), then the
    mode's own part (:data:`BUDGET_VIEWS`): the user's guarantee, the ledger, the sites or the devices."""
    user = request.query.get("user")
    if user is not None:  # a per-user view: only for the user themself or the operator
        check_id(user, "user")
        refused = _authorize(request, user)
        if refused is not None:
            return refused
        try:
            request.app[CATALOG].unit_of(user)
        except UnknownUserError as exc:
            return _error(404, "user", str(exc))
    s: Settings = request.app[SETTINGS]
    keys: PublicKeys = request.app[MODEL_KEYS][0]
    r = request.app[REDIS]
    meta = {k.decode(): v.decode() for k, v in (await r.hgetall(keys.model_meta)).items()}
    if not meta:
        return _error(503, None, "no release has been published yet")
    statement = json.loads(meta.get("privacy", "{}"))
    # add/remove: participation figures (exact counts, the ledger) only to the operator; the rest is calibrated
    figures = statement.get("relation") != "add-remove" or _is_operator(request)
    out = await _release_view(r, keys, s, meta, statement, figures)
    query = BudgetQuery(r=r, app=request.app, partitions=s.partitions, delta=s.delta, keys=keys, statement=statement,
                        event=event_from_dict(json.loads(meta.get("event", '{"kind": "none"}'))),
                        epoch=out["tree"]["epoch"], user=user, figures=figures, settings=s,
                        recommender=request.app[RECOMMENDER])
    out.update(await BUDGET_VIEWS[s.mode](query))
    if figures and statement.get("relation") == "add-remove":
        exact = await r.hget(keys.release_figures, "count")
        if exact is not None:
            out["events_released"] = int(exact)
    out["redis_acl"] = await serving_isolation(r, s.namespace)
    return web.json_response(out)


async def _release_view(r: Any, keys: PublicKeys, s: Settings, meta: dict[str, str], statement: dict[str, Any],
                        figures: bool) -> dict[str, Any]:
    """``/budget``'s fields common to every mode: the statement, the served model, the releases and their
    history (exact counts only where ``figures`` may be answered), and the release tree's clock."""
    history = [{k: v for k, v in e.items() if k != "ledger"}
               for e in await release_history(r, keys, 200, exact=figures)]
    capacity = (1 << s.tree_levels) - 1
    version = int(meta["version"])
    out: dict[str, Any] = {
        "privacy": statement,
        "model": {"version": version, "algorithm": meta.get("algorithm"),
                  # per-unit widths (Shariff & Sheffet) replace the global alpha
                  "alpha": None if meta.get("width") == "per-unit" else float(meta.get("alpha", "nan")),
                  "lambda": float(meta["lambda"]) if "lambda" in meta else s.lambda_,
                  "d": int(meta.get("d", 0)), "units": int(meta.get("n_units", 0)), "catalog": s.catalog,
                  "tick_seconds": s.tick_seconds,
                  # the public prior mean of theta (docs/public-prior.md), or None (the ordinary ridge)
                  "prior": {"strength": float(meta["prior_strength"]), "reward": float(meta["prior_reward"])}
                  if "prior_strength" in meta else None},
        "releases": version,
        "events_released": int(meta.get("events", 0)),
        "counts": "exact" if statement.get("relation") != "add-remove" else (
            "exact (the operator's figures)" if figures else "noisy: the release's own count (" + OPERATOR_ONLY + ")"),
        "tree": {"levels": s.tree_levels, "ticks_per_epoch": capacity, "epoch": (version - 1) // capacity,
                 "tick_in_epoch": (version - 1) % capacity + 1},
        "history": history,
    }
    if "trees" in statement:  # per-unit trees (the baselines): their own sizes, not the global tick count
        out["tree"] = statement["trees"]
    return out


async def budget_history(request: web.Request) -> web.Response:
    """Per release: time, version, events covered, and (user level) the ledger's figures — the dashboard's data."""
    keys: PublicKeys = request.app[MODEL_KEYS][0]
    r = request.app[REDIS]
    privacy = await r.hget(keys.model_meta, "privacy")
    add_remove = bool(privacy) and json.loads(privacy).get("relation") == "add-remove"
    exact = not add_remove or _is_operator(request)
    out: dict[str, Any] = {"history": await release_history(r, keys, exact=exact)}
    if not exact:
        out["operator_only"] = OPERATOR_ONLY
    return web.json_response(out)


async def dashboard(request: web.Request) -> web.StreamResponse:
    page = STATIC / "dashboard.html"
    if not page.exists():
        return _error(404, None, "the dashboard page is not installed")
    return web.FileResponse(page)


async def _learning(request: web.Request, user: str) -> dict[str, Any]:
    """Whether ``user``'s interaction sent now will be learned from (:func:`pipeline.serve.budget_view.learning`):
    the ``learning`` field of ``/feedback``'s and ``/listen``'s answers, the user's own view of the public ledger
    (their site's ledger in federated mode, as ``/budget?user=`` reads it)."""
    s: Settings = request.app[SETTINGS]
    if not s.user_level:
        return dict(LEARNED)
    r = request.app[REDIS]
    privacy = await r.hget(request.app[MODEL_KEYS][0].model_meta, "privacy")
    statement = json.loads(privacy) if privacy else {}
    keys: PublicKeys = request.app[KEYS]
    router = request.app[RECOMMENDER]
    if isinstance(router, SiteRouter):  # federated mode
        keys = PublicKeys(site_namespace(s.namespace, router.site_of(user)))
    return await learning(r, keys, s.partitions, user, statement, tree_ticks=s.tree_ticks, tick_seconds=s.tick_seconds)


def _refuse_at_cap(request: web.Request, user: str, learned: dict[str, Any]) -> web.Response | None:
    """``cap_policy = reject``: 403 for a user at the cap (their events would not be learned from anyway), with the
    same ``learning`` as a 202 would carry, so a client tells this refusal from the others."""
    s: Settings = request.app[SETTINGS]
    if not (s.user_level and s.cap_policy == "reject") or learned["reason"] != "cap":
        return None
    message = (f"user {user!r} reached the contribution cap ({learned['cap']} release ticks this epoch; cap_policy "
               f"= reject): feedback is not accepted until the next epoch")
    return web.json_response({"error": {"parameter": "user", "message": message}, "learning": learned}, status=403)


async def metrics(request: web.Request) -> web.Response:
    m: _Metrics = request.app[_METRICS]
    keys: PublicKeys = request.app[MODEL_KEYS][0]
    r = request.app[REDIS]
    if request.app[SETTINGS].relation == "add-remove" and not _is_operator(request):
        resp = _error(401, "Authorization", "under the add/remove relation the metrics (exact counts, the ledger's "
                                            "figures, dead letters) depend on who took part: send 'Authorization: "
                                            "Bearer <the operator token>'")
        resp.headers["WWW-Authenticate"] = 'Bearer realm="privrec"'
        return resp
    v = await r.hget(keys.model_meta, "version")
    if v is not None:
        m.model_version.set(int(v))
    c = await r.hget(keys.release_figures, "count") or await r.hget(keys.released, "count")
    if c is not None:
        m.released_events.set(int(c))
    s: Settings = request.app[SETTINGS]
    dead = 0
    for p in range(s.partitions):
        for val in await r.hvals(keys.ledger_deadletters(p)):
            dead += int(val)
    m.dead_letters.set(dead)
    m.shown_lost.set(request.app[SHOWN].lost)
    meta = await r.hgetall(keys.model_meta)
    statement = json.loads(meta.get(b"privacy", b"{}")) if meta else {}
    if statement.get("unit") == "user":
        epoch = (int(meta[b"version"]) - 1) // s.tree_ticks
        overview = await ledger_overview(r, keys, s.partitions, statement, epoch)
        m.users_at_cap.set(overview["users_at_cap"])
        m.users_at_budget.set(overview["users_at_budget"])
        m.spent_max.set(overview["spent_max"])
        m.spent_median.set(overview["spent_median"])
    await observe_outbox(request.app, m.outbox)
    return web.Response(body=generate_latest(m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    versions = [await request.app[REDIS].hget(k.model_meta, "version") for k in request.app[MODEL_KEYS]]
    if any(v is None for v in versions):  # every user must be servable (federated: every site's view)
        return web.json_response({"status": "starting", "model_version": None, "pid": os.getpid()}, status=503)
    # pid: which server process answered (several share the port with PRIVREC_WEB_PROCESSES)
    return web.json_response({"status": "ok", "model_version": int(versions[0]), "pid": os.getpid()})


async def users(request: web.Request) -> web.Response:
    catalog: Catalog = request.app[CATALOG]
    limit_raw = request.query.get("limit", "200")
    try:
        limit = int(limit_raw)
        if limit < 1:
            raise ValueError
    except ValueError:
        return _error(400, "limit", f"must be a positive integer, got {limit_raw!r}")
    ids = list(getattr(catalog, "users", []))
    return web.json_response({"users": ids[:limit], "total": len(ids), "catalog": catalog.name,
                              "default_pool": list(catalog.default_pool), "new_users": _new_user(catalog) is not None})


def _new_user(catalog: Catalog) -> str | None:
    """A user id nobody had (96 random bits), or ``None`` when the catalog's users are a fixed list."""
    user = f"web-{secrets.token_hex(12)}"
    try:
        catalog.unit_of(user)
    except UnknownUserError:
        return None
    return user


async def session(request: web.Request) -> web.Response:
    """``POST /session``: a new user id of the server's making and its token (201), on a catalog that takes new users.

    The id is 96 random bits, so it names nobody before this answer: a page gets a token only for a user it
    made. A catalog with a fixed list of users (the synthetic world, LastFM with ``--graph users``) has no new user to give: 409, and
    a listed user's token comes from the operator (``privrec token --user U``).
    """
    catalog: Catalog = request.app[CATALOG]
    user = _new_user(catalog)
    if user is None:
        return _error(409, None, f"the catalog {catalog.name!r} has a fixed list of users, so there is no new user "
                                 f"to give; a listed user's token comes from the operator (`privrec token --user U`)")
    return web.json_response({"user": user, "token": request.app[TOKENS].for_user(user)}, status=201)


async def index(request: web.Request) -> web.StreamResponse:
    page = STATIC / "index.html"
    if not page.is_file():
        return web.Response(text="privrec: the web page is not built", content_type="text/plain")
    return web.FileResponse(page)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.apps.web", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("PRIVREC_HTTP_PORT", "8080")))
    parser.add_argument("--host", default=os.environ.get("PRIVREC_HTTP_HOST", "127.0.0.1"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("PRIVREC_LOGLEVEL", "INFO"))
    settings = Settings.from_mapping({})
    catalog = load_catalog(settings)  # loaded once, shared copy-on-write by the forked processes
    tokens = _tokens_from_env()  # before the fork: every process must take the same tokens
    n = settings.web_processes
    children: list[int] = []
    for _ in range(n - 1):  # pre-fork: every process binds the same port with SO_REUSEPORT
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            _serve(settings, catalog, tokens, args.host, args.port, reuse_port=True)
            os._exit(0)
        children.append(pid)
    try:
        _serve(settings, catalog, tokens, args.host, args.port, reuse_port=n > 1)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _serve(settings: Settings, catalog: Catalog, tokens: Tokens, host: str, port: int, *, reuse_port: bool) -> None:
    app = create_web_app(settings, catalog, tokens=tokens)  # its own Redis and Kafka clients, after the fork
    # the imports, the catalog and the app are long-lived: out of the cyclic collector's sight, so that its
    # collections (triggered by every request's allocations) do not walk them
    gc.freeze()
    # uvloop's event loop: 15-25 % less server CPU per /recommend than asyncio's (docs/serving.md, "Latency")
    web.run_app(app, host=host, port=port, access_log=None, print=None, loop=uvloop.new_event_loop(),
                reuse_port=reuse_port)


def _die_with_parent() -> None:
    """A forked server process ends when the tracked parent does, even on SIGKILL (Linux prctl)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    main()
