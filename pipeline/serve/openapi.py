"""The HTTP API's contract: an OpenAPI 3.0 document of every route of :mod:`pipeline.apps.web`, served at ``GET /openapi.json``.

One entry of :data:`PATHS` per route (path → method → operation). A route added to the app must be
added here too: ``tests/component/test_openapi.py`` walks ``app.router`` and fails when a registered route and
the document disagree, and validates the document with ``openapi-spec-validator``; the schemathesis run
(``tests/integration/test_schemathesis.py``) checks every answer of the live stack against it.

Schemas say what the server guarantees, no more: objects allow properties beyond the listed ones (a
later release may add fields), the listed ``required`` ones are always there.

Examples
--------
>>> doc = openapi_document()
>>> doc["openapi"], sorted(doc["paths"]["/recommend"])
('3.0.3', ['get'])
"""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import web

from ..data.records import MAX_ID_CHARS
from .serving import MAX_K

__all__ = ["PATHS", "COMPONENTS", "openapi_document", "add_routes", "openapi_json"]

_JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _err(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_UNAVAILABLE = {
    "description": "the model store (Redis) or the broker is unavailable, or no model yet: try again after "
                   "`Retry-After` seconds when it is given",
    "headers": {"Retry-After": {"schema": {"type": "string"}, "description": "seconds to wait"}},
    "content": {_JSON: {"schema": _ref("Error")}},
}

_STR = {"type": "string"}
#: A user id, item id or rec_id: at most MAX_ID_CHARS characters (pipeline.serve.httpio answers 400 past it).
_ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS}
_NUM = {"type": "number"}
_INT = {"type": "integer"}
_OBJ = {"type": "object"}

#: The bearer token of the per-user views (:mod:`pipeline.serve.auth`): the user's own token or the operator token.
_SECURITY_SCHEMES = {"userToken": {
    "type": "http", "scheme": "bearer",
    "description": "A user's token, HMAC-SHA256(the server's secret, user id) in hex, opens that user's views; the "
                   "operator token opens every user's. A new user gets theirs from POST /session; a listed user's "
                   "comes from the operator (`privrec token --user U`)."}}

