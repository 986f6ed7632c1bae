"""The HTTP API's contract against live stacks: the Python client, and schemathesis over every route.

Two stacks, each a real Tansu broker, the session's redis-server, a worker and ``python -m pipeline.apps.web``
(:func:`stacks.web_stack`): global mode and local mode (``tree``). On them:

* the client (:mod:`producers.client`), sync and async: typed answers, the server's named errors as
  :class:`~producers.client.APIError`, a device's report in local mode;
* its retry of a 503: a real app over the real redis-server with no model yet answers 503 with
  ``Retry-After``; the model is published (the worker's own stages, in-process) while the client waits;
* schemathesis, from the document the server itself serves (``GET /openapi.json``): every operation,
  positive and negative examples, checks: no 5xx, status, content type, headers and body conform to the
  document, and data the document forbids is refused with a 4xx. The default run takes
  :data:`EXAMPLES` examples per operation, mode and generation mode; ``-m slow`` takes :data:`EXAMPLES_SLOW`
  (≥ 10,000 requests in all). The number of requests sent is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_headers_conformance, response_schema_conformance,
                                               status_code_conformance)

from models.local import LocalClient, MemoryStorage
from pipeline import services
from pipeline.serve.openapi import openapi_document
from producers.client import APIError, AsyncClient, Client, RetryPolicy
from producers.devices import config_from_public

from stacks import LocalStack, publish_model, web_stack

pytestmark = pytest.mark.integration

BASE = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "30",
        "PRIVREC_EPSILON": "2", "PRIVREC_TICK_SECONDS": "0.3", "PRIVREC_LOGLEVEL": "WARNING"}
MODES = {"global": {**BASE, "PRIVREC_PRIVACY_UNIT": "event"},
         "local": {**BASE, "PRIVREC_MODE": "local"}}

#: examples per operation, mode and generation mode (positive, negative): the default run
EXAMPLES = int(os.environ.get("PRIVREC_SCHEMATHESIS_EXAMPLES", "12"))
#: the slow run: 13 (operation, generation mode) pairs with inputs x 400 (+ 7 without inputs) = 5,207 requests a mode, 10,414 in all
EXAMPLES_SLOW = 400


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, redis_server: services.ServiceHandle
           ) -> Iterator[dict[str, LocalStack]]:
    with web_stack(tmp_path_factory.mktemp("api-global"), settings=MODES["global"], redis_url=redis_server.url,
                   namespace="apiglobal") as g, \
            web_stack(tmp_path_factory.mktemp("api-local"), settings=MODES["local"], redis_url=redis_server.url,
                      namespace="apilocal") as loc:
        yield {"global": g, "local": loc}


# -------------------------------------------------------------------------------------------- the client


def test_sync_client_recommend_feedback_listen_budget(stacks: dict[str, LocalStack]) -> None:
    st = stacks["global"]
    with Client(st.base_url, token=st.user_token("2")) as api:
        rec = api.recommend("2", k=3, candidates=[str(a) for a in range(10)])
        assert rec.user == "2" and len(rec.items) == 3 and rec.model_version >= 1
        assert {it.item for it in rec.items} <= {str(a) for a in range(10)}
        assert all(abs(it.score - (it.mean + it.bonus + (it.popularity or 0.0))) < 1e-9 for it in rec.items)
        assert [it.score for it in rec.items] == sorted((it.score for it in rec.items), reverse=True)
        acc = api.feedback(rec.rec_id, rec.top.item, 1.0)
        assert acc.event_id.startswith(rec.rec_id)
        with pytest.raises(APIError) as again:
            api.feedback(rec.rec_id, rec.top.item, 1.0)
        assert again.value.status == 409 and again.value.parameter == "rec_id"
        assert api.listen("2", "7").event_id.startswith("listen:")
        with pytest.raises(APIError) as bad:
            api.recommend("2", k=0)
        assert bad.value.status == 400 and bad.value.parameter == "k"
        with pytest.raises(APIError) as unknown:
            api.recommend("no-such-user")
        assert unknown.value.status == 404 and unknown.value.parameter == "user"
        b = api.budget("2")  # the client's token: user 2's own
        assert b.releases >= 1 and b.model_version >= 1 and b.user is not None and b.user["user"] == "2"
        assert api.budget("3", token=st.operator_token).user["user"] == "3"  # a call's own token wins
        with pytest.raises(APIError) as other:
            api.budget("3")  # user 2's token does not open user 3's view
        assert other.value.status == 403 and other.value.parameter == "Authorization"
        with pytest.raises(APIError) as fixed:
            api.session()  # the synthetic world's users are a fixed list
        assert fixed.value.status == 409
        assert api.health().ok
    with Client(st.base_url) as anonymous:
        assert anonymous.budget().user is None  # the aggregate statement is public
        with pytest.raises(APIError) as none:
            anonymous.budget("2")
        assert none.value.status == 401 and none.value.parameter == "Authorization"


def test_async_client_many_in_flight(stacks: dict[str, LocalStack]) -> None:
    async def run() -> list[Any]:
        async with AsyncClient(stacks["global"].base_url) as api:
            recs = await asyncio.gather(*(api.recommend(str(u % 6), k=2) for u in range(12)))
            accepted = await asyncio.gather(*(api.feedback(r.rec_id, r.items[1].item, 0.0) for r in recs))
            return [recs, accepted, await api.budget()]

    recs, accepted, budget = asyncio.run(run())
    assert len({r.rec_id for r in recs}) == 12
    assert all(a.event_id.startswith(r.rec_id) for r, a in zip(recs, accepted))
    assert budget.user is None and budget.events_released >= 0


def test_client_sends_a_device_report_in_local_mode(stacks: dict[str, LocalStack]) -> None:
    with Client(stacks["local"].base_url) as api:
        status, cfg = stacks["local"].get_json("/local/config")
        assert status == 200
        device = LocalClient("3", config_from_public(cfg), MemoryStorage())
        rec = api.recommend("3", k=2)
        assert rec.top.x is not None and len(rec.top.x) == 5
        rep = device.report(rec_id=rec.rec_id, x=list(rec.top.x), reward=1.0)
        got = api.report(rep)
        assert (got.user, got.version) == ("3", rep.version)
        with pytest.raises(APIError) as again:
            api.report(rep)
        assert again.value.status == 409
        with pytest.raises(APIError) as raw:
            api.feedback(rec.rec_id, rec.top.item, 1.0)
        assert raw.value.status == 400 and raw.value.parameter == "reward" and "local mode" in raw.value.message


def test_client_retries_a_503_after_its_retry_after(redis_server: services.ServiceHandle) -> None:
    """No model yet: 503 with Retry-After 1; the model is published while the client waits; it gets the list."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from pipeline.data.catalog import SyntheticCatalog
    from pipeline.config.settings import Settings
    from pipeline.apps.web import create_web_app

    s = Settings(namespace=f"apiretry{os.getpid()}", d=5, n_users=6, n_arms=30, epsilon=2.0, privacy_unit="event",
                 redis_url=redis_server.url, kafka=None)
    catalog = SyntheticCatalog(n_users=6, d=5, n_arms=30)
    seen: list[tuple[float, int]] = []

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        if request.path == "/recommend":
            seen.append((time.monotonic(), response.status))

    async def run() -> Any:
        app = create_web_app(s, catalog)
        app.on_response_prepare.append(record)
        async with TestServer(app) as server:
            async with AsyncClient(str(server.make_url("/")), retry=RetryPolicy(retries=6, backoff=0.05)) as api:
                while not seen:  # the first answer is the 503
                    task = asyncio.ensure_future(api.recommend("1", k=2))
                    await asyncio.sleep(0.2)
                await asyncio.to_thread(publish_model, redis_server.url, s, catalog)
                return await task

    rec = asyncio.run(run())
    assert rec.user == "1" and len(rec.items) == 2
    statuses = [st for _, st in seen]
    assert statuses[0] == 503 and statuses[-1] == 200 and set(statuses[:-1]) == {503}
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    assert min(gaps) >= 1.0 - 0.05, f"a retry came before the server's Retry-After (1 s): gaps {gaps}"


