"""Least privilege by default (issue 22), against real redis-servers started by ``privrec up``.

* global, local and federated mode, default settings: each process connects as its own Redis user; the web's
  user gets NOPERM on every trusted, noise and config key (the noise seed among them) and on writes to the
  public kinds, serving still works, the worker's user can still make a release durable (``CONFIG SET
  appendfsync`` on Redis 7.0), a client without a password is refused, and no password appears in a log, in
  ``stack.json``, in ``privrec status`` (text or JSON) or on a process's command line;
* an external Redis: ``privrec up`` refuses to start without the users and prints the exact ``ACL SETUSER``
  lines; once they are applied it starts; ``--redis-admin-url`` creates them; ``--no-acl`` runs and
  ``/budget`` says serving can read trusted state;
* a user driven past ``user_budget`` in a live stack is no longer learned from: the ledger shows the most ticks
  the budget allows (the next would exceed it), spent epsilon at most the budget, and every event after that
  is counted "not learned (budget)"; in local mode the server accepts the reports the budget allows and
  refuses (403, counted) the rest.
"""

from __future__ import annotations

import dataclasses

import json
import math
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from kafka import KafkaProducer

from models.accounting import gdp_epsilon, gdp_mu
from pipeline.config import acl
from pipeline.modes.federated.federation import site_namespace
from pipeline.config.keys import PUBLIC_KINDS
from pipeline.config.ledger import LedgerRecord
from pipeline.config.settings import Settings
from pipeline.state.trusted import TrustedKeys, make_durable
from privrec import ops
from privrec.ops.redis_users import role_redis_url
from privrec.ops.stackfile import OpsError, read_tokens

from stacks import REPO, exact_released_count, http, start_redis, up_stack, wait_for

pytestmark = pytest.mark.integration

WORLD = dict(d=4, n_users=6, n_arms=30, tick_seconds=0.3, partitions=1)
#: Kinds the web may read (besides its own ``recs``): the public layout of pipeline.config.keys and pipeline.config.acl.
READABLE = {*PUBLIC_KINDS, "ledger", "ops", "recs"}



def _privrec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "privrec.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO)


def _assert_no_password_anywhere(state: Path, stack: dict[str, Any], creds: dict[str, str]) -> None:
    secrets = [pw for pw in creds.values()]
    for path in state.rglob("*"):
        if path.is_file() and path.name != acl.ROLES_FILE and "appendonlydir" not in path.parts:
            text = path.read_bytes()
            assert not any(pw.encode() in text for pw in secrets), f"a password in {path}"
    for args in (("status", "--state-dir", str(state)), ("status", "--state-dir", str(state), "--json")):
        out = _privrec(*args)
        assert out.returncode == 0, out.stderr
        assert not any(pw in out.stdout + out.stderr for pw in secrets)
    for name, pid in ops.status(state, probe=False)["processes"].items():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert not any(pw.encode() in cmdline for pw in secrets), f"a password on {name}'s command line"
    assert (state / acl.ROLES_FILE).stat().st_mode & 0o777 == 0o600
    if not (stack.get("external") or {}).get("redis"):
        assert (state / "redis" / acl.ACL_FILE).stat().st_mode & 0o777 == 0o600


def _assert_web_refused_trusted_state(stack: dict[str, Any], namespaces: list[str], *, seed: bool = True) -> None:
    admin = redis.Redis.from_url(role_redis_url(stack, "admin"))
    web = redis.Redis.from_url(role_redis_url(stack, "web"))
    try:
        keys = [k.decode() for ns in namespaces for k in admin.scan_iter(f"{ns}:*")]
        trusted = [k for k in keys if k.split(":")[1] not in READABLE]
        kinds = {k.split(":")[1] for k in trusted}
        assert {"trusted", "config"} <= kinds, kinds  # the secret seed and the settings at least
        assert not seed or any(":trusted:" in k and k.endswith(":secret") for k in trusted)  # the noise seed
        for key in trusted:
            for command in (("TYPE", key), ("DUMP", key), ("EXISTS", key)):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    web.execute_command(*command)
        public = [k for k in keys if k.split(":")[1] in PUBLIC_KINDS]
        assert public
        for key in public:
            assert web.type(key) != b"none"
            with pytest.raises(redis.exceptions.NoPermissionError):
                web.delete(key)
        with pytest.raises(redis.exceptions.NoPermissionError):  # nor may it change what Redis does
            web.config_set("appendfsync", "always")
    finally:
        admin.close()
        web.close()