COMPONENTS: dict[str, Any] = {"securitySchemes": _SECURITY_SCHEMES, "schemas": {
    "Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {
            "type": "object", "required": ["parameter", "message"],
            "properties": {"parameter": {"type": "string", "nullable": True,
                                         "description": "the query parameter or body field at fault, or null"},
                           "message": {"type": "string", "minLength": 1}}}},
    },
    "RecommendedItem": {
        "type": "object", "required": ["item", "name", "score", "mean", "bonus"],
        "properties": {"item": _STR, "name": _STR, "score": _NUM, "mean": _NUM, "bonus": _NUM,
                       "popularity": {"type": "number", "description": "the item term's share of the score"},
                       "x": {"type": "array", "items": _NUM,
                             "description": "local mode: the item's public feature vector (norm <= 1)"}},
    },
    "Recommendation": {
        "type": "object", "required": ["user", "rec_id", "model_version", "items"],
        "properties": {"user": _STR, "unit": {"type": "integer", "description": "the user's model unit"},
                       "rec_id": {"type": "string", "minLength": 1}, "model_version": _INT,
                       "items": {"type": "array", "items": _ref("RecommendedItem")}},
    },
    "Feedback": {
        "type": "object", "required": ["rec_id", "item", "reward"],
        "properties": {"rec_id": {**_ID, "description": "a /recommend answer's rec_id"},
                       "item": {**_ID, "description": "an item of that list"},
                       "reward": {"type": "number", "minimum": 0, "maximum": 1}},
    },
    "Listen": {
        "type": "object", "required": ["user", "item"], "additionalProperties": False,
        "properties": {"user": _ID, "item": _ID,
                       "reward": {"type": "number", "minimum": 0, "maximum": 1, "default": 1.0}},
    },
    "NewItem": {
        "type": "object", "required": ["item"],
        "description": "an item added while running (a catalog directory; pipeline.serve.items_live): `tags` (known to "
                       "the catalog's tag transform) or `features` (d finite numbers); features win",
        "properties": {"item": _ID, "name": _STR,
                       "tags": {"type": "array", "items": {"type": "string", "minLength": 1}},
                       "features": {"type": "array", "items": {"type": "number"}}},
    },
    "ItemAccepted": {
        "type": "object", "required": ["accepted", "item", "features", "recommendable_in_seconds"],
        "properties": {"accepted": {"type": "boolean", "enum": [True]}, "item": _STR,
                       "features": {"type": "array", "items": {"type": "number"}},
                       "recommendable_in_seconds": {"type": "number"}},
    },
    "Report": {
        "type": "object", "required": ["schema", "user", "rec_id", "version", "algorithm"],
        "additionalProperties": False,
        "description": "a local-mode device's noisy report on a shown list (models.local.LocalReport.to_json(); "
                       "docs/local-protocol.md); it names the list, not the item, and the server adds the list itself",
        "properties": {"schema": {"type": "string", "enum": ["privrec.LocalReport/2"]},
                       "user": _ID, "rec_id": _ID,
                       "version": {"type": "integer", "minimum": 1},
                       "algorithm": {"type": "string", "enum": ["tree", "round"]},
                       "b": {"type": "array", "items": _NUM, "description": "tree: the device's noisy sum"},
                       "m": {"type": "array", "items": _NUM, "description": "round: one noisy r x"},
                       "epoch": {"type": "integer", "minimum": 0,
                                 "description": "user level: the device's epoch of the report, floor(t / "
                                                "epoch_seconds) (docs/local-protocol.md)"}},
    },
    "Accepted": {
        "type": "object", "required": ["accepted", "event_id", "learning"],
        "properties": {"accepted": {"type": "boolean", "enum": [True]}, "event_id": _STR,
                       "learning": _ref("Learning")},
    },
    "Learning": {
        "type": "object",
        "required": ["learned", "reason", "cap", "ticks_this_epoch", "epoch", "epoch_releases_left",
                     "epoch_seconds_left_at_least"],
        "description": "whether the model will learn from this interaction, as the user's public ledger says when "
                       "the answer is given (pipeline.serve.budget_view.learning); the user's own view, the same "
                       "whatever was chosen or rewarded. The epoch fields are null at event level",
        "properties": {
            "learned": {"type": "boolean"},
            "reason": {"type": "string", "enum": ["cap", "budget", None], "nullable": True,
                       "description": "why not: `cap` (the user contributed to `cap` release ticks of this epoch; "
                                      "learned from again in the next epoch), `budget` (one more tick would take "
                                      "the user past their lifetime budget, user_budget); null when learned"},
            "cap": {"type": "integer", "minimum": 1, "nullable": True},
            "ticks_this_epoch": {"type": "integer", "minimum": 0, "nullable": True},
            "epoch": {"type": "integer", "minimum": 0, "nullable": True,
                      "description": "the epoch of the next release, which folds this interaction"},
            "epoch_releases_left": {"type": "integer", "minimum": 1, "nullable": True,
                                    "description": "releases until that epoch ends"},
            "epoch_seconds_left_at_least": {"type": "number", "minimum": 0, "nullable": True,
                                            "description": "a lower bound: a release happens at most once every "
                                                           "tick_seconds, and only when something changed"}},
    },
    "AtCap": {
        "description": "cap_policy = reject: the refusal, and the same `learning` a 202 would carry",
        "allOf": [_ref("Error"), {"type": "object", "required": ["learning"],
                                  "properties": {"learning": _ref("Learning")}}],
    },
    "ReportAccepted": {
        "type": "object", "required": ["accepted", "user", "version"],
        "properties": {"accepted": {"type": "boolean", "enum": [True]}, "user": _STR, "version": _INT},
    },
    "Budget": {
        "type": "object", "required": ["privacy", "model", "releases", "events_released", "tree", "history"],
        "properties": {
            "privacy": {"type": "object", "description": "the privacy statement of the released statistics"},
            "model": {"type": "object", "required": ["version"], "properties": {"version": _INT}},
            "releases": _INT, "events_released": _INT, "tree": {},
            "counts": {"type": "string", "description": "exact, or (add/remove relation without the operator token) "
                                                        "noisy: the releases' own counts"},
            "history": {"type": "array", "items": _ref("Release")},
            "user": {"type": "object", "description": "with ?user=U: that user's guarantee",
                     "required": ["user"], "properties": {"user": _STR}},
            "ledger": _OBJ, "local": _OBJ, "federated": _OBJ},
    },
    "Release": {
        "type": "object", "required": ["version", "count", "at_ms"],
        "properties": {"version": _INT, "count": _INT, "at_ms": _INT, "ledger": _OBJ},
    },
    "Session": {
        "type": "object", "required": ["user", "token"],
        "properties": {"user": {"type": "string", "minLength": 1, "description": "a new user id of the server's making"},
                       "token": {"type": "string", "minLength": 1, "description": "the token of that user's views"}},
    },
    "Health": {
        "type": "object", "required": ["status", "model_version", "pid"],
        "properties": {"status": {"type": "string", "enum": ["ok", "starting"]},
                       "model_version": {"type": "integer", "nullable": True}, "pid": _INT},
    },
    "Users": {
        "type": "object", "required": ["users", "total", "catalog", "default_pool", "new_users"],
        "properties": {"users": {"type": "array", "items": _STR}, "total": _INT, "catalog": _STR,
                       "default_pool": {"type": "array", "items": _STR},
                       "new_users": {"type": "boolean", "description": "whether POST /session makes new users (a "
                                                                       "catalog that takes users it does not list)"}},
    },
    "LocalConfig": {
        "type": "object", "required": ["mode"],
        "description": "{\"mode\"} alone outside local mode; in local mode the devices' public calibration",
        "properties": {"mode": {"type": "string", "enum": ["global", "federated", "local"]},
                       "algorithm": _STR, "d": _INT, "epsilon": _NUM, "delta": _NUM, "schema": _STR,
                       "esa": {"type": "object", "description": "a separate shuffler: where devices POST their "
                               "sealed envelopes ('shuffler') and the analyzer's P-256 key ('public_key', base64 "
                               "of the uncompressed point); docs/local-parties.md"}},
    },
}}

