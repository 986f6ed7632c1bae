"""A Python client of privrec's HTTP API (the contract: ``GET /openapi.json``, :mod:`pipeline.serve.openapi`).

Two clients with the same methods, :class:`AsyncClient` (aiohttp; one connection pool, many requests in
flight) and :class:`Client` (blocking; ``http.client`` over one keep-alive connection):

* ``recommend(user, k=10, candidates=None)`` → :class:`Recommendation`
* ``feedback(rec_id, item, reward)`` → :class:`Accepted`
* ``listen(user, item, reward=1.0)`` → :class:`Accepted`
* ``budget(user=None, token=None)`` → :class:`Budget` (with ``user``, a per-user view: sent with ``token``, else the
  client's, as ``Authorization: Bearer <token>``: the user's own token or the operator token)
* ``session()`` → :class:`Session`: a new user and their token (a catalog that takes new users)
* ``report(report)`` (local mode: a device's report, bytes or anything with ``to_json()``) → :class:`ReportAccepted`
* ``health()`` → :class:`Health` (a 503 "starting" is an answer here, not an error)

An answer other than the documented success raises :class:`APIError` with the status and the server's
``{"error": {"parameter", "message"}}``. A ``503`` (Redis restarting, the broker away, no model yet) is
retried with exponential backoff, waiting at least the server's ``Retry-After``, up to ``retries`` times;
retrying is safe on every route, because a 503 means nothing was recorded (a feedback whose produce fails
releases its list again). Timeouts and dropped connections are *not* retried: whether the server recorded
the request is then unknown, and a blind repeat of a feedback could only answer 409.

Examples
--------
>>> RetryPolicy(retries=3, backoff=0.1).delay(attempt=2, retry_after="0.05")
0.4
>>> RetryPolicy(retries=3, backoff=0.1).delay(attempt=0, retry_after="2")
2.0
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import aiohttp

__all__ = ["APIError", "Accepted", "AsyncClient", "Budget", "Client", "Health", "Recommendation",
           "RecommendedItem", "ReportAccepted", "RetryPolicy", "Session"]


class APIError(RuntimeError):
    """The API answered with an error: ``status`` and the server's named ``parameter`` and ``message``."""

    def __init__(self, method: str, path: str, status: int, parameter: str | None, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}"
                         f"{f' ({parameter})' if parameter else ''}: {message}")
        self.status = status
        self.parameter = parameter
        self.message = message


