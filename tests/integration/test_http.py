"""The HTTP API against real services: a fresh broker, the session's redis-server, a worker
and ``python -m pipeline.apps.web``, all as processes; requests over loopback.

Every error of ``/recommend`` and ``/feedback`` answers a 4xx JSON
``{"error": {"parameter", "message"}}`` naming the parameter; the success path is
followed into Kafka (the shown list in ``recommendations``, the interaction in
``interactions``) and into the next release and the budget view.
"""

from __future__ import annotations

import json
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer

from pipeline.config.keys import PublicKeys
from pipeline.config.settings import DEFAULT_MECHANISM
from pipeline import services

from stacks import LocalStack, wait_for, web_stack

pytestmark = pytest.mark.integration

SETTINGS = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "40",
            "PRIVREC_ALGORITHM": "colin", "PRIVREC_EPSILON": "2", "PRIVREC_TICK_SECONDS": "0.3",
            "PRIVREC_LOGLEVEL": "WARNING",
            # a configured default pool: 30 of the 40 arms, not the catalog's default (the first 25)
            "PRIVREC_DEFAULT_POOL": ",".join(str(a) for a in range(39, 9, -1))}
CONFIGURED_POOL = [str(a) for a in range(39, 9, -1)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: services.ServiceHandle) -> Iterator[LocalStack]:
    with web_stack(tmp_path_factory.mktemp("http"), settings=SETTINGS, redis_url=redis_server.url,
                   namespace="http") as st:
        yield st


class Reply:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        assert self.headers["Content-Type"].startswith("application/json"), self.headers["Content-Type"]
        err = self.json["error"]
        assert isinstance(err["message"], str) and err["message"], err
        return dict(err)


