"""The shuffler service's logic against a real redis-server (no stack): what it accepts, batches and mirrors.

* Codewords: the service batches each envelope's sealed messages population-wide (distinct users of every unit),
  never a user id, under the blanket's guarantee; and it mirrors each user's accepted envelopes to the public
  counts that ``/budget?user=`` reads (:func:`pipeline.serve.budget_view.user_interactions`), across a restart.
* Connected as its own ACL user (:func:`pipeline.config.acl.shuffler_rules`), it mirrors each user's ledger record
  and its cap refusals to the public ledger keys, and their accepted envelopes to the public report counts, which
  the ``web`` user reads for ``/budget`` (:func:`local_user_budget`, :func:`local_ledger_overview`,
  :func:`pipeline.serve.budget_view.user_interactions`); it still cannot touch any other key of the namespace.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio

from models.local import LocalClient, LocalConfig, LocalReport, MemoryStorage
from models.local.esa import SealedBatch, seal_report
from models.local.seal import AnalyzerKey
from models.local.shuffle import POPULATION
from pipeline import services
from pipeline.config import acl
from pipeline.config.keys import PublicKeys, partition_of
from pipeline.config.settings import Settings
from pipeline.data.catalog import SyntheticCatalog, load_catalog
from pipeline.modes.local.ingest import local_config
from pipeline.modes.local.local_http import catalog_codebook, local_ledger_overview, local_user_budget
from pipeline.modes.local.shuffler_service import ShufflerService
from pipeline.serve.budget_view import user_interactions


pytestmark = pytest.mark.integration

N = 150  # distinct users per batch (the blanket needs n p >~ log(1 / delta) fakes per codeword)
K = 8
CODEWORDS = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": str(N), "PRIVREC_N_ARMS": "40",
             "PRIVREC_ALGORITHM": "linucb", "PRIVREC_EPSILON": "2", "PRIVREC_MODE": "local",
             "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_SHUFFLE_BATCH": str(N), "PRIVREC_USER_CAP": "2",
             "PRIVREC_LOCAL_CODEWORDS": str(K), "PRIVREC_NAMESPACE": "cw2", "PRIVREC_MODEL": "flat"}


def test_the_service_batches_codeword_messages_population_wide(redis_client: redis.Redis, redis_server: Any) -> None:
    """The service path of what the retired in-worker shuffler did: each envelope's sealed messages go to a batch
    of distinct users of every unit (POPULATION), with no identity, under the blanket's exact guarantee; each
    user's accepted envelopes are counted in the public ``ledger_users``, across a restart of the service."""
    settings = Settings.from_mapping({}, environ={**CODEWORDS, "REDIS_URL": redis_server.url})
    catalog = load_catalog(settings)
    cfg = local_config(settings, catalog.d)
    book = catalog_codebook(catalog, K)
    key = AnalyzerKey.generate()
    public = PublicKeys(settings.namespace)
    arm = catalog.arm_ids[0]
    service = ShufflerService(redis_client, settings, catalog, cfg)

    def submit(service: ShufflerService, user: str, rep: LocalReport) -> int:
        redis_client.set(public.recommendation(rep.rec_id), json.dumps({"user": user, "items": [arm]}))
        status, body = asyncio.run(service.accept(seal_report(rep, key.public_bytes()).to_json()))
        assert status == 202, body
        return status

    sent = 0
    for u in catalog.users[:N]:
        rep = LocalClient(u, cfg, MemoryStorage(), seed=int(u) + 7, codebook=book).report(
            rec_id=f"first-{u}", x=book[3], reward=1.0)
        sent += len(rep.messages)
        assert submit(service, u, rep) == 202
    # no producer runs here: the closed batch waits in the service's outbox, as it would until sent
    outbox = [SealedBatch.parse(raw) for raw in redis_client.lrange(service.store.outbox, 0, -1)]
    assert len(outbox) == 1 and service.shuffler.seq.get(POPULATION) == 1
    (batch,) = outbox
    assert batch.unit == POPULATION and batch.n == N and len(batch.msgs) == sent
    assert b'"user"' not in batch.to_json() and (batch.analysis, batch.bound) == ("blanket", "blanket-exact")

    # /budget?user='s counts: the batch names no user, so the service mirrors what it accepted to the public counts,
    # read back through the web's view; a second report of one user (in the open batch) and a restart keep counting
    u0, u1 = catalog.users[0], catalog.users[1]
    again = LocalClient(u1, cfg, MemoryStorage(), seed=int(u1) + 7, codebook=book)
    again.report(rec_id="skip", x=book[3], reward=1.0)  # the device's first report, already accepted: version 2 next
    second = again.report(rec_id="second-1", x=book[3], reward=1.0)
    service = ShufflerService(redis_client, settings, catalog, cfg)  # a restart: the counts are in its store
    assert submit(service, u1, second) == 202

    async def counts() -> list[int]:
        r = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            return [await user_interactions(r, public, settings.partitions, u) for u in (u0, u1, "nobody")]
        finally:
            await r.aclose()

    assert asyncio.run(counts()) == [1, 2, 0]