@dataclass(frozen=True, slots=True)
class RecommendedItem:
    """One ranked item: UCB ``score`` = ``mean`` + ``bonus`` (+ ``popularity``, the item term, when on)."""

    item: str
    name: str
    score: float
    mean: float
    bonus: float
    popularity: float | None = None
    #: local mode: the item's public feature vector, for the device's ``r x``
    x: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A shown list; answer it with ``feedback(rec_id, item, reward)`` (or a device's report)."""

    user: str
    rec_id: str
    model_version: int
    items: tuple[RecommendedItem, ...]

    @property
    def top(self) -> RecommendedItem:
        return self.items[0]


@dataclass(frozen=True, slots=True)
class Accepted:
    """``202`` of ``/feedback`` or ``/listen``: the broker acknowledged the event."""

    event_id: str


@dataclass(frozen=True, slots=True)
class ReportAccepted:
    """``202`` of ``/report``: the device's report with this ``version`` is on ``ldp-reports``."""

    user: str
    version: int


@dataclass(frozen=True, slots=True)
class Budget:
    """``GET /budget``: the main figures, and the whole answer in ``raw``."""

    privacy: dict[str, Any]
    model_version: int
    releases: int
    events_released: int
    #: with ``user=``: that user's guarantee (``interactions``, ``epsilon``, ...)
    user: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class Health:
    """``GET /healthz``: ``ok`` once a model is served (``starting`` before)."""

    status: str
    model_version: int | None
    pid: int

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of a ``503``: at most ``retries``, waiting ``backoff * 2**attempt`` (capped at ``max_delay``)
    and at least the server's ``Retry-After`` seconds."""

    retries: int = 5
    backoff: float = 0.1
    max_delay: float = 5.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        wait = min(self.max_delay, self.backoff * 2.0 ** attempt)
        if retry_after is not None:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:  # an HTTP date: not sent by privrec; fall back on the backoff
                pass
        return wait


class _Reportable(Protocol):
    def to_json(self) -> bytes: ...


# ------------------------------------------------------------------------ requests and answers (shared)

def _recommend_query(user: str, k: int, candidates: list[str] | tuple[str, ...] | None) -> str:
    params = {"user": user, "k": str(k)}
    if candidates is not None:
        params["candidates"] = ",".join(candidates)
    return "/recommend?" + urllib.parse.urlencode(params)


@dataclass(frozen=True, slots=True)
class Session:
    """``POST /session``: a new user of the server's making and the token that opens their per-user views."""

    user: str
    token: str = field(repr=False)


def _auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def _budget_query(user: str | None) -> str:
    return "/budget" if user is None else "/budget?" + urllib.parse.urlencode({"user": user})


def _report_body(report: bytes | _Reportable) -> bytes:
    return report if isinstance(report, bytes) else report.to_json()


def _item(d: dict[str, Any]) -> RecommendedItem:
    return RecommendedItem(item=d["item"], name=d["name"], score=d["score"], mean=d["mean"], bonus=d["bonus"],
                           popularity=d.get("popularity"), x=tuple(d["x"]) if "x" in d else None)


def _recommendation(d: dict[str, Any]) -> Recommendation:
    return Recommendation(user=d["user"], rec_id=d["rec_id"], model_version=int(d["model_version"]),
                          items=tuple(_item(it) for it in d["items"]))


def _budget(d: dict[str, Any]) -> Budget:
    return Budget(privacy=d["privacy"], model_version=int(d["model"]["version"]), releases=int(d["releases"]),
                  events_released=int(d["events_released"]), user=d.get("user"), raw=d)


def _health(status: int, body: bytes) -> Health:
    d = _check("GET", "/healthz", status, body, ok=(200, 503))
    if "status" not in d:  # a 503 of the store itself (Redis away): an error, not a health report
        _raise("GET", "/healthz", status, body)
    return Health(status=d["status"], model_version=d["model_version"], pid=int(d["pid"]))


def _raise(method: str, path: str, status: int, body: bytes) -> None:
    try:
        err = json.loads(body)["error"]
        parameter, message = err.get("parameter"), str(err.get("message"))
    except (ValueError, KeyError, TypeError, AttributeError):
        parameter, message = None, body[:300].decode("utf-8", "replace")
    raise APIError(method, path.split("?")[0], status, parameter, message)


def _check(method: str, path: str, status: int, body: bytes, ok: tuple[int, ...]) -> Any:
    if status not in ok:
        _raise(method, path, status, body)
    return json.loads(body)


# ------------------------------------------------------------------------------------------ async


class AsyncClient:
    """The API over aiohttp: ``async with AsyncClient("http://127.0.0.1:8080") as api: await api.recommend("2")``.

    ``session``: an aiohttp session to share (not closed by this client); by default one of its own. ``token``: sent on
    per-user calls (``budget(user)``) unless the call names its own: a user's token or the operator token.
    """

    def __init__(self, base_url: str, *, retry: RetryPolicy = RetryPolicy(), timeout: float = 30.0,
                 session: aiohttp.ClientSession | None = None, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._own = session is None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
        self._session = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def _call(self, method: str, path: str, body: bytes | None = None, *, token: str | None = None
                    ) -> tuple[int, bytes]:
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **_auth(token)}
        for attempt in range(self.retry.retries + 1):
            url = path if path.startswith(("http://", "https://")) else self.base_url + path  # the shuffler: its own
            async with self._sess().request(method, url, data=body, headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 503 or attempt == self.retry.retries:
                    return resp.status, raw
                wait = self.retry.delay(attempt, resp.headers.get("Retry-After"))
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def recommend(self, user: str, k: int = 10, candidates: list[str] | tuple[str, ...] | None = None
                        ) -> Recommendation:
        path = _recommend_query(user, k, candidates)
        return _recommendation(_check("GET", path, *await self._call("GET", path), ok=(200,)))

    async def feedback(self, rec_id: str, item: str, reward: float) -> Accepted:
        body = json.dumps({"rec_id": rec_id, "item": item, "reward": reward}).encode()
        return Accepted(_check("POST", "/feedback", *await self._call("POST", "/feedback", body), ok=(202,))
                        ["event_id"])

    async def listen(self, user: str, item: str, reward: float = 1.0) -> Accepted:
        body = json.dumps({"user": user, "item": item, "reward": reward}).encode()
        return Accepted(_check("POST", "/listen", *await self._call("POST", "/listen", body), ok=(202,))
                        ["event_id"])

    async def report(self, report: bytes | _Reportable) -> ReportAccepted:
        d = _check("POST", "/report", *await self._call("POST", "/report", _report_body(report)), ok=(202,))
        return ReportAccepted(user=d["user"], version=int(d["version"]))

    async def submit(self, url: str, envelope: bytes) -> ReportAccepted:
        """A sealed envelope to a separate shuffler at ``url`` (``/local/config``'s ``esa.shuffler``)."""
        d = _check("POST", url, *await self._call("POST", url, envelope), ok=(202,))
        return ReportAccepted(user=d["user"], version=int(d["version"]))

    async def budget(self, user: str | None = None, *, token: str | None = None) -> Budget:
        path = _budget_query(user)
        sent = None if user is None else token or self.token
        return _budget(_check("GET", path, *await self._call("GET", path, token=sent), ok=(200,)))

    async def session(self) -> Session:
        d = _check("POST", "/session", *await self._call("POST", "/session", b"{}"), ok=(201,))
        return Session(user=d["user"], token=d["token"])

    async def health(self) -> Health:
        """One try (no retry: a 503 "starting" is the answer)."""
        async with self._sess().get(self.base_url + "/healthz") as resp:
            return _health(resp.status, await resp.read())


# ------------------------------------------------------------------------------------------- sync


class Client:
    """The API, blocking, over one keep-alive connection (``http.client``; reopened when the server closes it).

    ``with Client("http://127.0.0.1:8080") as api: rec = api.recommend("2", k=5)``. Not thread-safe: one per
    thread. ``token``: sent on per-user calls (``budget(user)``) unless the call names its own.
    """

    def __init__(self, base_url: str, *, retry: RetryPolicy = RetryPolicy(), timeout: float = 30.0,
                 token: str | None = None) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"`base_url` must be http(s)://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.token = token
        self._prefix = url.path.rstrip("/")
        self._timeout = timeout
        self._url = url
        self._conn: http.client.HTTPConnection | None = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._url.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self._url.hostname or "", self._url.port, timeout=self._timeout)
        return self._conn

    def _once(self, method: str, path: str, body: bytes | None, token: str | None = None
              ) -> tuple[int, bytes, str | None]:
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **_auth(token)}
        for fresh in (False, True):
            conn = self._connection()
            try:
                conn.request(method, self._prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()  # the server closed an idle keep-alive connection: reopen once, before it read anything
                if fresh:
                    raise
                continue
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
            return resp.status, raw, resp.getheader("Retry-After")
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, body: bytes | None = None, *, token: str | None = None
              ) -> tuple[int, bytes]:
        for attempt in range(self.retry.retries + 1):
            status, raw, retry_after = self._once(method, path, body, token)
            if status != 503 or attempt == self.retry.retries:
                return status, raw
            time.sleep(self.retry.delay(attempt, retry_after))
        raise AssertionError("unreachable")

    def recommend(self, user: str, k: int = 10, candidates: list[str] | tuple[str, ...] | None = None
                  ) -> Recommendation:
        path = _recommend_query(user, k, candidates)
        return _recommendation(_check("GET", path, *self._call("GET", path), ok=(200,)))

    def feedback(self, rec_id: str, item: str, reward: float) -> Accepted:
        body = json.dumps({"rec_id": rec_id, "item": item, "reward": reward}).encode()
        return Accepted(_check("POST", "/feedback", *self._call("POST", "/feedback", body), ok=(202,))["event_id"])

    def listen(self, user: str, item: str, reward: float = 1.0) -> Accepted:
        body = json.dumps({"user": user, "item": item, "reward": reward}).encode()
        return Accepted(_check("POST", "/listen", *self._call("POST", "/listen", body), ok=(202,))["event_id"])

    def report(self, report: bytes | _Reportable) -> ReportAccepted:
        d = _check("POST", "/report", *self._call("POST", "/report", _report_body(report)), ok=(202,))
        return ReportAccepted(user=d["user"], version=int(d["version"]))

    def budget(self, user: str | None = None, *, token: str | None = None) -> Budget:
        path = _budget_query(user)
        sent = None if user is None else token or self.token
        return _budget(_check("GET", path, *self._call("GET", path, token=sent), ok=(200,)))

    def session(self) -> Session:
        d = _check("POST", "/session", *self._call("POST", "/session", b"{}"), ok=(201,))
        return Session(user=d["user"], token=d["token"])

    def health(self) -> Health:
        """One try (no retry: a 503 "starting" is the answer)."""
        status, raw, _ = self._once("GET", "/healthz", None)
        return _health(status, raw)