def call(stack: LocalStack, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
         authorization: str | None = None) -> Reply:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if authorization is not None:
        headers["Authorization"] = authorization
    req = urllib.request.Request(stack.base_url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return Reply(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers, exc.read())


def recommend(stack: LocalStack, user: str = "1", **params: str) -> dict[str, Any]:
    query = "&".join(f"{k}={v}" for k, v in {"user": user, **params}.items())
    r = call(stack, "GET", f"/recommend?{query}")
    assert r.status == 200, r.body
    return dict(r.json)


def budget(stack: LocalStack, user: str | None = None) -> dict[str, Any]:
    """``/budget``, and with ``user`` that user's view, asked with their own token."""
    r = call(stack, "GET", "/budget" + (f"?user={user}" if user is not None else ""),
             authorization=None if user is None else f"Bearer {stack.user_token(user)}")
    assert r.status == 200, r.body
    return dict(r.json)


# --------------------------------------------------------------------------------------- /recommend


@pytest.mark.parametrize("query, status, parameter, says", [
    ("", 400, "user", "required"),
    ("user=", 400, "user", "required"),
    ("k=3", 400, "user", "required"),
    ("user=nobody", 404, "user", "unknown user 'nobody'"),
    ("user=1&k=0", 400, "k", "[1, 100]"),
    ("user=1&k=101", 400, "k", "[1, 100]"),
    ("user=1&k=-2", 400, "k", "[1, 100]"),
    ("user=1&k=abc", 400, "k", "integer"),
    ("user=1&k=2.5", 400, "k", "integer"),
    ("user=1&k=", 400, "k", "integer"),
    ("user=1&candidates=", 400, "candidates", "empty"),
    ("user=1&candidates=1,,2", 400, "candidates", "empty"),
    ("user=1&candidates=1,2,", 400, "candidates", "empty"),
    ("user=1&candidates=3,4,3", 400, "candidates", "repeat"),
    ("user=1&candidates=1,no-such-arm", 400, "candidates", "unknown arm 'no-such-arm'"),
    ("user=1&color=red", 400, "color", "unknown parameter"),
    ("user=1&k=3&K=3", 400, "K", "unknown parameter"),
])
def test_recommend_errors_name_the_parameter(stack: LocalStack, query: str, status: int, parameter: str,
                                             says: str) -> None:
    r = call(stack, "GET", f"/recommend?{query}")
    assert r.status == status, r.body
    err = r.error
    assert err["parameter"] == parameter
    assert says in err["message"], err["message"]


def test_recommend_ranks_the_candidates(stack: LocalStack) -> None:
    got = recommend(stack, "2", k="3", candidates="5,1,9,30,12")
    assert set(got) == {"user", "unit", "rec_id", "model_version", "items"}
    assert got["user"] == "2" and got["unit"] == 2 and got["model_version"] >= 1
    items = got["items"]
    assert len(items) == 3 and {it["item"] for it in items} <= {"5", "1", "9", "30", "12"}
    for it in items:
        assert it["name"] == f"arm {it['item']}"
        # with an item term served (once the item level clears its test, which a release may do at any
        # time), its share is part of the score: ``popularity``, present exactly then
        assert it["score"] == pytest.approx(it["mean"] + it["bonus"] + it.get("popularity", 0.0), abs=1e-12)
        assert it["bonus"] >= 0
    assert len({"popularity" in it for it in items}) == 1  # the term is served to every item or to none
    scores = [it["score"] for it in items]
    assert scores == sorted(scores, reverse=True)
    # k larger than the pool: the whole pool, ranked
    assert len(recommend(stack, "2", k="10", candidates="5,1")["items"]) == 2
    # no candidates: the configured default pool
    assert call(stack, "GET", "/users").json["default_pool"] == CONFIGURED_POOL
    assert {it["item"] for it in recommend(stack, "2", k="100")["items"]} == set(CONFIGURED_POOL)
    # every list gets its own rec_id
    assert recommend(stack, "2")["rec_id"] != recommend(stack, "2")["rec_id"]


# --------------------------------------------------------------------------------------- /feedback


@pytest.fixture
def shown(stack: LocalStack) -> dict[str, Any]:
    """A fresh shown list of user 4 (three items)."""
    return recommend(stack, "4", k="3")


@pytest.mark.parametrize("body, status, parameter, says", [
    ({"item": "1", "reward": 1}, 400, "rec_id", "required"),
    ({"rec_id": "R", "reward": 1}, 400, "item", "required"),
    ({"rec_id": "R", "item": "I"}, 400, "reward", "required"),
    ({"rec_id": 17, "item": "I", "reward": 1}, 400, "rec_id", "string"),
    ({"rec_id": "", "item": "I", "reward": 1}, 400, "rec_id", "string"),
    ({"rec_id": "R", "item": 5, "reward": 1}, 400, "item", "string"),
    ({"rec_id": "R", "item": "I", "reward": 1.5}, 400, "reward", "[0, 1]"),
    ({"rec_id": "R", "item": "I", "reward": -0.1}, 400, "reward", "[0, 1]"),
    ({"rec_id": "R", "item": "I", "reward": "1"}, 400, "reward", "number"),
    ({"rec_id": "R", "item": "I", "reward": True}, 400, "reward", "number"),
    ({"rec_id": "R", "item": "I", "reward": None}, 400, "reward", "number"),
    ({"rec_id": "R", "item": "I", "reward": 10 ** 400}, 400, "reward", "number"),
    ({"rec_id": "no-such-list", "item": "I", "reward": 1}, 404, "rec_id", "unknown rec_id 'no-such-list'"),
])
def test_feedback_errors_name_the_parameter(stack: LocalStack, shown: dict[str, Any], body: dict[str, Any],
                                            status: int, parameter: str, says: str) -> None:
    body = {k: (shown["rec_id"] if v == "R" else shown["items"][0]["item"] if v == "I" else v)
            for k, v in body.items()}
    r = call(stack, "POST", "/feedback", body)
    assert r.status == status, r.body
    err = r.error
    assert err["parameter"] == parameter
    assert says in err["message"], err["message"]
    # a rejected feedback does not use up the list
    ok = call(stack, "POST", "/feedback", {"rec_id": shown["rec_id"], "item": shown["items"][0]["item"], "reward": 0})
    assert ok.status == 202, ok.body


@pytest.mark.parametrize("raw", [b'{"rec_id": "R", "item": "I", "reward": NaN}',
                                 b'{"rec_id": "R", "item": "I", "reward": Infinity}',
                                 b'{"rec_id": "R", "item": "I", "reward": -Infinity}'])
def test_feedback_rejects_non_finite_rewards(stack: LocalStack, shown: dict[str, Any], raw: bytes) -> None:
    raw = raw.replace(b'"R"', json.dumps(shown["rec_id"]).encode())
    raw = raw.replace(b'"I"', json.dumps(shown["items"][0]["item"]).encode())
    r = call(stack, "POST", "/feedback", raw=raw)
    assert r.status == 400 and r.error["parameter"] == "reward" and "finite" in r.error["message"]


@pytest.mark.parametrize("raw", [b"not json", b"", b"\xff\xfe", b"[1, 2]", b'"text"', b"null"])
def test_feedback_body_must_be_a_json_object(stack: LocalStack, raw: bytes) -> None:
    r = call(stack, "POST", "/feedback", raw=raw)
    assert r.status == 400
    assert r.error["parameter"] == "body" and "JSON object" in r.error["message"]


@pytest.mark.parametrize("body, status, parameter, says", [
    ({"item": "1"}, 400, "user", "required"),
    ({"user": "1"}, 400, "item", "required"),
    ({"user": "1", "item": "1", "reward": 2}, 400, "reward", "[0, 1]"),
    ({"user": "1", "item": "1", "reward": "yes"}, 400, "reward", "number"),
    ({"user": "1", "item": "no-such-arm"}, 400, "item", "unknown arm 'no-such-arm'"),
    ({"user": "nobody", "item": "1"}, 404, "user", "unknown user 'nobody'"),
    ({"user": "1", "item": "1", "rec_id": "x"}, 400, "rec_id", "unknown field"),
    ({"user": "u" * 10_000, "item": "1"}, 400, "user", "at most 128 characters (MAX_ID_CHARS), got 10000"),
    ({"user": "1", "item": "i" * 129}, 400, "item", "at most 128 characters"),
])
def test_listen_errors_name_the_parameter(stack: LocalStack, body: dict[str, Any], status: int, parameter: str,
                                          says: str) -> None:
    r = call(stack, "POST", "/listen", body)
    assert r.status == status, r.body
    assert r.error["parameter"] == parameter and says in r.error["message"], r.error


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/recommend?user=" + "u" * 129, None),
    ("GET", "/recommend?user=1&candidates=1," + "c" * 129, None),
    ("GET", "/budget?user=" + "u" * 129, None),
    ("POST", "/feedback", {"rec_id": "r" * 129, "item": "1", "reward": 1}),
], ids=["recommend_user", "recommend_candidate", "budget_user", "feedback_rec_id"])
def test_ids_past_the_limit_are_400_naming_it(stack: LocalStack, method: str, path: str, body: Any) -> None:
    r = call(stack, method, path, body)
    assert r.status == 400, r.body
    assert "at most 128 characters (MAX_ID_CHARS)" in r.error["message"], r.error


