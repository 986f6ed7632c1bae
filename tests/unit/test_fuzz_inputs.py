"""Property-based fuzzing of every input privrec decodes (issue 12, "Bad input").

Targets: event decoding (``parse_interaction``, ``parse_batch``), local reports (``parse_report``) and
shuffled batches (``ShuffledBatch.parse``), and every HTTP parameter and body of the web API (a real
aiohttp server over a real redis-server with a served model; no Kafka, so a request that would produce
answers 503 "no Kafka producer", which is the documented answer). Properties: decoding returns a valid
record or raises the module's own error with a message; HTTP answers are 2xx or a clear 4xx/503 with a
JSON ``{"error": {"parameter", "message"}}`` — never a 5xx crash.

Default run: ``DEFAULT_EXAMPLES`` examples per target (derandomized, reproducible). The ``slow`` variants
run ``FULL_EXAMPLES`` (10,000) per target and only when asked for: ``pytest -m slow tests/unit/test_fuzz_inputs.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.local import LocalReport, ReportError, parse_report
from models.local.shuffle import ShuffledBatch
from pipeline import services
from pipeline.catalog import SyntheticCatalog
from pipeline.records import MalformedEvent, parse_batch, parse_interaction

DEFAULT_EXAMPLES = 150
FULL_EXAMPLES = 10_000
D = 5
CATALOG = SyntheticCatalog(n_users=4, d=D, n_arms=30)


def _profile(full: bool) -> Callable[[Any], Any]:
    return settings(max_examples=FULL_EXAMPLES if full else DEFAULT_EXAMPLES, derandomize=not full, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _full(request: pytest.FixtureRequest) -> None:
    """The 10,000-example variants run only when the ``slow`` marker is selected (``-m slow``)."""
    if "slow" not in (request.config.getoption("-m") or "") or "not slow" in (request.config.getoption("-m") or ""):
        pytest.skip("10,000-example fuzzing: run with -m slow")


# ---------------------------------------------------------------------------------------------- strategies

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))
JSON_ANY = st.recursive(JSON_LEAF, lambda kids: st.one_of(st.lists(kids, max_size=6),
                                                          st.dictionaries(st.text(max_size=10), kids, max_size=6)),
                        max_leaves=20)


def _mutate(valid: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid object with one field replaced by anything, removed, or an extra field added."""
    keys = sorted(valid)
    replace = st.tuples(st.sampled_from(keys), JSON_ANY).map(lambda kv: {**valid, kv[0]: kv[1]})
    drop = st.sampled_from(keys).map(lambda k: {kk: v for kk, v in valid.items() if kk != k})
    extra = st.tuples(st.text(max_size=8), JSON_ANY).map(lambda kv: {**valid, kv[0]: kv[1]})
    return st.one_of(replace, drop, extra, st.just(valid))


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


EVENT = {"event_id": "e1", "user": "1", "arm": "3", "reward": 1.0, "ts": 1.7e12, "rec_id": None,
         "context": [0.1] * D}
EVENT_BYTES = st.one_of(st.binary(max_size=200), JSON_ANY.map(_dumps), _mutate(EVENT).map(_dumps))

REPORT = LocalReport("1", 1, "tree", "r1", "3", np.full(D, 0.5)).to_dict()
REPORT_BYTES = st.one_of(st.binary(max_size=200), JSON_ANY.map(_dumps), _mutate(REPORT).map(_dumps))

BATCH = {"schema": "privrec.ShuffledBatch/1", "unit": 0, "seq": 1, "items": ["1", "2"], "m": [[0.1] * D] * 2,
         "epsilon": 2.0, "delta": 1e-5, "bound": "fmt-numerical"}
BATCH_BYTES = st.one_of(st.binary(max_size=200), JSON_ANY.map(_dumps), _mutate(BATCH).map(_dumps))


# ---------------------------------------------------------------------------------------------- decoders

def _check_event(raw: bytes) -> None:
    try:
        parse_interaction(raw, CATALOG)
    except MalformedEvent as e:
        assert str(e)
    batch = parse_batch([raw, _dumps(EVENT)], CATALOG)  # never raises; the good event is always counted
    assert len(batch.units) + len(batch.dead) == 2 and all(reason for _, reason in batch.dead)
    assert len(batch.units) >= 1


def _check_report(raw: bytes) -> None:
    try:
        rep = parse_report(raw, d=D)
    except ReportError as e:
        assert e.parameter and e.message
        return
    assert len(rep.vector) == D and np.isfinite(rep.vector).all() and rep.version >= 1


def _check_batch(raw: bytes) -> None:
    try:
        b = ShuffledBatch.parse(raw, d=D)
    except ValueError as e:
        assert str(e).startswith("batch:")
        return
    assert b.n == len(b.items) and b.seq >= 1


def _fuzz_pair(strategy: st.SearchStrategy[bytes], check: Callable[[bytes], None]) -> tuple[Any, Any]:
    """The default test of a decoder and its 10,000-example ``slow`` twin."""
    @_profile(False)
    @given(raw=strategy)
    def default(raw: bytes) -> None:
        check(raw)

    @pytest.mark.slow
    @_profile(True)
    @given(raw=strategy)
    def full(request: pytest.FixtureRequest, raw: bytes) -> None:
        _full(request)
        check(raw)

    return default, full


