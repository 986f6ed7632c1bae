"""Local mode's fixes of issue 21's review (docs/local-fixes.md), against a real redis-server.

* The analyzer (:class:`pipeline.modes.local.localmode.BatchIngestProcessor`, a real analyzer key) given a sealed
  batch with one tampered content commits nothing of that batch: no vector, and none of its shown items in the
  partition's Gram; every content is a dead letter naming why; the next whole batch counts.
* The separate shuffler (:class:`pipeline.modes.local.shuffler_service.ShufflerService`), connected as its own ACL
  user (:func:`pipeline.config.acl.shuffler_rules`), mirrors each user's ledger record and its cap refusals to the
  public ledger keys, and their accepted envelopes to the public report counts, which the ``web`` user reads for
  ``/budget`` (:func:`local_user_budget`, :func:`local_ledger_overview`,
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

from models.local import LocalClient, LocalConfig, LocalReport
from models.local.esa import SealedBatch, SealedShuffler, seal_report
from models.local.seal import AnalyzerKey
from pipeline import services
from pipeline.config import acl
from pipeline.config.keys import PublicKeys, partition_of
from pipeline.config.settings import Settings
from pipeline.data.catalog import SyntheticCatalog
from pipeline.modes.local.local_http import local_ledger_overview, local_user_budget
from pipeline.modes.local.localmode import BatchIngestProcessor
from pipeline.modes.local.shuffler_service import ShufflerService
from pipeline.serve.budget_view import user_interactions


pytestmark = pytest.mark.integration


def test_a_batch_with_a_tampered_content_adds_nothing_to_the_committed_sums(redis_client: redis.Redis) -> None:
    catalog = SyntheticCatalog(n_users=1, d=4, n_arms=12)
    cfg = LocalConfig(algorithm="round", d=4, epsilon=2.0, shuffle_batch=3)
    key = AnalyzerKey.generate()
    proc = BatchIngestProcessor(redis_client, "fix", catalog, cfg, key)
    arms = [str(a) for a in range(12)]  # the synthetic catalog's arm ids
    rng = np.random.default_rng(5)

    def batch(seq: int, tamper: bool) -> tuple[bytes, list[tuple[str, ...]], list[np.ndarray]]:
        sh = SealedShuffler(cfg)
        sh.seq = {0: seq - 1}
        lists = [tuple(arms[3 * i + j] for j in range(3)) for i in range(3)]
        vecs = [rng.normal(size=4) for _ in range(3)]
        envs = [seal_report(LocalReport(str(i), seq, "round", f"r{seq}-{i}", v), key.public_bytes()).with_shown(s)
                for i, (s, v) in enumerate(zip(lists, vecs))]
        (b,) = [out for e in envs for out in sh.add_envelope(e, unit=0)]
        blobs = list(b.sealed)
        if tamper:  # one content's GCM tag changed in transit
            i = blobs.index(envs[1].sealed)
            blobs[i] = blobs[i][:-1] + bytes([blobs[i][-1] ^ 1])
        return SealedBatch(0, seq, b.items, blobs, b.epsilon, b.delta).to_json(), lists, vecs

    bad, _, _ = batch(1, tamper=True)
    done = proc.process(0, [(0, bad)])
    assert len(done.dead) == 3
    reasons = sorted(d.reason for d in done.dead)
    assert sum("authentication failed" in r for r in reasons) == 1
    assert sum("not counted: 1 of the 3 contents" in r for r in reasons) == 2
    shard = proc.shard(0)
    assert int(shard.stats.count[0]) == 0
    np.testing.assert_array_equal(shard.stats.gram[0], np.zeros((4, 4)))  # no list of the batch, failed or not
    np.testing.assert_array_equal(shard.stats.b[0], np.zeros(4))

    good, lists, vecs = batch(2, tamper=False)
    done = proc.process(0, [(1, good)])
    assert done.dead == []
    proc.forget(0)  # read back what was committed
    shard = proc.shard(0)
    X = np.stack([proc.context(a) for s in lists for a in s])
    np.testing.assert_allclose(shard.stats.gram[0], X.T @ X, rtol=0, atol=1e-12)
    np.testing.assert_allclose(shard.stats.b[0], np.sum(vecs, axis=0), rtol=0, atol=1e-12)
    assert int(shard.stats.count[0]) == 3


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