def test_listen_becomes_a_listen_event_on_interactions(stack: LocalStack) -> None:
    r = call(stack, "POST", "/listen", {"user": "4", "item": "7"})  # user 4: no other test counts its interactions
    assert r.status == 202, r.body
    event_id = r.json["event_id"]
    consumer = KafkaConsumer("interactions", bootstrap_servers=stack.broker.address, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000)
    found = [json.loads(m.value) for m in consumer if json.loads(m.value).get("event_id") == event_id]
    consumer.close()
    assert found == [{"event_id": event_id, "user": "4", "arm": "7", "context": None, "reward": 1.0,
                      "ts": found[0]["ts"], "rec_id": None, "kind": "listen"}]


def test_feedback_item_must_be_in_the_shown_list(stack: LocalStack, shown: dict[str, Any]) -> None:
    outside = next(str(a) for a in range(40) if str(a) not in {it["item"] for it in shown["items"]})
    r = call(stack, "POST", "/feedback", {"rec_id": shown["rec_id"], "item": outside, "reward": 1})
    assert r.status == 400 and r.error["parameter"] == "item" and "not in the list" in r.error["message"]


def test_repeated_feedback_is_409(stack: LocalStack, shown: dict[str, Any]) -> None:
    first, second = shown["items"][0]["item"], shown["items"][1]["item"]
    assert call(stack, "POST", "/feedback", {"rec_id": shown["rec_id"], "item": first, "reward": 1}).status == 202
    again = call(stack, "POST", "/feedback", {"rec_id": shown["rec_id"], "item": first, "reward": 1})
    assert again.status == 409 and again.error["parameter"] == "rec_id" and "already" in again.error["message"]
    other = call(stack, "POST", "/feedback", {"rec_id": shown["rec_id"], "item": second, "reward": 0})
    assert other.status == 409 and other.error["parameter"] == "rec_id"