@pytest.fixture
def mode_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, dict[str, Any]]]:
    settings = Settings(namespace="lp", **WORLD, **request.param)
    state = tmp_path / "stack"
    with up_stack(settings, state, timeout=90, supervise=False, loglevel="WARNING"):
        stack = ops.read_stack(state)
        assert stack is not None
        yield state, stack


@pytest.mark.parametrize("mode_stack", [{}, {"mode": "local"}, {"mode": "federated", "privacy_unit": "event"}],
                         ids=["global", "local", "federated"], indirect=True)
def test_every_mode_runs_least_privilege_by_default(mode_stack: tuple[Path, dict[str, Any]]) -> None:
    state, stack = mode_stack
    settings = stack["settings"]
    creds = acl.load_credentials(state)
    assert creds is not None
    users = stack["redis_acl"]["users"]
    roles = {"web", "coordinator", *(f"site{i}" for i in range(settings["sites"]))} \
        if settings["mode"] == "federated" else {"web", "worker"}
    assert set(users) == roles
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(stack["redis"]).ping()  # no password, no access
    # serving works as the web user
    status, body = wait_for(lambda: (r := http("GET", f"{stack['http']}/recommend?user=1&k=3"))[0] == 200 and r, 60,
                            "/recommend 200")
    assert len(body["items"]) == 3
    status, budget = http("GET", f"{stack['http']}/budget")
    assert status == 200 and budget["redis_acl"]["enforced"] is True
    ns = stack["namespace"]
    namespaces = [ns] + ([site_namespace(ns, i) for i in range(settings["sites"])]
                         if settings["mode"] == "federated" else [])
    _assert_web_refused_trusted_state(stack, namespaces, seed=settings["mode"] != "local")  # local: on the devices
    # the trusted process's user can still make a release durable (WAITAOF, or appendfsync always for one write)
    trusted_role = "site0" if settings["mode"] == "federated" else "worker"
    trusted = redis.Redis.from_url(role_redis_url(stack, trusted_role))
    try:
        assert make_durable(trusted, TrustedKeys(namespaces[-1] if trusted_role == "site0" else ns).secret) is True
        assert trusted.config_get("appendfsync")["appendfsync"] == "everysec"  # restored after the one write
    finally:
        trusted.close()
    _assert_no_password_anywhere(state, stack, creds)


def test_external_redis_needs_the_users_or_no_acl(tmp_path: Path) -> None:
    state = tmp_path / "ext"
    with start_redis(tmp_path, name="redis-ext") as rds:
        settings = Settings(namespace="ext", redis_url=rds.url, **WORLD)
        with pytest.raises(OpsError, match="ACL SETUSER ext-web") as refused:
            ops.up(settings, state, timeout=90, supervise=False)
        assert not (state / "stack.json").exists()
        lines = [ln for ln in str(refused.value).splitlines() if ln.startswith("ACL SETUSER")]
        assert len(lines) == 2 and not any(pw in str(refused.value) for pw in acl.load_credentials(state).values())
        admin = redis.Redis.from_url(rds.url)
        for line in lines:  # the operator applies exactly what was printed
            admin.execute_command(*shlex.split(line))
        with up_stack(settings, state, timeout=90, supervise=False):
            stack = ops.read_stack(state)
            assert stack["redis_acl"]["users"] == {"web": "ext-web", "worker": "ext-worker"}
            assert http("GET", f"{stack['http']}/budget")[1]["redis_acl"]["enforced"] is True
            wait_for(lambda: http("GET", f"{stack['http']}/recommend?user=1&k=3")[0] == 200, 60, "/recommend 200")
            _assert_web_refused_trusted_state(stack, ["ext"])
            _assert_no_password_anywhere(state, stack, acl.load_credentials(state))
        # --no-acl: runs, and /budget says serving could read trusted state
        with up_stack(settings, state, timeout=90, supervise=False, no_acl=True):
            stack = ops.read_stack(state)
            assert stack["redis_acl"] is None
            acl_state = http("GET", f"{stack['http']}/budget")[1]["redis_acl"]
            assert acl_state["enforced"] is False and "NOT ENFORCED" in acl_state["note"]
        # --redis-admin-url: privrec up creates the users (here on a namespace without any)
        state2 = tmp_path / "ext2"
        with up_stack(settings.replace(namespace="ext2"), state2, timeout=90, supervise=False, redis_admin_url=rds.url):
            stack = ops.read_stack(state2)
            assert stack["redis_acl"]["users"] == {"web": "ext2-web", "worker": "ext2-worker"}
            assert http("GET", f"{stack['http']}/budget")[1]["redis_acl"]["enforced"] is True


