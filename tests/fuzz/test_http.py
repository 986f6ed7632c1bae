"""Fuzzing every HTTP parameter and body of the web API (issue 12), against the real apps.

The apps (``conftest.web``: global, user-level with ``cap_policy = reject``, local) run with aiohttp's
``TestServer`` over a real redis-server, each with a served model; there is no Kafka, so a request that
passes every check and would produce answers 503 "no Kafka producer configured" — the one documented 503
of these routes, accepted as a clear answer.

Properties of every answer: the status is 2xx or 4xx (or that 503), never another 5xx; a 4xx/503 body is
JSON ``{"error": {"parameter": str | null, "message": non-empty str}}``; a 2xx body of a JSON route is strict
JSON (no ``NaN``/``Infinity`` literals a browser's ``JSON.parse`` would refuse) of the route's shape.

Bodies that need a live shown list (``/feedback``, ``/report``) are written with the placeholders
``__REC__``/``__ITEM__``, replaced at request time by a real ``rec_id`` of the app and an item it showed,
so near-valid bodies get past the lookups to the deeper checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.local import LocalReport
from pipeline.data.records import MAX_ID_CHARS

from .webapps import D, N_ARMS, N_USERS, Reply, WebApps
from .strategies import (JSON_ANY, QUERY_PART, TEXT, WEIRD_TEXT, decoder_input, dumps,
                         near_valid, profile, query)

pytestmark = pytest.mark.integration  # a real redis-server

APPS = st.sampled_from(["global", "userlevel", "local"])
USERS = st.one_of(st.sampled_from([str(u) for u in range(N_USERS)]), TEXT)
ARMS = st.one_of(st.sampled_from([str(a) for a in range(N_ARMS)]), TEXT)
SMALL_INTS = st.one_of(st.integers(-3, 120), st.integers(), st.sampled_from([0, 1, 100, 101, 10**6, 2**63])).map(str)
CONTENT_TYPES = st.sampled_from(["application/json", "application/json", None, "text/plain",
                                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                 "application/json; charset=latin-1"])


def _strict_json(body: bytes) -> Any:
    def refuse(literal: str) -> Any:
        raise AssertionError(f"the answer holds the non-JSON literal {literal}: {body[:300]!r}")

    return json.loads(body, parse_constant=refuse)


def check_reply(r: Reply, what: str, *, may_503: bool = False) -> Any:
    """The properties of every answer (module docstring); returns the parsed JSON body."""
    assert 200 <= r.status < 300 or 400 <= r.status < 500 or (r.status == 503 and may_503), \
        f"{what}: status {r.status}: {r.body[:400]!r}"
    if r.status < 300 or r.refused_by_the_http_parser:
        return None
    assert r.content_type.startswith("application/json"), f"{what}: {r.status} answered {r.content_type!r}: {r.body[:200]!r}"
    doc = _strict_json(r.body)
    err = doc["error"]
    assert isinstance(err, dict) and {"parameter", "message"} <= set(err), f"{what}: {doc}"
    assert err["parameter"] is None or isinstance(err["parameter"], str), f"{what}: {doc}"  # "": a nameless one
    assert isinstance(err["message"], str) and err["message"].strip(), f"{what}: {doc}"
    if r.status == 503:
        assert "Kafka producer" in err["message"], f"{what}: an undocumented 503: {doc}"
    return doc


def _ok_json(r: Reply, what: str) -> Any:
    assert r.content_type.startswith("application/json"), f"{what}: {r.content_type!r}"
    return _strict_json(r.body)


# ---------------------------------------------------------------------------------------------- GET /recommend

RECOMMEND_QUERY = query(["user", "k", "candidates", "K", "user "], {
    "user": USERS, "k": SMALL_INTS,
    "candidates": st.one_of(st.lists(ARMS, max_size=6).map(",".join), TEXT,
                            st.lists(st.sampled_from([str(a) for a in range(N_ARMS)]), min_size=1, max_size=8,
                                     unique=True).map(",".join)),
})


def check_recommend(web: WebApps, app: str, q: str) -> None:
    r = web.request(app, "GET", "/recommend" + q)
    check_reply(r, f"GET /recommend{q} ({app})")
    if r.status != 200:
        return
    doc = _ok_json(r, "recommend")
    assert isinstance(doc["rec_id"], str) and doc["rec_id"] and isinstance(doc["model_version"], int)
    items = [it["item"] for it in doc["items"]]
    assert 1 <= len(items) <= 100 and len(set(items)) == len(items)
    for it in doc["items"]:
        assert all(math.isfinite(it[f]) for f in ("score", "mean", "bonus"))
        if app == "local":
            x = np.asarray(it["x"], dtype=float)
            assert x.shape == (D,) and np.linalg.norm(x) <= 1 + 1e-9


# ---------------------------------------------------------------------------------------------- POST bodies

FEEDBACK = {"rec_id": "__REC__", "item": "__ITEM__", "reward": 1}
LISTEN = {"user": "1", "item": "3", "reward": 0.5}
REPORT = {**LocalReport("1", 1, "tree", "__REC__", np.linspace(-1, 1, D)).to_dict()}
ROUND_REPORT = {**LocalReport("1", 7, "round", "__REC__", np.zeros(D)).to_dict()}


def _bodies(*valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    return st.one_of(*(decoder_input(v) for v in valid), *(near_valid(v) for v in valid))


FEEDBACK_BODIES = _bodies(FEEDBACK, {"rec_id": "__REC__", "item": "no-such-item", "reward": 0.0})
LISTEN_BODIES = _bodies(LISTEN, {"user": "5", "item": "29"})
REPORT_BODIES = _bodies(REPORT, ROUND_REPORT, FEEDBACK)


def _fill(web: WebApps, app: str, body: bytes) -> bytes:
    if b"__REC__" not in body and b"__ITEM__" not in body:
        return body
    rec_id, items = web.shared_list(app, "1")
    return body.replace(b"__REC__", rec_id.encode()).replace(b"__ITEM__", items[0].encode())


def _post(route: str, *, producing_apps: tuple[str, ...]) -> Callable[..., None]:
    def check(web: WebApps, app: str, body: bytes, content_type: str | None, q: str) -> None:
        r = web.request(app, "POST", route + q, _fill(web, app, body), content_type)
        what = f"POST {route}{q} ({app}, {content_type}) {body[:200]!r}"
        check_reply(r, what, may_503=app in producing_apps)
        if app not in producing_apps:  # the wrong mode for this route: a clear 400, whatever the body
            assert r.status == 400, what
        assert r.status >= 400, f"{what}: accepted without a Kafka producer: {r.status} {r.body[:200]!r}"

    return check


check_feedback = _post("/feedback", producing_apps=("global", "userlevel"))
check_listen = _post("/listen", producing_apps=("global", "userlevel"))
check_report = _post("/report", producing_apps=("local",))

JUNK_QUERY = query(["user", "x"], {"user": USERS})


# ---------------------------------------------------------------------------------------------- GET /budget, /users, /local/config

#: Who asks ``/budget``: nobody, the queried user (their own token), another user, the operator, junk.
AUTH = st.one_of(st.sampled_from(["none", "own", "other", "operator"]), TEXT.map(lambda t: "junk:" + t))


def _authorization(web: WebApps, who: str, user: str | None) -> str | None:
    if who == "none":
        return None
    if who == "operator":
        return f"Bearer {web.tokens.operator}"
    if who == "own":
        return f"Bearer {web.tokens.for_user(user or '')}"
    if who == "other":
        return f"Bearer {web.tokens.for_user((user or '') + 'x')}"
    # junk: what a header can carry (printable ASCII; aiohttp's client refuses control characters)
    return "Bearer " + "".join(c for c in who[5:] if " " <= c <= "~")


def check_budget(web: WebApps, app: str, q: str, who: str) -> None:
    from yarl import URL

    user = URL("/budget" + q, encoded=True).query.get("user")  # as the server reads it (yarl, like aiohttp)
    r = web.request(app, "GET", "/budget" + q, authorization=_authorization(web, who, user))
    doc = check_reply(r, f"GET /budget{q} ({app}, {who})")
    if r.refused_by_the_http_parser:
        return
    if user is None:  # the aggregate statement: public, whatever the header says
        assert r.status == 200, doc
    elif not user or len(user) > MAX_ID_CHARS:  # not an id: refused before any token is read
        assert r.status == 400 and doc["error"]["parameter"] == "user", (r.status, doc)
    elif who == "none" or (who.startswith("junk:") and not "".join(c for c in who[5:] if " " < c <= "~")):
        assert r.status == 401 and doc["error"]["parameter"] == "Authorization", (r.status, doc)
    elif who not in ("own", "operator"):
        assert r.status == 403 and doc["error"]["parameter"] == "Authorization", (r.status, doc)
    else:
        assert r.status in (200, 404), (r.status, doc)  # 404: an unknown user, told only to a token's holder
    if r.status == 200:
        doc = _ok_json(r, "budget")
        assert doc["releases"] >= 1 and isinstance(doc["privacy"], dict)
        assert ("user" in doc) == (user is not None)


def check_users(web: WebApps, app: str, q: str) -> None:
    r = web.request(app, "GET", "/users" + q)
    check_reply(r, f"GET /users{q} ({app})")
    if r.status == 200:
        doc = _ok_json(r, "users")
        assert doc["total"] == N_USERS and 1 <= len(doc["users"]) <= N_USERS


def check_local_config(web: WebApps, app: str, q: str) -> None:
    r = web.request(app, "GET", "/local/config" + q)
    check_reply(r, f"GET /local/config{q} ({app})")
    if r.refused_by_the_http_parser:
        return
    assert r.status == 200, r.body  # public, parameterless: every query is ignored
    doc = _ok_json(r, "local/config")
    assert doc["mode"] == ("local" if app == "local" else "global")
    if app == "local":
        assert doc["d"] == D and doc["algorithm"] == "tree"


# ---------------------------------------------------------------------------------------------- any method, any path

PATHS = st.one_of(
    st.sampled_from(["/recommend", "/feedback", "/listen", "/report", "/budget", "/budget/history", "/users",
                     "/local/config", "/healthz", "/dashboard", "/nope", "/static/nope.js", "/static/../pyproject.toml",
                     "/static/%2e%2e/%2e%2e/pyproject.toml", "//recommend", "/recommend/", "/%FF", "/%00"]),
    st.lists(QUERY_PART, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts)),
)
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
JSON_ROUTES = {"/recommend", "/budget", "/budget/history", "/users", "/local/config", "/healthz"}


def check_any_route(web: WebApps, app: str, method: str, path: str, q: str, body: bytes) -> None:
    r = web.request(app, method, path + q, _fill(web, app, body) if method != "GET" else None)
    what = f"{method} {path}{q} ({app})"
    if path.startswith("/static/") and r.status == 404 and method == "GET":
        return  # aiohttp's static files (the page's assets, not the API): its own empty 404, not the app's JSON
    check_reply(r, what, may_503=method == "POST" and path in ("/feedback", "/listen", "/report"))
    if r.status < 300 and method == "GET" and path in JSON_ROUTES:
        _ok_json(r, what)


# ---------------------------------------------------------------------------------------------- the tests

def _pair(check: Callable[..., None], **strategies: st.SearchStrategy[Any]) -> tuple[Any, Any]:
    """A route's default test and its 10,000-example ``slow`` twin (same strategies, same check)."""
    def make(slow: bool) -> Any:
        @profile(slow)
        @given(**strategies)
        def test(web: WebApps, **kwargs: Any) -> None:
            check(web, **kwargs)

        return pytest.mark.slow(test) if slow else test

    return make(False), make(True)