# ---------------------------------------------------------------------------------------------- schemathesis

_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
           response_schema_conformance]
_count_lock = threading.Lock()


def _fuzz(stack: LocalStack, examples: int, doc: dict[str, Any] | None = None) -> dict[str, int]:
    """Every operation of the served document (or ``doc``), ``examples`` positive and negative cases each;
    returns the requests sent per (operation, generation mode)."""
    if doc is None:
        status, doc = stack.get_json("/openapi.json")
        assert status == 200
    schema = schemathesis.openapi.from_dict(doc)
    counts: dict[str, int] = {}
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) == sum(len(ops) for ops in doc["paths"].values())
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            label = f"{op.label} {mode.value}"

            @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                checks = _CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
                case.call_and_validate(base_url=stack.base_url, checks=checks, timeout=10)
                with _count_lock:
                    counts[label] = counts.get(label, 0) + 1

            try:
                run()
            except Exception as exc:
                if "Unsatisfiable" in type(exc).__name__ or "no negative" in str(exc).lower():
                    continue  # nothing to negate (an operation without parameters or body)
                raise
    return counts


@pytest.mark.parametrize("mode", ["global", "local"])
def test_schemathesis_every_route(stacks: dict[str, LocalStack], mode: str) -> None:
    counts = _fuzz(stacks[mode], EXAMPLES)
    print(f"schemathesis {mode}: {sum(counts.values())} requests over {len(counts)} (operation, generation "
          f"mode) pairs: {counts}")
    doc = openapi_document()
    assert {f"{m.upper()} {p} positive" for p, ops in doc["paths"].items() for m in ops} <= set(counts)
    # an operation with inputs gets its full count (one without has a single possible request)
    assert counts["GET /recommend positive"] == counts["POST /feedback negative"] == EXAMPLES


def test_schemathesis_catches_a_nonconforming_answer(stacks: dict[str, LocalStack]) -> None:
    """The checks are live: against a document that says ``model_version`` is a string, /recommend fails them."""
    doc = openapi_document()
    doc["components"]["schemas"]["Recommendation"]["properties"]["model_version"] = {"type": "string"}
    doc["paths"] = {"/recommend": doc["paths"]["/recommend"]}
    with pytest.raises(FailureGroup) as failed:
        _fuzz(stacks["global"], EXAMPLES, doc)
    text = "".join(traceback.format_exception(failed.value))
    assert "Response violates schema" in text and "model_version" in text, text[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["global", "local"])
def test_schemathesis_every_route_10k(stacks: dict[str, LocalStack], mode: str) -> None:
    counts = _fuzz(stacks[mode], EXAMPLES_SLOW)
    print(f"schemathesis {mode} (slow): {sum(counts.values())} requests: {counts}")
    assert sum(counts.values()) >= 5_000  # both modes: >= 10,000
