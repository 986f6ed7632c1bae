"""Enforced access in the global mode (issue 12): Redis itself refuses the serving role every trusted key.

The roles of :func:`pipeline.config.acl.global_rules` are applied to a real redis-server; a real ingest, release and
solve run as the administrator; then the serving path runs as the ``web`` user and works, while every key
of the trusted kinds (exact statistics, offsets, noise state, the secret seed, config) is refused to it by
Redis with NOPERM, and writes to the public kinds are refused too. The ``worker`` user reaches its namespace
and nothing outside it.
"""

from __future__ import annotations

import json

import pytest
import redis

from pipeline.config import acl
from pipeline import services
from pipeline.data.catalog import SyntheticCatalog
from pipeline.ingestion.ingest import IngestProcessor
from pipeline.serve.serving import Recommender
from pipeline.config.settings import Settings
from pipeline.release.stages import ReleaseStage, SolveStage

pytestmark = pytest.mark.integration


def test_serving_is_refused_every_trusted_key_by_redis(own_redis: services.ServiceHandle) -> None:
    ns = "aclns"
    admin = redis.Redis.from_url(own_redis.url)
    s = Settings(namespace=ns, d=5, n_users=4, n_arms=30, epsilon=2.0, privacy_unit="event", redis_url=own_redis.url)
    catalog = SyntheticCatalog(n_users=4, d=5, n_arms=30)
    events = [json.dumps({"event_id": f"e{i}", "user": str(i % 4), "arm": str(i % 30), "reward": float(i % 2),
                          "ts": 1.7e12 + i, "rec_id": None}).encode() for i in range(60)]
    IngestProcessor(admin, ns, catalog).process(0, list(enumerate(events)))
    release = ReleaseStage(s, catalog, admin)
    assert release.tick() == 1
    SolveStage(s, admin, release.statement).run()
    admin.set("other:trusted:{other:p0}:stats", "another namespace's")

    rules = acl.global_rules(ns)
    creds = acl.new_credentials(list(rules))
    acl.apply_acl(admin, rules, creds)
    admin = redis.Redis.from_url(acl.role_url(own_redis.url, "default", creds["default"]))
    web = redis.Redis.from_url(acl.role_url(own_redis.url, "web", creds["web"]))
    worker = redis.Redis.from_url(acl.role_url(own_redis.url, "worker", creds["worker"]))
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(own_redis.url).ping()  # no password, no access

    # serving works as the web user ...
    got = Recommender(web, ns, catalog).recommend("1", [str(a) for a in range(10)], 3)
    assert len(got["items"]) == 3
    web.set(f"{ns}:recs:{{{ns}:recs}}:r1", "a shown list")
    # ... and Redis refuses it every trusted key
    keys = [k.decode() for k in admin.scan_iter(f"{ns}:*")]
    trusted = [k for k in keys if k.split(":")[1] in ("trusted", "noise", "config")]
    public = [k for k in keys if k.split(":")[1] in ("model", "released", "ledger")]
    assert any(":trusted:" in k and k.endswith(":secret") for k in trusted)  # the seed is among them
    assert any(":noise:" in k for k in trusted) and any(":stats" in k for k in trusted) and public
    for key in trusted:
        with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions to access one of the keys"):
            web.type(key)
        with pytest.raises(redis.exceptions.NoPermissionError):
            web.dump(key)
    for key in public:
        assert web.type(key) != b"none"
        with pytest.raises(redis.exceptions.NoPermissionError):
            web.delete(key)  # read-only
    # the worker reaches its namespace, not another's
    assert worker.get(f"{ns}:trusted:{{{ns}:rel}}:secret") is not None
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.get("other:trusted:{other:p0}:stats")
    for c in (admin, web, worker):
        c.close()