test_recommend, test_recommend_10k = _pair(check_recommend, app=APPS, q=RECOMMEND_QUERY)
test_feedback, test_feedback_10k = _pair(check_feedback, app=APPS, body=FEEDBACK_BODIES,
                                         content_type=CONTENT_TYPES, q=st.one_of(st.just(""), JUNK_QUERY))
test_listen, test_listen_10k = _pair(check_listen, app=APPS, body=LISTEN_BODIES,
                                     content_type=CONTENT_TYPES, q=st.one_of(st.just(""), JUNK_QUERY))
test_report, test_report_10k = _pair(check_report, app=APPS, body=REPORT_BODIES,
                                     content_type=CONTENT_TYPES, q=st.one_of(st.just(""), JUNK_QUERY))
test_budget, test_budget_10k = _pair(check_budget, app=APPS, q=query(["user", "users", "x"], {"user": USERS}),
                                     who=AUTH)
test_users, test_users_10k = _pair(check_users, app=APPS,
                                   q=query(["limit", "offset", "x"], {"limit": SMALL_INTS}))
test_local_config, test_local_config_10k = _pair(check_local_config, app=APPS, q=query(["d", "mode"], {}))
test_any_route, test_any_route_10k = _pair(
    check_any_route, app=APPS, method=METHODS, path=PATHS, q=st.one_of(st.just(""), JUNK_QUERY),
    body=st.one_of(st.binary(max_size=100), JSON_ANY.map(dumps), WEIRD_TEXT.map(lambda t: t.encode("utf-8",
                                                                                                 "surrogatepass"))))