def test_unknown_routes_and_methods_answer_json(stack: LocalStack) -> None:
    r = call(stack, "GET", "/no-such-page")
    assert r.status == 404 and r.error["parameter"] is None
    r = call(stack, "GET", "/feedback")
    assert r.status == 405 and r.error


# --------------------------------------------------------------------------------------- success path


def _consume(stack: LocalStack, topic: str, match: str, timeout: float = 20.0) -> dict[str, Any]:
    consumer = KafkaConsumer(topic, bootstrap_servers=stack.broker.address, auto_offset_reset="earliest",
                             consumer_timeout_ms=500)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msg in consumer:
                value = json.loads(msg.value)
                if value.get("rec_id") == match:
                    return {"key": msg.key, "value": value}
    finally:
        consumer.close()
    raise AssertionError(f"no message with rec_id {match!r} in {topic!r} after {timeout:.0f} s")


def metrics(stack: LocalStack) -> dict[str, float]:
    r = call(stack, "GET", "/metrics")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
    values = {}
    for line in r.body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def settled(stack: LocalStack) -> dict[str, Any]:
    """The budget once every feedback this server accepted is in a release (earlier tests gave some)."""
    def caught_up() -> dict[str, Any] | None:
        m = metrics(stack)
        accepted = sum(v for k, v in m.items()
                       if k.startswith("privrec_feedback_total{") or k == "privrec_listens_total")
        b = budget(stack)
        return b if b["events_released"] == accepted else None

    return dict(wait_for(caught_up, 20, "every accepted feedback in a release"))


def test_recommend_feedback_release_budget(stack: LocalStack) -> None:
    user = "5"
    settled(stack)
    before = budget(stack, user)
    got = recommend(stack, user, k="4", candidates="7,8,9,10,11,12")
    item = got["items"][2]["item"]

    logged = _consume(stack, "recommendations", got["rec_id"])  # the shown list, as shown
    assert logged["key"] == user.encode()
    assert logged["value"]["user"] == user and logged["value"]["model_version"] == got["model_version"]
    assert logged["value"]["items"] == [it["item"] for it in got["items"]]

    r = call(stack, "POST", "/feedback", {"rec_id": got["rec_id"], "item": item, "reward": 0.75})
    assert r.status == 202, r.body
    assert {k: r.json[k] for k in ("accepted", "event_id")} == {"accepted": True, "event_id": f"{got['rec_id']}:fb"}
    # the id names the list, not the item; `learning`: this user (under the cap of 8 ticks) is learned from
    assert r.json["learning"]["learned"] is True and r.json["learning"]["reason"] is None
    assert r.json["learning"]["cap"] == 8 and r.json["learning"]["ticks_this_epoch"] < 8

    event = _consume(stack, "interactions", got["rec_id"])
    assert event["key"] == user.encode()
    # the whole shown list goes with the feedback: the Gram takes every shown item, never the user's choice alone
    assert {k: event["value"][k] for k in ("event_id", "user", "arm", "reward", "rec_id", "context", "shown")} == {
        "event_id": f"{got['rec_id']}:fb", "user": user, "arm": item, "reward": 0.75, "rec_id": got["rec_id"],
        "context": None, "shown": [it["item"] for it in got["items"]]}
    # the public marker of an answered list says that it was answered, not with which item
    marker = redis.Redis.from_url(stack.redis_url).get(PublicKeys(stack.namespace).recommendation(got["rec_id"])
                                                      + ":answered")
    assert marker == b"1"

    # counted in a later release, and in the user's budget
    after = wait_for(lambda: (b := budget(stack, user))["events_released"] > before["events_released"] and b,
                     20, "a release that covers the feedback")
    assert after["events_released"] == before["events_released"] + 1
    assert after["releases"] > before["releases"]
    assert after["user"]["interactions"] == before["user"]["interactions"] + 1
    assert after["history"][-1]["version"] == after["releases"]
    assert after["history"][-1]["count"] == after["events_released"]
    health = call(stack, "GET", "/healthz").json
    assert health["status"] == "ok" and health["model_version"] >= after["releases"] - 1