def _ledger(admin: redis.Redis, ns: str, user: str) -> tuple[LedgerRecord, dict[bytes, bytes]]:
    raw = admin.hget(f"{ns}:ledger:{{{ns}:p0}}:participation", user)
    return LedgerRecord.loads(raw), admin.hgetall(f"{ns}:ledger:{{{ns}:p0}}:summary")


def test_a_user_past_the_lifetime_budget_is_no_longer_learned_from(tmp_path: Path) -> None:
    """One event per release tick from one user, with ``user_budget`` below what a capped user spends in one epoch:
    the fold takes exactly the ticks the budget allows, then counts every later event as "not learned (budget)"."""
    budget_eps, sent = 1.0, 10
    settings = Settings(namespace="lb", user_budget=budget_eps, user_cap=8, **WORLD)  # the budget, not the cap, stops
    state = tmp_path / "stack"
    with up_stack(settings, state, timeout=90, supervise=False):
        stack = ops.read_stack(state)
        admin = redis.Redis.from_url(role_redis_url(stack, "admin"))
        prod = KafkaProducer(bootstrap_servers=stack["kafka"], linger_ms=0)
        for i in range(sent):
            ev = {"event_id": f"b{i}", "user": "2", "arm": str(i % 30), "reward": 1.0, "ts": 1.7e12 + i}
            prod.send("interactions", key=b"2", value=json.dumps(ev).encode())
            prod.flush()

            def handled(n: int = i + 1) -> bool:  # folded or refused: one event per tick
                _, summary = _ledger(admin, "lb", "2")
                return int(summary.get(b"folded", 0)) + int(summary.get(b"over_budget", 0)) == n

            wait_for(handled, 30, f"event {i} folded or refused")
        prod.close()
        rec, summary = _ledger(admin, "lb", "2")
        meta = admin.hgetall("lb:model:{lb:model}:meta")
        statement = json.loads(meta[b"privacy"])
        mu_cap, ratios, delta = statement["mu_at_cap"], statement["ratios"], statement["delta"]
        mu_budget = gdp_mu(budget_eps, delta)
        allowed = max(k for k in range(len(ratios) + 1) if k == 0 or mu_cap * math.sqrt(ratios[k - 1]) <= mu_budget)
        assert 1 <= allowed < min(sent, len(ratios))  # the budget, not the cap, stops this user
        assert rec.k == allowed and rec.past == 0.0
        assert mu_cap * math.sqrt(ratios[allowed]) > mu_budget  # one more tick would exceed the budget
        assert int(summary[b"over_budget"]) == sent - allowed  # every event sent is learned from or counted
        assert exact_released_count(admin, "lb") == allowed
        operator = read_tokens(state).operator  # privrec up's operator token (<state>/tokens.json)
        wait_for(lambda: http("GET", f"{stack['http']}/budget?user=2", token=operator)[0] == 200
                 and http("GET", f"{stack['http']}/budget?user=2", token=operator)[1]["ledger"]["budget_events"] == sent - allowed,
                 30, "/budget to see the last release")
        _, body = http("GET", f"{stack['http']}/budget?user=2", token=operator)
        u = body["user"]
        assert u["at_budget"] is True and u["user_budget"] == budget_eps
        assert u["epsilon"] == pytest.approx(gdp_epsilon(mu_cap * math.sqrt(ratios[allowed - 1]), delta), rel=1e-9)
        assert u["epsilon"] <= budget_eps
        led = body["ledger"]
        assert led["users_at_budget"] == 1 and led["budget_events"] == sent - allowed and led["user_budget"] == 1.0
        text = _privrec("budget", "--state-dir", str(state), "--user", "2")
        assert text.returncode == 0, text.stderr
        assert re.search(r"users at the lifetime budget +1 ", text.stdout) and "AT THE LIFETIME BUDGET" in text.stdout
        assert re.search(rf"events not learned \(budget\) +{sent - allowed}\n", text.stdout)
        metrics = http("GET", f"{stack['http']}/metrics", token=operator)  # add/remove: answered to the operator only
        assert "privrec_users_at_budget 1.0" in metrics.expect(200)
        worker = json.loads(admin.hget("lb:ops:{lb:ops}:workers", "worker-0"))["metrics"]
        deadline = time.monotonic() + 10
        while True:  # the worker's gauges follow its next release tick
            text_metrics = http("GET", worker).expect(200)
            if f"privrec_budget_events {float(sent - allowed)}" in text_metrics or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert "privrec_users_at_budget 1.0" in text_metrics
        assert f"privrec_budget_events {float(sent - allowed)}" in text_metrics
        admin.close()



