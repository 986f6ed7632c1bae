"""Federated mode end to end: ``privrec up --mode federated`` against the real broker and redis-server.

* star, noise on: every message on ``federated-updates`` differs from the site's exact statistics by the
  site's released noise (recomputed here from the site's secret seed); Redis itself refuses the
  coordinator and the other sites a site's exact statistics; kill -9 of a site: the others keep serving,
  the restarted site resumes — nothing counted twice, no noise redrawn;
* star, noise off: the coordinator's aggregate equals the global mode's exact statistics of the same events;
* ring, noise off: the sites' consensus views converge to the network average at the spectral rate of P.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer

from models.ground.consensus import mixing_matrix, second_eigenvalue_modulus, topology_adjacency
from models.ground.graphs import sensitivities
from models.mechanisms import make_mechanism
from models.mechanisms.participation import B_CLIP, replace_sensitivity
from models.streaming import Releaser, UnitStats
from models.streaming.federated import assign_sites
from pipeline.config import acl
from pipeline import services
from pipeline.data.catalog import SyntheticCatalog
from pipeline.modes.federated.federation import decode_message, site_namespace, site_topic
from pipeline.config.keys import PublicKeys
from pipeline.data.records import parse_interaction
from pipeline.config.settings import Settings
from pipeline.state.trusted import TrustedKeys
from privrec import ops
from privrec.ops.stackfile import child_env, read_tokens

from stacks import wait_for

WORLD = {"PRIVREC_D": "4", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "30", "PRIVREC_TICK_SECONDS": "0.25",
         "PRIVREC_LOGLEVEL": "WARNING", "PRIVREC_PARTITIONS": "1", "PRIVREC_PRIVACY_UNIT": "event"}
NS = "fed"
#: Replace neighbours: two clipped contributions differ by 2 x b_clip (the sites' calibration).
REPLACE = replace_sensitivity(B_CLIP, signed=True)


class FedStack:
    def __init__(self, state: Path, settings: Settings) -> None:
        self.state, self.settings = state, settings
        self.status = ops.up(settings, state, timeout=90)
        self.stack = ops.read_stack(state)
        assert self.stack is not None
        self.creds = acl.load_credentials(state)
        assert self.creds is not None
        self.catalog = SyntheticCatalog(n_users=settings.n_users, d=settings.d, n_arms=settings.n_arms,
                                        seed=settings.world_seed)
        self.site_of_unit = assign_sites(self.catalog.n_units, settings.sites)
        self.produced: dict[int, list[bytes]] = {i: [] for i in range(settings.sites)}

    def client(self, role: str = "default") -> redis.Redis:
        return redis.Redis.from_url(acl.role_url(self.stack["redis"], role, self.creds[role]))

    def produce(self, n: int, seed: int) -> None:
        """``n`` feedback events on the sites' topics, each answering a one-item list recorded as ``/recommend``
        records it in the coordinator's namespace (the sites' ingest matches feedback against it)."""
        rng = random.Random(seed)
        prod = KafkaProducer(bootstrap_servers=self.stack["kafka"], linger_ms=5)
        recs = self.client()
        keys = PublicKeys(self.settings.namespace)
        for i in range(n):
            user = str(rng.randrange(self.catalog.n_units))
            arm, rec_id = str(rng.randrange(self.settings.n_arms)), f"fed-{seed}-{i}"
            recs.set(keys.recommendation(rec_id), json.dumps({"rec_id": rec_id, "user": user, "items": [arm]}),
                     ex=86400)
            ev = {"event_id": f"f{seed}-{i}", "user": user, "arm": arm, "rec_id": rec_id, "shown": [arm],
                  "reward": float(rng.randrange(2)) if i % 3 else rng.random(), "ts": 1.7e12 + i}
            site = int(self.site_of_unit[self.catalog.unit_of(user)])
            value = json.dumps(ev).encode()
            prod.send(site_topic(site), key=user.encode(), value=value)
            self.produced[site].append(value)
        prod.flush()
        prod.close()
        recs.close()

    def site_stats(self, site: int, n: int | None = None) -> UnitStats:
        """Exact statistics of the first ``n`` events of a site's topic (one partition: offset order)."""
        s = UnitStats.zeros(n_units=self.catalog.n_units, d=self.catalog.d)
        for value in self.produced[site][:n]:
            u, x, r, _ = parse_interaction(value, self.catalog)
            s.add(np.array([u]), x[None, :], np.array([r]))
        return s

    def messages(self) -> list[tuple[bytes, Any]]:
        """Every message on ``federated-updates`` up to its current end (the sites keep writing)."""
        from kafka import TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.stack["kafka"], auto_offset_reset="earliest",
                                 enable_auto_commit=False, max_partition_fetch_bytes=16 * 1024 * 1024)
        tp = TopicPartition("federated-updates", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        out: list[tuple[bytes, Any]] = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for m in records:
                    if m.offset < end:
                        out.append((m.value, decode_message(m.value, n_units=self.catalog.n_units,
                                                            d=self.catalog.d, sites=self.settings.sites)))
        consumer.close()
        return out

    def site_noise(self, site: int, version: int) -> np.ndarray:
        """The noise of a site's release ``version``, recomputed from its secret seed and its calibration."""
        admin = self.client()
        seed = int(admin.get(TrustedKeys(site_namespace(NS, site)).secret))
        V = np.eye(self.catalog.n_units)
        own = self.site_of_unit == site
        mech = make_mechanism(self.settings.mechanism, dim=self.catalog.n_units * self.catalog.d,
                              # replace neighbours: two clipped contributions differ by 2 x b_clip
                              sensitivity=REPLACE * float(sensitivities(V)[own].max()), epsilon=self.settings.epsilon,
                              delta=self.settings.delta, horizon=self.settings.tree_ticks, seed=seed,
                              sensitivity_l1=REPLACE * float(np.abs(V[:, own]).sum(axis=0).max()
                                                             * np.sqrt(self.catalog.d)),
                              mixing=V * own[None, :], block_dim=self.catalog.d)
        state = mech.init_state()
        for _ in range(version):
            _, state, _ = mech.step(state, np.zeros(mech.dim))
        return mech.noise(state)

    def down(self) -> None:
        ops.down(self.state)


def _settings(**kw: Any) -> Settings:
    return Settings.from_mapping({k: str(v) for k, v in kw.items()}, environ={**WORLD, "PRIVREC_NAMESPACE": NS})


@pytest.fixture(scope="module")
def star(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedStack]:
    s = FedStack(tmp_path_factory.mktemp("fed-star"), _settings(mode="federated", sites=3, topology="star",
                                                                 epsilon=2.0))
    try:
        yield s
    finally:
        s.down()


def test_star_messages_differ_from_exact_by_each_sites_released_noise(star: FedStack) -> None:
    star.produce(60, seed=1)
    total = sum(len(v) for v in star.produced.values())
    pub = PublicKeys(NS)
    admin = star.client()
    wait_for(lambda: int(admin.hget(pub.released, "count") or 0) == total, 60, "the aggregate to count every event")
    msgs = [m for _, m in star.messages() if m.kind == "release"]
    assert {m.site for m in msgs} == {0, 1, 2}
    rel = Releaser(structure="linucb", V=np.eye(star.catalog.n_units), d=star.catalog.d, mechanism=None)
    for m in msgs:
        n = int(round(float(np.sum(m.release.count))))
        exact = rel.release(star.site_stats(m.site, n), None)[0]
        np.testing.assert_array_equal(np.asarray(m.release.count), exact.count)
        np.testing.assert_allclose(m.release.gram, exact.gram, atol=1e-12)  # public, exact
        noise = m.release.b_tilde - exact.b_tilde
        assert np.abs(noise).max() > 0  # noise on
        np.testing.assert_allclose(noise, star.site_noise(m.site, m.version), atol=1e-9)
        # a site's noise sits on its own units only
        blocks = noise.reshape(star.catalog.n_units, star.catalog.d)
        assert np.all(blocks[star.site_of_unit != m.site] == 0)


def test_budget_and_recommend_name_the_mode_the_sites_and_their_guarantees(star: FedStack) -> None:
    import urllib.request

    def get(path: str, token: str | None = None) -> Any:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        req = urllib.request.Request(f"{star.stack['http']}{path}", headers=headers)
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    b = get("/budget?user=3", read_tokens(star.state).for_user("3"))  # user 3's own token
    assert b["privacy"]["mode"] == "federated" and b["privacy"]["topology"] == "star"
    assert b["privacy"]["private"] and b["privacy"]["epsilon"] == pytest.approx(2.0, rel=1e-6)
    assert "one interaction of one of its users" in b["privacy"]["per_site"]
    assert [s["site"] for s in b["federated"]["sites"]] == [0, 1, 2]
    assert all(s["releases"] >= 1 for s in b["federated"]["sites"])
    assert b["user"]["user"] == "3"
    site = int(star.site_of_unit[star.catalog.unit_of("3")])
    rec = get("/recommend?user=3&k=2")
    assert rec["site"] == site


def test_redis_refuses_a_sites_exact_statistics_to_the_coordinator_other_sites_and_web(star: FedStack) -> None:
    site0 = site_namespace(NS, 0)
    trusted = TrustedKeys(site0)
    if not star.produced[0]:  # run alone (the module's first test produces the events otherwise)
        star.produce(60, seed=1)
    assert star.produced[0]
    # the site itself reads its own statistics
    wait_for(lambda: star.client("site0").hgetall(trusted.stats(0)), 60, "site 0's exact statistics")
    for role in ("coordinator", "site1", "site2", "web"):
        client = star.client(role)
        for key in (trusted.stats(0), trusted.secret, trusted.noise_state):
            with pytest.raises(redis.exceptions.NoPermissionError, match="no permissions"):
                client.dump(key)
    with pytest.raises(redis.exceptions.NoPermissionError):  # nor write them
        star.client("coordinator").hset(trusted.stats(0), "x", "1")
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(star.stack["redis"]).ping()  # no credentials, no access
    # the coordinator reads and writes its own public keys; the web only reads the model
    assert star.client("coordinator").hget(PublicKeys(NS).released, "version") is not None
    with pytest.raises(redis.exceptions.NoPermissionError):
        star.client("web").hset(PublicKeys(NS).model_meta, "version", "0")


def test_kill9_of_a_site_others_keep_serving_and_the_restart_redraws_nothing(star: FedStack) -> None:
    handles = services.read_handles(star.state)
    victim = handles["site-1"]
    os.kill(victim.pid, 9)
    wait_for(lambda: not services.is_running(victim), 10, "site-1 to exit")
    before = {m.site: m.version for _, m in star.messages() if m.kind == "release"}
    star.produce(40, seed=2)  # site 1's events wait in its topic
    pub = PublicKeys(NS)
    admin = star.client()
    others = sum(len(star.produced[s]) for s in (0, 2))
    # the other sites go on: their new events reach the served model while site 1 is down
    wait_for(lambda: sum(json.loads(admin.hget(pub.released, "sites") or "{}").get(str(s), 0) for s in (0, 2))
             > before[0] + before[2], 30, "sites 0 and 2 to keep releasing")
    import urllib.request
    with urllib.request.urlopen(f"{star.stack['http']}/recommend?user=0&k=2", timeout=5) as resp:
        assert resp.status == 200
    # restart site 1 exactly as `privrec up` started it
    s1 = star.settings.replace(kafka=star.stack["kafka"],
                               redis_url=acl.role_url(star.stack["redis"], "site1", star.creds["site1"]), site=1)
    env = {**child_env(s1, star.state, loglevel="WARNING"), "PRIVREC_WORKER_ID": "site-1"}
    services.start_process("site-1", [sys.executable, "-m", "pipeline.apps.worker"], star.state, env=env, timeout=60)
    total = sum(len(v) for v in star.produced.values())
    wait_for(lambda: int(admin.hget(pub.released, "count") or 0) == total, 60,
             "the aggregate to count every event once, site 1's included")
    assert others > 0
    msgs = star.messages()
    by_version: dict[tuple[int, int], bytes] = {}
    rel = Releaser(structure="linucb", V=np.eye(star.catalog.n_units), d=star.catalog.d, mechanism=None)
    for raw, m in msgs:
        if m.kind != "release":
            continue
        key = (m.site, m.version)
        if key in by_version:  # a re-sent release is the same bytes: the same noise, never a new draw
            assert by_version[key] == raw
        by_version[key] = raw
        if m.site == 1:
            n = int(round(float(np.sum(m.release.count))))
            noise = m.release.b_tilde - rel.release(star.site_stats(1, n), None)[0].b_tilde
            np.testing.assert_allclose(noise, star.site_noise(1, m.version), atol=1e-9)
    versions = sorted(v for s, v in by_version if s == 1)
    assert versions == list(range(1, versions[-1] + 1))  # site 1's releases continue its sequence, no gap
    assert versions[-1] > before[1]


def test_noise_off_star_aggregate_equals_the_global_exact_statistics(tmp_path: Path) -> None:
    stack = FedStack(tmp_path, _settings(mode="federated", sites=3, topology="star", epsilon="inf"))
    try:
        stack.produce(50, seed=3)
        total = sum(len(v) for v in stack.produced.values())
        admin = stack.client()
        pub = PublicKeys(NS)
        wait_for(lambda: int(admin.hget(pub.released, "count") or 0) == total, 60, "the aggregate")
        from models.streaming import ReleasedStats

        agg = ReleasedStats.from_mapping(admin.hgetall(pub.released))
        # the global mode's exact statistics of the same events, in any order (sums)
        whole = UnitStats.merged([stack.site_stats(s) for s in range(3)])
        exact = Releaser(structure="linucb", V=np.eye(stack.catalog.n_units), d=stack.catalog.d,
                         mechanism=None).release(whole, None)[0]
        assert agg.count.tolist() == exact.count.tolist()
        np.testing.assert_allclose(agg.gram, exact.gram, atol=1e-12)
        np.testing.assert_allclose(agg.b_tilde, exact.b_tilde, atol=1e-12)
    finally:
        stack.down()


def test_ring_views_converge_to_the_average_at_the_spectral_rate(tmp_path: Path) -> None:
    m = 4
    stack = FedStack(tmp_path, _settings(mode="federated", sites=m, topology="ring", epsilon="inf",
                                         n_users=8, consensus_kappa=0.5))
    try:
        stack.produce(40, seed=4)
        admin = stack.client()
        counts = {s: len(stack.produced[s]) for s in range(m)}
        wait_for(lambda: all(int(admin.hget(PublicKeys(site_namespace(NS, s)).released, "count") or 0) == counts[s]
                             for s in range(m)), 60, "every site to release all of its events")
        time.sleep(0.25 * 16)  # about 16 rounds of mixing with nothing new
        states: dict[tuple[int, int], np.ndarray] = {}
        for _, msg in stack.messages():
            if msg.kind == "consensus":
                states[(msg.site, msg.round)] = msg.state.b_tilde
        rounds = sorted({r for (_, r) in states if all((s, r) in states for s in range(m))})
        total = sum(stack.site_stats(s).b.reshape(-1) for s in range(m))
        P = mixing_matrix(topology_adjacency("ring", m), kappa=0.5)
        lam = second_eigenvalue_modulus(P)
        # rounds after every site's last new data: s_i(r) = y_i(r), and y(r + 1) = P y(r) exactly
        quiet = [r for r in rounds if np.allclose(np.mean([states[(s, r)] for s in range(m)], axis=0), total / m,
                                                  atol=1e-12)]
        assert len(quiet) >= 8, f"too few quiet rounds: {quiet}"
        r0 = quiet[0]
        Y0 = np.stack([states[(s, r0)] for s in range(m)])
        dist0 = np.linalg.norm(Y0 - Y0.mean(axis=0))
        for r in quiet[1:]:
            Y = np.stack([states[(s, r)] for s in range(m)])
            np.testing.assert_allclose(Y.mean(axis=0), total / m, atol=1e-12)  # the average is preserved
            assert np.linalg.norm(Y - Y.mean(axis=0)) <= lam ** (r - r0) * dist0 * (1 + 1e-9) + 1e-12
    finally:
        stack.down()


# ---------------------------------------------------------------------------------------------- user level (default)

#: The user whose interactions the user-level tests send: unit 2, site 0 of 2 (units u mod 2).
ONE_USER = "2"


def _user_level_stack(state: Path, **kw: Any) -> FedStack:
    """A star of two sites with the default privacy unit (user level): ``WORLD`` without ``PRIVREC_PRIVACY_UNIT``."""
    world = {k: v for k, v in WORLD.items() if k != "PRIVREC_PRIVACY_UNIT"}
    settings = Settings.from_mapping({k: str(v) for k, v in kw.items()}, environ={**world, "PRIVREC_NAMESPACE": NS})
    assert settings.unit_in_force == "user"
    return FedStack(state, settings)


def _send_one_user(stack: FedStack, n: int, tag: str) -> None:
    """``n`` interactions of :data:`ONE_USER` on its site's topic (reward 1 on varied arms: an unclipped sum)."""
    site = int(stack.site_of_unit[stack.catalog.unit_of(ONE_USER)])
    prod = KafkaProducer(bootstrap_servers=stack.stack["kafka"], linger_ms=5)
    recs, keys = stack.client(), PublicKeys(stack.settings.namespace)
    for i in range(n):
        arm, rec_id = str(i % stack.settings.n_arms), f"{tag}-rec-{i}"  # a one-item list, recorded as served
        recs.set(keys.recommendation(rec_id), json.dumps({"rec_id": rec_id, "user": ONE_USER, "items": [arm]}),
                 ex=86400)
        ev = {"event_id": f"{tag}-{i}", "user": ONE_USER, "arm": arm, "rec_id": rec_id, "shown": [arm],
              "reward": 1.0, "ts": 1.7e12 + i}
        prod.send(site_topic(site), key=ONE_USER.encode(), value=json.dumps(ev).encode())
    prod.flush()
    prod.close()
    recs.close()


def _spent(stack: FedStack) -> dict[str, Any]:
    """``/budget?user=``'s user-level entry, computed by the function the web's view calls
    (:func:`pipeline.serve.budget_view.user_budget`) over the public keys of the user's site, as the web role reads
    them, with the statement the web serves (the coordinator's) and the site's own epoch."""
    import asyncio

    import redis.asyncio as aredis

    from pipeline.serve.budget_view import user_budget

    statement = json.loads(stack.client().hget(PublicKeys(NS).model_meta, "privacy"))
    keys = PublicKeys(site_namespace(NS, 0))

    async def read() -> dict[str, Any]:
        r = aredis.Redis.from_url(acl.role_url(stack.stack["redis"], "web", stack.creds["web"]))
        try:
            released = int(await r.hget(keys.released, "version") or 1)
            return await user_budget(r, keys, stack.settings.partitions, ONE_USER, statement,
                                     (released - 1) // stack.settings.tree_ticks)
        finally:
            await r.aclose()

    return {**asyncio.run(read()), "statement": statement}


def _site_user_exact(stack: FedStack) -> tuple[bytes | None, int]:
    """The site's exact statistics of the user's unit (``b`` bytes and count; trusted: read as the admin)."""
    unit = stack.catalog.unit_of(ONE_USER)
    raw = stack.client().hmget(TrustedKeys(site_namespace(NS, 0)).stats(0), [f"b:{unit}", f"n:{unit}"])
    return raw[0], int(raw[1] or 0)


def _rounds(stack: FedStack, rounds: int, per_round: int) -> list[tuple[int, dict[str, Any], tuple[bytes | None, int]]]:
    """Send ``rounds`` rounds of ``per_round`` interactions of the user, each folded (offset counted, nothing
    pending) before the next: one participation per round at most. Per round: the ledger's ``k``, the spent budget
    and the site's exact statistics of the user's unit."""
    admin = stack.client()
    site_ns = site_namespace(NS, 0)
    offset, pending = TrustedKeys(site_ns).offset(0), f"{site_ns}:trusted:{{{site_ns}:p0}}:pending"
    out = []
    sent = int(admin.get(offset) or 0)
    for r in range(rounds):
        _send_one_user(stack, per_round, f"r{r}")
        sent += per_round
        wait_for(lambda: int(admin.get(offset) or 0) >= sent and admin.hlen(pending) == 0, 30,  # noqa: B023
                 f"round {r} ingested and folded")
        wait_for(lambda: admin.hget(PublicKeys(NS).model_meta, "privacy"), 30, "the coordinator's model")
        spent = _spent(stack)
        out.append((spent["ticks_this_epoch"], spent, _site_user_exact(stack)))
    return out


def test_user_level_by_default_one_users_spent_epsilon_stays_within_the_epsilon_at_cap(tmp_path: Path) -> None:
    """Many interactions of one user at one site over many release ticks: their site's ledger counts at most
    ``user_cap`` ticks this epoch, the spent epsilon grows with them and never passes the epsilon at the cap (the
    statement's), and once at the cap the user's interactions no longer change the site's exact statistics."""
    stack = _user_level_stack(tmp_path, mode="federated", sites=2, topology="star", epsilon=2.0, user_cap=3)
    try:
        rows = _rounds(stack, rounds=6, per_round=4)
        statement = rows[-1][1]["statement"]
        assert statement["unit"] == "user" and statement["cap"] == 3 and "user level" in statement["per_site"]
        eps_cap = float(statement["epsilon"])
        assert eps_cap == pytest.approx(2.0, rel=1e-6)
        ks = [k for k, _, _ in rows]
        assert ks == sorted(ks) and ks[0] >= 1 and ks[-1] == 3  # one participation per round at most, then the cap
        spent = [float(s["epsilon"]) for _, s, _ in rows]
        assert spent == sorted(spent) and spent[0] > 0
        assert all(e <= eps_cap * (1 + 1e-9) for e in spent)  # 24 interactions, never more than the cap's epsilon
        assert spent[-1] == pytest.approx(eps_cap, rel=1e-9)  # at the cap: exactly the epsilon at cap
        at_cap = ks.index(3)
        assert at_cap <= 2  # each round below the cap is folded: three rounds at most, three more past the cap
        assert rows[-1][1]["at_cap"] is True and rows[-1][1]["remaining_ticks"] == 0
        assert all(exact == rows[at_cap][2] for _, _, exact in rows[at_cap:])  # no longer learned from
        b, n = rows[at_cap][2]
        assert b is not None and n > 0
        # per-tick clipping: three folded ticks of 4 interactions of norm <= 1 add at most norm 3 (unclipped up to 12)
        assert np.linalg.norm(np.frombuffer(b, dtype="<f8")) <= 3.0 + 1e-9
        summary = stack.client().hgetall(PublicKeys(site_namespace(NS, 0)).ledger_summary(0))
        assert int(summary[b"dropped"]) == 24 - n  # every interaction past the cap, counted as dropped
    finally:
        stack.down()


def test_user_level_by_default_a_user_past_the_lifetime_budget_is_no_longer_learned_from(tmp_path: Path) -> None:
    """A lifetime budget that allows two of the cap's three ticks: after two, the site's fold stops learning from
    the user (their interactions no longer change the site's exact statistics, counted ``over_budget``), the spent
    epsilon stays within the budget and ``/budget``'s entry says the budget is spent."""
    from models.accounting import gdp_epsilon, gdp_mu

    from pipeline.modes.federated.sites import site_guarantee

    probe = Settings(mode="federated", sites=2, epsilon=2.0, user_cap=3, d=4, n_users=6, n_arms=30)
    st = site_guarantee(probe, SyntheticCatalog(n_users=6, d=4, n_arms=30, seed=0))
    mu_cap, ratios = float(st["mu_at_cap"]), st["ratios"]
    budget = gdp_epsilon(mu_cap * math.sqrt((ratios[1] + ratios[2]) / 2), probe.delta)  # two ticks, not three
    stack = _user_level_stack(tmp_path, mode="federated", sites=2, topology="star", epsilon=2.0, user_cap=3,
                              user_budget=budget)
    try:
        rows = _rounds(stack, rounds=5, per_round=3)
        statement = rows[-1][1]["statement"]
        assert statement["user_budget"]["epsilon"] == pytest.approx(budget)
        assert statement["ratios"] == pytest.approx(ratios, rel=1e-12)  # the public calibration the probe computed
        ks = [k for k, _, _ in rows]
        assert ks[-1] == 2 and ks == sorted(ks)  # the budget stops the user before the cap
        assert all(float(s["epsilon"]) <= budget * (1 + 1e-9) for _, s, _ in rows)
        assert float(rows[-1][1]["epsilon"]) == pytest.approx(gdp_epsilon(mu_cap * math.sqrt(ratios[1]), probe.delta),
                                                              rel=1e-9)
        assert rows[-1][1]["at_budget"] is True and rows[-1][1]["at_cap"] is False
        spent_at = ks.index(2)
        assert spent_at <= 1  # three more rounds past the budget
        assert all(exact == rows[spent_at][2] for _, _, exact in rows[spent_at:])  # no longer learned from
        summary = stack.client().hgetall(PublicKeys(site_namespace(NS, 0)).ledger_summary(0))
        assert int(summary[b"over_budget"]) == 15 - rows[spent_at][2][1] > 0
        assert gdp_mu(budget, probe.delta) < mu_cap  # (the budget binds below what one epoch at the cap spends)
    finally:
        stack.down()