def test_budget_follows_the_users_interactions(stack: LocalStack) -> None:
    """User level (the default): each tick the user contributes to spends mu_at_cap * sqrt(B(k) / B(cap))."""
    from models.accounting import gdp_epsilon

    user = "3"  # no other test gives feedback for users 2 and 3
    b0 = budget(stack, user)
    assert b0["user"]["interactions"] == 0 and b0["user"]["epsilon"] == 0.0 and b0["user"]["ticks_this_epoch"] == 0
    eps, ticks = [0.0], [0]
    for reward in (1, 0, 1):
        got = recommend(stack, user, k="2")
        r = call(stack, "POST", "/feedback", {"rec_id": got["rec_id"], "item": got["items"][0]["item"],
                                              "reward": reward})
        assert r.status == 202
        # the answer's `learning` reads the same ledger as /budget: the ticks so far, under the cap
        assert r.json["learning"]["learned"] is True and r.json["learning"]["ticks_this_epoch"] == ticks[-1]
        b = wait_for(lambda: (x := budget(stack, user))["user"]["ticks_this_epoch"] > ticks[-1] and x, 20,
                     "the interaction folded into a release")
        ticks.append(b["user"]["ticks_this_epoch"])
        eps.append(b["user"]["epsilon"])
    assert ticks == [0, 1, 2, 3] and b["user"]["interactions"] == 3  # one tick each: we waited for every fold
    p = b["privacy"]
    # the bandit's statistic and the item sums compose to (2, 1e-5) (Gaussian DP: exact up to rounding)
    assert p["private"] and p["epsilon"] == pytest.approx(2.0, rel=1e-12) and p["delta"] == 1e-5
    assert p["mechanism"] == DEFAULT_MECHANISM
    assert p["unit"] == "user" and b["user"]["cap"] == p["cap"] == 8 and not b["user"]["at_cap"]
    for k in (1, 2, 3):  # the ledger's figure is the statement's calibration, recomputed here
        assert eps[k] == pytest.approx(gdp_epsilon(p["mu_at_cap"] * math.sqrt(p["ratios"][k - 1]), p["delta"]),
                                       rel=1e-6)
    assert eps[1] < eps[2] < eps[3] < p["epsilon"]  # spending grows with each tick, below the capped user's
    assert b["user"]["valid"] and b["user"]["remaining_ticks"] == 5
    assert budget(stack, "2")["user"]["interactions"] == 0  # another user's interactions do not count


def test_budget_errors(stack: LocalStack) -> None:
    r = call(stack, "GET", "/budget?user=nobody", authorization=f"Bearer {stack.operator_token}")
    assert r.status == 404 and r.error["parameter"] == "user"
    assert "user" not in budget(stack)