def test_the_separate_shuffler_mirrors_its_ledger_to_the_public_keys_under_its_acl(
        own_redis: services.ServiceHandle) -> None:
    ns = "lfix"
    settings = Settings(mode="local", namespace=ns, d=4, n_users=6, n_arms=20, local_algorithm="round",
                        shuffle_batch=3, epsilon=2.0, user_cap=2, partitions=2, redis_url=own_redis.url)
    catalog = SyntheticCatalog(n_users=6, d=4, n_arms=20)
    rules = acl.stack_rules(settings)
    creds = acl.new_credentials(list(rules))
    acl.apply_acl(redis.Redis.from_url(own_redis.url), rules, creds)
    admin = redis.Redis.from_url(acl.role_url(own_redis.url, "default", creds["default"]))
    shuffler = redis.Redis.from_url(acl.role_url(own_redis.url, "shuffler", creds["shuffler"]))
    config: LocalConfig = settings.local_config(catalog.d)
    assert config.user_level and config.cap == 2
    service = ShufflerService(shuffler, settings, catalog, config)
    public = PublicKeys(ns)
    key = AnalyzerKey.generate()
    arms = [str(a) for a in range(20)]
    n_rec = 0

    def submit(user: str, device: LocalClient) -> tuple[int, dict[str, Any]]:
        nonlocal n_rec
        n_rec += 1
        rec_id = f"rec{n_rec}"
        admin.set(public.recommendation(rec_id), json.dumps({"user": user, "items": arms[:3]}))
        rep = device.report(rec_id=rec_id, x=np.full(4, 0.5), reward=1.0)
        return asyncio.run(service.accept(seal_report(rep, key.public_bytes()).to_json()))

    devices = {u: LocalClient(u, config) for u in ("1", "2")}
    assert submit("1", devices["1"])[0] == 202
    assert submit("1", devices["1"])[0] == 202
    assert submit("2", devices["2"])[0] == 202
    # a third envelope of user 1 in the same epoch: the device would refuse it, so send it as a rogue one
    n_rec += 1
    admin.set(public.recommendation(f"rec{n_rec}"), json.dumps({"user": "1", "items": arms[:3]}))
    epoch = config.epoch_at(time.time())
    rogue = LocalReport("1", 3, "round", f"rec{n_rec}", np.zeros(4), epoch=epoch)
    status, body = asyncio.run(service.accept(seal_report(rogue, key.public_bytes()).to_json()))
    assert status == 403 and "beyond the cap" in body["error"]["message"]

    # the public mirror, as the web user reads it for /budget
    async def web_view() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[int]]:
        web = redis.asyncio.Redis.from_url(acl.role_url(own_redis.url, "web", creds["web"]))
        try:
            rec1 = await web.hget(public.ledger_participation(partition_of("1", 2)), "1")
            rec2 = await web.hget(public.ledger_participation(partition_of("2", 2)), "2")
            overview = await local_ledger_overview(web, public, 2, config, epoch)
            counts = [await user_interactions(web, public, 2, u) for u in ("1", "2", "3")]  # /budget's interactions
        finally:
            await web.aclose()
        return (local_user_budget(config, "1", rec1, epoch), local_user_budget(config, "2", rec2, epoch), overview,
                counts)

    u1, u2, overview, counts = asyncio.run(web_view())
    assert (u1["ticks_this_epoch"], u1["at_cap"], u1["reports"]) == (2, True, 2)
    assert (u2["ticks_this_epoch"], u2["at_cap"], u2["reports"]) == (1, False, 1)
    assert counts == [2, 1, 0]  # the envelopes the shuffler accepted (the rogue third of user 1 is not counted)
    assert u1["epsilon"] == pytest.approx(config.spent(2)[0]) and u1["epsilon"] > 0
    assert overview["users"] == 2 and overview["users_at_cap"] == 1 and overview["capped_events"] == 1

    # least privilege still: the shuffler writes those three public kinds of ledger keys and nothing else of the
    # namespace
    for other in (public.ledger_deadletters(0), public.released, public.model_meta,
                  f"{ns}:trusted:{{{ns}:p0}}:stats"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            shuffler.hset(other, "x", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        shuffler.set(public.recommendation("rec1"), "x")