# ---------------------------------------------------------------------------------------------- regressions

@pytest.mark.parametrize("route", ["/feedback", "/listen"])
@pytest.mark.parametrize("body", [
    b"[" * 20000,                                                    # RecursionError in json.loads: was a 500
    b'{"rec_id": "r", "item": "1", "user": "1", "reward": ' + b"1" * 5000 + b"}",  # int digits limit: was a 500
])
def test_hostile_json_bodies_are_400(web: WebApps, route: str, body: bytes) -> None:
    r = web.request("global", "POST", route, body)
    doc = check_reply(r, f"POST {route}")
    assert r.status == 400 and doc["error"]["parameter"] == "body", doc


@pytest.mark.parametrize("app, route, body", [
    ("global", "/feedback", {"rec_id": "\ud800", "item": "1", "reward": 1}),  # UnicodeEncodeError in Redis: was a 500
    ("userlevel", "/feedback", {"rec_id": "r\udc80", "item": "1", "reward": 0}),
    ("local", "/report", {**REPORT, "rec_id": "\ud800"}),
    ("global", "/listen", {"user": "\ud800", "item": "1"}),
])
def test_lone_surrogates_are_400(web: WebApps, app: str, route: str, body: dict[str, Any]) -> None:
    r = web.request(app, "POST", route, _fill(web, app, dumps(body)))
    doc = check_reply(r, f"POST {route} {body}")
    assert 400 <= r.status < 500, doc


def test_the_success_paths_are_reached(web: WebApps) -> None:
    """Not vacuous: the valid bodies get past every check to the producer (503 without Kafka)."""
    for app, route, body in (("global", "/feedback", FEEDBACK), ("userlevel", "/listen", LISTEN),
                             ("local", "/report", REPORT)):
        r = web.request(app, "POST", route, _fill(web, app, dumps(body)))
        assert r.status == 503 and "Kafka producer" in r.json()["error"]["message"], (app, route, r)
    with pytest.raises(AssertionError):
        check_reply(Reply(500, "application/json", b'{"error": {"parameter": null, "message": "boom"}}'), "x")
    with pytest.raises(AssertionError):
        check_reply(Reply(400, "application/json", b'{"error": {"parameter": "k", "message": ""}}'), "x")
    with pytest.raises(AssertionError):
        check_reply(Reply(503, "application/json", b'{"error": {"parameter": null, "message": "later"}}'), "x",
                    may_503=True)