def test_a_users_view_needs_their_token_or_the_operators(stack: LocalStack) -> None:
    """``/budget?user=U``: 401 without a token, 403 with another's, 200 with U's or the operator's (the same body)."""
    user = "0"  # no other test gives feedback for user 0
    got = recommend(stack, user, k="2")  # one interaction, so the view has something of U's to show
    assert call(stack, "POST", "/feedback", {"rec_id": got["rec_id"], "item": got["items"][0]["item"],
                                              "reward": 1}).status == 202
    wait_for(lambda: budget(stack, user)["user"]["ticks_this_epoch"] == 1, 20, "the feedback folded into a release")

    for authorization in (None, "Basic abc", "Bearer "):
        r = call(stack, "GET", f"/budget?user={user}", authorization=authorization)
        assert r.status == 401 and r.error["parameter"] == "Authorization" and "token" in r.error["message"], r.body
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert "privacy" not in r.json  # nothing of the view beside the error
    own_token = stack.user_token(user)
    one_off = own_token[:-1] + ("1" if own_token[-1] == "0" else "0")
    for token in (stack.user_token("5"), one_off, "x" * 64, stack.operator_token[::-1], own_token.upper()):
        r = call(stack, "GET", f"/budget?user={user}", authorization=f"Bearer {token}")
        assert r.status == 403 and r.error["parameter"] == "Authorization", (token, r.body)
        assert "user" not in r.json and "privacy" not in r.json

    def both() -> tuple[dict[str, Any], dict[str, Any]] | None:
        own = call(stack, "GET", f"/budget?user={user}", authorization=f"Bearer {stack.user_token(user)}")
        operator = call(stack, "GET", f"/budget?user={user}", authorization=f"Bearer {stack.operator_token}")
        assert own.status == operator.status == 200, (own.body, operator.body)
        # a release between the two answers changes the public part: ask again
        return (own.json, operator.json) if own.json["releases"] == operator.json["releases"] else None

    own, operator = wait_for(both, 20, "two answers of the same release")
    assert own == operator  # the same view, whoever of the two asks
    assert own["user"]["user"] == user and own["user"]["interactions"] == 1 and own["user"]["epsilon"] > 0
    public = budget(stack)  # the aggregate statement stays public, and never carries a user
    assert "user" not in public and set(public) == set(own) - {"user"}

    r = call(stack, "POST", "/session", {})  # the synthetic world's users are a fixed list: no new user to give
    assert r.status == 409 and "fixed list of users" in r.error["message"], r.body


def test_privrec_budget_and_token_commands_use_the_stacks_tokens(
        stack: LocalStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``privrec budget --user U`` sends the operator token of the state directory's ``tokens.json``;
    ``privrec token --user U`` prints U's token."""
    from pipeline.serve.auth import OPERATOR_ENV, SECRET_ENV
    from privrec.cli import main

    for name in (OPERATOR_ENV, SECRET_ENV):
        monkeypatch.delenv(name, raising=False)
    assert main(["budget", "--user", "2", "--http", stack.base_url, "--state-dir", str(stack.state_dir)]) == 0
    assert "user 2: 0 interactions" in capsys.readouterr().out
    assert main(["token", "--user", "2", "--http", stack.base_url, "--state-dir", str(stack.state_dir)]) == 0
    token, link = capsys.readouterr().out.split()
    assert token == stack.user_token("2") and link == f"{stack.base_url}/?user=2#token={token}"
    empty = stack.state_dir / "no-stack"
    empty.mkdir(exist_ok=True)
    assert main(["budget", "--user", "2", "--http", stack.base_url, "--state-dir", str(empty)]) == 2
    assert "needs the operator token" in capsys.readouterr().err


def test_metrics_expose_the_counters(stack: LocalStack) -> None:
    got = recommend(stack, "1", k="2")
    assert call(stack, "POST", "/feedback", {"rec_id": got["rec_id"], "item": got["items"][0]["item"],
                                              "reward": 1}).status == 202
    call(stack, "GET", "/recommend?user=nobody")
    values = metrics(stack)
    assert values['privrec_http_requests_total{endpoint="/recommend",status="200"}'] >= 1
    assert values['privrec_http_requests_total{endpoint="/recommend",status="404"}'] >= 1
    assert values['privrec_feedback_total{reward="1"}'] >= 1
    assert values["privrec_model_version"] >= 1
    assert values["privrec_released_events"] >= 0 and "privrec_dead_letters" in values
    assert values['privrec_http_request_seconds_count{endpoint="/recommend"}'] >= 2


def test_users_and_healthz(stack: LocalStack) -> None:
    users = call(stack, "GET", "/users").json
    assert users["users"] == [str(u) for u in range(6)] and users["total"] == 6 and users["catalog"] == "synthetic"
    assert users["default_pool"] == CONFIGURED_POOL
    assert call(stack, "GET", "/users?limit=2").json["users"] == ["0", "1"]
    r = call(stack, "GET", "/users?limit=zero")
    assert r.status == 400 and r.error["parameter"] == "limit"
    h = call(stack, "GET", "/healthz")
    assert h.status == 200 and h.json["status"] == "ok" and h.json["model_version"] >= 1


def test_no_model_yet_is_503(stack: LocalStack, tmp_path: Path) -> None:
    """A web server on a namespace no worker has published to: 503 with a JSON error, not a crash."""
    env = {**stack.env, "PRIVREC_NAMESPACE": "http-empty"}
    port = services.free_port()
    web = services.start_process("web-empty", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], tmp_path,
                                 env=env, address=f"127.0.0.1:{port}")
    try:
        empty = LocalStack(tmp_path, "http-empty", env, stack.broker, stack.redis_url, web)
        r = call(empty, "GET", "/recommend?user=1")
        assert r.status == 503 and "no serving model" in r.error["message"]
        assert call(empty, "GET", "/healthz").status == 503
        assert call(empty, "GET", "/budget").status == 503
        page = call(empty, "GET", "/")
        assert page.status == 200 and b"<title>privrec" in page.body
    finally:
        services.stop(web)