def test_local_mode_refuses_a_users_reports_past_the_lifetime_budget(tmp_path: Path) -> None:
    """Without a device that enforces it, the server accepts the reports the budget allows and refuses the rest
    (403, counted); the worker aggregates exactly the accepted ones."""
    from models.local import LocalClient
    from producers.devices import config_from_public

    mu = gdp_mu(2.0, 1e-5)
    budget_eps = gdp_epsilon(2.5 * mu, 1e-5)  # a tree device's k reports cost k * mu: 2 fit, the 3rd does not
    state = tmp_path / "stack"
    # event level: the budget above is counted in event-level reports (user level, local mode's default since
    # issue 21, has a device ledger of its own: tests/component/test_local_userlevel.py)
    with up_stack(Settings(mode="local", namespace="lr", user_budget=budget_eps, privacy_unit="event", **WORLD), state,
           timeout=90,
           supervise=False, loglevel="WARNING"):
        stack = ops.read_stack(state)
        base = stack["http"]
        # a device that does not enforce the budget itself (the server must): the public calibration, no budget
        cfg = dataclasses.replace(config_from_public(http("GET", f"{base}/local/config")[1]), user_budget=math.inf)
        device = LocalClient("3", cfg)
        answers = []
        for _ in range(5):
            status, rec = wait_for(lambda: (r := http("GET", f"{base}/recommend?user=3&k=3"))[0] == 200 and r, 30,
                                   "/recommend")
            item = rec["items"][0]
            rep = device.report(rec_id=rec["rec_id"], x=np.asarray(item["x"]), reward=1.0)
            status, body = http("POST", f"{base}/report", rep.to_dict())
            answers.append(status)
            if status == 202:
                device.acknowledge(rep.version)
        assert answers == [202, 202, 403, 403, 403]
        assert "lifetime budget" in body["error"]["message"] and body["error"]["parameter"] == "user"
        admin = redis.Redis.from_url(role_redis_url(stack, "admin"))
        wait_for(lambda: int(admin.hget("lr:released:{lr:rel}:stats", "count") or 0) == 2, 30,
                 "the two accepted reports released")
        time.sleep(1.0)  # a refused report would have been released by now: it was never sent
        assert int(admin.hget("lr:released:{lr:rel}:stats", "count") or 0) == 2
        local = http("GET", f"{base}/budget?user=3", token=read_tokens(state).for_user("3"))[1]["local"]  # user 3's own token
        assert local["user_budget"]["reports_allowed"] == 2
        assert local["user"]["at_budget"] is True and local["user"]["not_learned_budget"] == 3
        admin.close()
