"""The HTTP API's OpenAPI document (:mod:`pipeline.serve.openapi`): valid OpenAPI 3, and in step with the app's routes.

The apps are built (not started: the Redis client connects lazily, there is no Kafka) in each mode, and
every route registered on ``app.router`` must be in the document with its method, and every operation of
the document must be a registered route. A route added to ``pipeline.apps.web`` (or ``pipeline.modes.local.local_http``)
without its entry in ``pipeline.serve.openapi`` fails here; so does an entry left behind by a removed route.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from pipeline.data.catalog import SyntheticCatalog
from pipeline.serve.openapi import openapi_document
from pipeline.config.settings import Settings
from pipeline.apps.web import create_web_app

#: no server listens here: the app is only built, its lazily connecting Redis client never used
_URL = "redis://127.0.0.1:9/0"


def _app(mode: str) -> web.Application:
    s = Settings(mode=mode, d=5, n_users=4, n_arms=10, epsilon=2.0, redis_url=_URL, kafka=None)
    return create_web_app(s, SyntheticCatalog(n_users=4, d=5, n_arms=10))


def registered(app: web.Application) -> set[tuple[str, str]]:
    """``(method, path template)`` of every route on the router; aiohttp's automatic HEAD of a GET left out."""
    out = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        res = route.resource
        assert res is not None
        if isinstance(res, web.StaticResource):
            path = res.canonical.rstrip("/") + "/{filename}"
        else:
            path = res.canonical
        out.add((route.method.lower(), path))
    return out


def documented(doc: dict[str, object]) -> set[tuple[str, str]]:
    paths = doc["paths"]
    assert isinstance(paths, dict)
    return {(method, path) for path, ops in paths.items() for method in ops}


def test_the_document_is_valid_openapi_3() -> None:
    doc = openapi_document("http://127.0.0.1:8080")
    validate(doc)  # raises on any violation of the OpenAPI 3.0 schema
    assert doc["openapi"].startswith("3.")


@pytest.mark.parametrize("mode", ["global", "local"])
def test_every_route_is_documented_and_every_operation_routed(mode: str) -> None:
    app = _app(mode)
    routes, ops = registered(app), documented(openapi_document())
    assert routes - ops == set(), f"routes of the app missing from pipeline/serve/openapi.py: {sorted(routes - ops)}"
    assert ops - routes == set(), f"operations of pipeline/serve/openapi.py no route serves: {sorted(ops - routes)}"


def test_the_check_catches_an_undocumented_route() -> None:
    """The comparison above is not vacuous: a route added without its entry shows up."""
    app = _app("global")

    async def extra(request: web.Request) -> web.Response:
        return web.json_response({})

    app.router.add_delete("/recommend", extra)
    app.router.add_get("/new-route", extra)
    missing = registered(app) - documented(openapi_document())
    assert missing == {("delete", "/recommend"), ("get", "/new-route")}


def test_the_app_serves_the_document() -> None:
    async def fetch() -> tuple[int, str, object]:
        async with TestClient(TestServer(_app("global"))) as client:
            resp = await client.get("/openapi.json")
            return resp.status, resp.headers["Content-Type"], json.loads(await resp.read())

    status, ctype, doc = asyncio.run(fetch())
    assert status == 200 and ctype.startswith("application/json")
    assert doc == json.loads(json.dumps(openapi_document()))