test_event_decoding, test_event_decoding_10k = _fuzz_pair(EVENT_BYTES, _check_event)
test_report_decoding, test_report_decoding_10k = _fuzz_pair(REPORT_BYTES, _check_report)
test_batch_decoding, test_batch_decoding_10k = _fuzz_pair(BATCH_BYTES, _check_batch)


# ---------------------------------------------------------------------------------------------- HTTP

class _Server:
    """The real web app in a thread of its own (its own event loop), over a real redis-server."""

    def __init__(self, app: Any) -> None:
        self.port = services.free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            from aiohttp import web

            asyncio.set_event_loop(self.loop)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(20)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _seed(url: str, ns: str, mode: str) -> Any:
    from pipeline.ingest import IngestProcessor
    from pipeline.localmode import LocalReleaseStage
    from pipeline.settings import Settings
    from pipeline.stages import ReleaseStage, SolveStage

    s = Settings(namespace=ns, d=D, n_users=4, n_arms=30, epsilon=2.0, privacy_unit="event", redis_url=url, mode=mode)
    client = redis.Redis.from_url(url)
    if mode == "global":
        events = [_dumps({**EVENT, "event_id": f"e{i}", "user": str(i % 4), "arm": str(i % 30)}) for i in range(40)]
        IngestProcessor(client, ns, CATALOG).process(0, list(enumerate(events)))
        release: Any = ReleaseStage(s, CATALOG, client)
    else:
        release = LocalReleaseStage(s, CATALOG, client)
    release.tick(force=True)
    SolveStage(s, client, release.statement).run()
    client.close()
    return s


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Server]]:
    from pipeline.web import create_web_app

    rds = services.start_redis(tmp_path_factory.mktemp("fuzz-redis"))
    out: dict[str, _Server] = {}
    try:
        for mode in ("global", "local"):
            s = _seed(rds.url, f"fz{mode}", mode)
            out[mode] = _Server(create_web_app(s, CATALOG))
        yield out
    finally:
        for srv in out.values():
            srv.stop()
        services.stop(rds)


PARAM = st.one_of(st.text(max_size=20), st.sampled_from(["1", "3", "0", "-1", "10", "101", "1e3", "nan", "", " "]))
QUERY = st.dictionaries(st.sampled_from(["user", "k", "candidates", "limit", "x", "user "]), PARAM, max_size=4)
BODY = st.one_of(st.binary(max_size=120), JSON_ANY.map(_dumps),
                 _mutate({"rec_id": "r", "item": "3", "reward": 1}).map(_dumps),
                 _mutate({"user": "1", "item": "3", "reward": 0.5}).map(_dumps), REPORT_BYTES)
GETS = ["/recommend", "/budget", "/users", "/local/config", "/budget/history", "/healthz"]
POSTS = ["/feedback", "/listen", "/report"]


def _check_http(srv: _Server, method: str, path: str, query: dict[str, str], body: bytes) -> None:
    q = ("?" + urllib.parse.urlencode(query)) if query else ""
    status, raw = srv.request(method, path + q, body if method == "POST" else None)
    assert status < 500 or status == 503, (method, path, query, body[:80], status, raw[:300])
    if status >= 400:
        doc = json.loads(raw)
        assert isinstance(doc["error"]["message"], str) and doc["error"]["message"], doc


HTTP_CASE = st.tuples(st.sampled_from(["global", "local"]), st.sampled_from(["GET", "POST"]), QUERY, BODY)


def _http_case(servers: dict[str, _Server], case: tuple[str, str, dict[str, str], bytes], k: int) -> None:
    mode, method, query, body = case
    path = (GETS if method == "GET" else POSTS)[k % (len(GETS) if method == "GET" else len(POSTS))]
    _check_http(servers[mode], method, path, query, body)


@_profile(False)
@given(case=HTTP_CASE, k=st.integers(min_value=0, max_value=59))
def test_http(servers: dict[str, _Server], case: tuple[str, str, dict[str, str], bytes], k: int) -> None:
    _http_case(servers, case, k)


@pytest.mark.slow
@_profile(True)
@given(case=HTTP_CASE, k=st.integers(min_value=0, max_value=59))
def test_http_10k(request: pytest.FixtureRequest, servers: dict[str, _Server],
                  case: tuple[str, str, dict[str, str], bytes], k: int) -> None:
    _full(request)
    _http_case(servers, case, k)


def test_the_checks_are_not_vacuous() -> None:
    """A 5xx, or a 4xx without a message, fails the HTTP property; a crash of a decoder propagates."""
    class Answer:
        def __init__(self, status: int, body: bytes) -> None:
            self.answer = (status, body)

        def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
            return self.answer

    for status, body in ((500, b'{"error": {"parameter": null, "message": "internal"}}'),
                         (400, b'{"error": {"parameter": "k", "message": ""}}'), (404, b"not json")):
        with pytest.raises((AssertionError, ValueError)):
            _check_http(Answer(status, body), "GET", "/recommend", {}, b"")  # type: ignore[arg-type]
    _check_http(Answer(400, b'{"error": {"parameter": "k", "message": "bad"}}'), "GET", "/x", {}, b"")  # type: ignore[arg-type]
    with pytest.raises(ReportError):
        parse_report(b'{"reward": 1}', d=D)