def _dead_letters(stack: LocalStack, event_ids: set[str], timeout: float = 20.0) -> dict[str, str]:
    """The dead-letter reason of each of ``event_ids`` (the original event's ``event_id``)."""
    consumer = KafkaConsumer("dead-letters", bootstrap_servers=stack.broker.address, auto_offset_reset="earliest",
                             consumer_timeout_ms=500)
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while found.keys() != event_ids and time.monotonic() < deadline:
            for msg in consumer:
                letter = json.loads(msg.value)
                event_id = json.loads(letter["original"]).get("event_id")
                if event_id in event_ids:
                    found[event_id] = letter["reason"]
    finally:
        consumer.close()
    return found


def test_a_producer_cannot_forge_the_shown_list(stack: LocalStack) -> None:
    """Issue 32: the flat model publishes the exact Gram of shown lists, so ingest takes a feedback's list only
    from the server's record of its rec_id. A producer writing straight to ``interactions`` with a forged
    one-item list (A), no list (B) or no rec_id (C) is dead-lettered; the genuine ``/feedback`` is counted."""
    user = "3"
    settled(stack)
    before = budget(stack, user)
    got = recommend(stack, user, k="4", candidates="7,8,9,10,11,12")
    shown = [it["item"] for it in got["items"]]
    chosen, rec_id = shown[1], got["rec_id"]
    forged = {"event_id": "forged-A", "user": user, "arm": chosen, "reward": 1, "rec_id": rec_id, "shown": [chosen]}
    missing = {"event_id": "forged-B", "user": user, "arm": chosen, "reward": 1, "rec_id": rec_id}
    unnamed = {"event_id": "forged-C", "user": user, "arm": chosen, "reward": 1, "shown": [chosen]}
    prod = KafkaProducer(bootstrap_servers=stack.broker.address)
    for ev in (forged, missing, unnamed):
        prod.send("interactions", key=user.encode(), value=json.dumps(ev).encode())
    prod.flush()
    prod.close()
    r = call(stack, "POST", "/feedback", {"rec_id": rec_id, "item": chosen, "reward": 1})
    assert r.status == 202, r.body

    reasons = _dead_letters(stack, {"forged-A", "forged-B", "forged-C"})
    assert reasons["forged-A"].startswith("shown list differs") and str(shown) in reasons["forged-A"], reasons
    assert reasons["forged-B"].startswith("shown list missing"), reasons
    assert reasons["forged-C"].startswith("no server-issued rec_id"), reasons
    # only the genuine feedback reaches the statistics: one event more, in the user's budget too
    after = wait_for(lambda: (b := budget(stack, user))["events_released"] > before["events_released"] and b,
                     20, "a release that covers the genuine feedback")
    assert after["events_released"] == before["events_released"] + 1
    assert after["user"]["interactions"] == before["user"]["interactions"] + 1
    assert settled(stack)["events_released"] == after["events_released"]  # no forged event counted later