_HTML = {"description": "an HTML page", "content": {"text/html": {"schema": _STR}}}

PATHS: dict[str, dict[str, Any]] = {
    "/recommend": {"get": {
        "operationId": "recommend", "summary": "The top k items for a user by UCB score; the list is kept 24 h "
                                               "for feedback",
        "parameters": [
            {"name": "user", "in": "query", "required": True, "schema": _ID},
            {"name": "k", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_K, "default": 10}},
            {"name": "candidates", "in": "query", "required": False,
             "description": "comma-separated distinct item ids (default: the catalog's default pool)",
             "schema": {"type": "string", "minLength": 1}},
        ],
        "responses": {"200": _json(_ref("Recommendation"), "the ranked list"),
                      "400": _err("a bad parameter (named)"), "404": _err("unknown user"),
                      "503": _UNAVAILABLE},
    }},
    "/feedback": {"post": {
        "operationId": "feedback", "summary": "The answer to a shown list (global and federated mode; one per list)",
        "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("Feedback")}}},
        "responses": {"202": _json(_ref("Accepted"), "produced to `interactions`, acknowledged by the broker"),
                      "400": _err("a bad field (named); local mode: raw rewards are refused"),
                      "403": _json(_ref("AtCap"), "the user is at the contribution cap (cap_policy = reject)"),
                      "404": _err("unknown rec_id"), "409": _err("the list was already answered"),
                      "503": _UNAVAILABLE},
    }},
    "/listen": {"post": {
        "operationId": "listen", "summary": "An organic listen: a positive the user chose",
        "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("Listen")}}},
        "responses": {"202": _json(_ref("Accepted"), "produced to `interactions`, acknowledged by the broker"),
                      "400": _err("a bad field (named); local mode: raw rewards are refused"),
                      "403": _json(_ref("AtCap"), "the user is at the contribution cap (cap_policy = reject)"),
                      "404": _err("unknown user"), "503": _UNAVAILABLE},
    }},
    "/items": {"post": {
        "operationId": "addItem", "summary": "Operator: add an item to a catalog directory while running",
        "description": "Requires `Authorization: Bearer <PRIVREC_ADMIN_TOKEN>`. Published to the compacted `items` "
                       "topic; workers add it at once, web servers one release tick later.",
        "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("NewItem")}}},
        "responses": {"202": _json(_ref("ItemAccepted"), "published to `items`, acknowledged by the broker"),
                      "400": _err("a bad field (named), or a catalog that takes no new items"),
                      "401": _err("no or a wrong operator token"),
                      "403": _err("the server has no operator token (PRIVREC_ADMIN_TOKEN): adding items is off"),
                      "409": _err("the item is already in the catalog"), "503": _UNAVAILABLE},
    }},
    "/report": {"post": {
        "operationId": "report", "summary": "Local mode: a device's noisy report on a shown list",
        "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("Report")}}},
        "responses": {"202": _json(_ref("ReportAccepted"), "produced to `ldp-reports`"),
                      "400": _err("a bad field (named), or not local mode"),
                      "404": _err("unknown user or rec_id"), "409": _err("the list was already reported on"),
                      "503": _UNAVAILABLE},
    }},
    "/local/config": {"get": {
        "operationId": "localConfig", "summary": "The devices' public calibration (local mode)",
        "responses": {"200": _json(_ref("LocalConfig"), "the calibration, or {\"mode\"} elsewhere"),
                      "503": _UNAVAILABLE},
    }},
    "/budget": {"get": {
        "operationId": "budget", "summary": "The privacy guarantee of the releases so far, and of one user's data",
        "description": "Without `user`: public. With `user=U`: only for `Authorization: Bearer <U's token or the "
                       "operator token>`.",
        # anonymous ({}) without `user`; the user's own or the operator token with it
        "security": [{}, {"userToken": []}],
        "parameters": [{"name": "user", "in": "query", "required": False, "schema": _ID,
                        "description": "a user id: that user's guarantee too (needs a token)"}],
        "responses": {"200": _json(_ref("Budget"), "the guarantee"),
                      "400": _err("`user` empty or longer than the id limit"),
                      "401": _err("`user` without a token (parameter `Authorization`)"),
                      "403": _err("`user` with a token that is neither U's nor the operator's"),
                      "404": _err("unknown user"), "503": _UNAVAILABLE},
    }},
    "/budget/history": {"get": {
        "operationId": "budgetHistory", "summary": "Per release: time, version, events, the ledger's figures",
        "description": "Under the add/remove relation the counts are the releases' noisy ones and the ledger's "
                       "figures are left out, unless the operator token is sent (`operator_only` says so).",
        "security": [{}, {"userToken": []}],
        "responses": {"200": _json({"type": "object", "required": ["history"],
                                    "properties": {"history": {"type": "array", "items": _ref("Release")},
                                                   "operator_only": _STR}},
                                   "the releases, oldest first"),
                      "503": _UNAVAILABLE},
    }},
    "/session": {"post": {
        "operationId": "session", "summary": "A new user of the server's making and their token",
        "description": "Only on a catalog that takes new users (a catalog directory); the id names nobody before "
                       "this answer, so a caller gets a token only for a user it made.",
        "responses": {"201": _json(_ref("Session"), "the new user and their token"),
                      "409": _err("the catalog has a fixed list of users: a listed user's token comes from the "
                                  "operator")},
    }},
    "/users": {"get": {
        "operationId": "users", "summary": "The catalog's users and default pool",
        "parameters": [{"name": "limit", "in": "query", "required": False,
                        "schema": {"type": "integer", "minimum": 1, "default": 200}}],
        "responses": {"200": _json(_ref("Users"), "users (at most `limit`)"), "400": _err("a bad limit")},
    }},
    "/healthz": {"get": {
        "operationId": "healthz", "summary": "Health: 503 until the first model is served",
        "responses": {"200": _json(_ref("Health"), "serving"),
                      "503": {"description": "no model yet, or Redis unavailable",
                              "content": {_JSON: {"schema": {"oneOf": [_ref("Health"), _ref("Error")]}}}}},
    }},
    "/metrics": {"get": {
        "operationId": "metrics", "summary": "Prometheus metrics",
        "description": "Under the add/remove relation (the default stack) only with the operator token: the "
                       "metrics hold exact counts, the ledger's figures and dead letters.",
        "security": [{}, {"userToken": []}],
        "responses": {"200": {"description": "Prometheus text exposition",
                              "content": {"text/plain": {"schema": _STR}}},
                      "401": _err("add/remove relation, no operator token (parameter `Authorization`)"),
                      "503": _UNAVAILABLE},
    }},
    "/openapi.json": {"get": {
        "operationId": "openapi", "summary": "This document",
        "responses": {"200": _json(_OBJ, "the OpenAPI 3 document")},
    }},
    "/": {"get": {"operationId": "page", "summary": "The web page",
                  "responses": {"200": {"description": "the page (text/plain when it is not built)",
                                        "content": {"text/html": {"schema": _STR},
                                                    "text/plain": {"schema": _STR}}}}}},
    "/dashboard": {"get": {"operationId": "dashboard", "summary": "The privacy dashboard page",
                           "responses": {"200": _HTML, "404": _err("the page is not installed")}}},
    "/static/{filename}": {"get": {
        "operationId": "static", "summary": "The pages' static files",
        "parameters": [{"name": "filename", "in": "path", "required": True, "schema": _STR}],
        "responses": {"200": {"description": "the file", "content": {"*/*": {"schema": _STR}}},
                      "403": {"description": "outside the static folder"},
                      "404": {"description": "no such file"}},
    }},
}

_INFO = {"title": "privrec HTTP API", "version": "1",
         "description": "Recommendations by contextual bandits with differential privacy (docs/serving.md). "
                        "Errors are JSON {\"error\": {\"parameter\", \"message\"}}."}


def openapi_document(server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.0 document (a fresh copy; ``server_url`` fills ``servers``)."""
    doc: dict[str, Any] = {"openapi": "3.0.3", "info": dict(_INFO), "paths": copy.deepcopy(PATHS),
                           "components": copy.deepcopy(COMPONENTS)}
    if server_url is not None:
        doc["servers"] = [{"url": server_url}]
    return doc


_DOC = web.AppKey("openapi_document", bytes)


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document (encoded once per app)."""
    return web.Response(body=request.app[_DOC], content_type=_JSON)


def add_routes(app: web.Application) -> None:
    """Serve the document at ``GET /openapi.json``."""
    import json

    app[_DOC] = json.dumps(openapi_document()).encode()
    app.router.add_get("/openapi.json", openapi_json)
