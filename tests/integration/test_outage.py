"""Outages the user never sees (issue 25): a replay through the HTTP API while the broker, then redis, is killed.

One stack from :func:`privrec.ops.up` (real Tansu broker, redis-server, a faust worker, the web server and the
supervisor) replays 3,000 events — ``GET /recommend`` then ``POST /feedback`` on the list — at 150 events a
second through the HTTP API. A third of the way in, the broker (then, in the second test, redis-server) is
killed with SIGKILL, and nobody runs ``privrec up``: the supervisor repairs the stack. Every feedback must be
answered ``202`` (or ``503`` with ``Retry-After``, and accepted when the client retries after it), and once
the outbox has drained, the events released must equal the feedback acknowledged exactly: none lost, none
counted twice (it stays equal for several more release ticks).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from pipeline.config.keys import PublicKeys
from pipeline.serve.outbox import OutboxKeys
from pipeline.config.settings import Settings
from privrec import ops

from stacks import admin_url, alive, http, released_events, up_stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

POLICY = {"backoff_s": 0.2, "poll_s": 0.1}
NS = "outage"
USERS = 30
EVENTS = 3000
RATE = 150.0  # events a second: 20 s of replay
KILL_AT = 1000  # acknowledged feedback before the kill


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("outage") / "stack"
    # event level: a release covers every event counted (at user level a capped user's extra events are counted in
    # the ledger but not learned from); the ledger's per-user counts are checked too
    settings = Settings(d=5, n_users=USERS, n_arms=40, tick_seconds=0.3, namespace=NS, privacy_unit="event")
    with up_stack(settings, state, loglevel="WARNING", timeout=60, supervise=POLICY, say=lambda _line: None) as info:
        assert info["running"] and info["supervisor"]["running"], info
        yield state


@dataclass
class Replay:
    """What the client saw."""

    acknowledged: int = 0          # feedback answered 202 (or 409: recorded by an attempt whose answer was lost)
    already: int = 0               # of which 409
    per_user: Counter[str] = field(default_factory=Counter)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    feedback_s: list[tuple[float, float, int]] = field(default_factory=list)  # (start, seconds, status)
    unavailable_s: list[float] = field(default_factory=list)  # how long each 503 took to come back


async def _call(session: aiohttp.ClientSession, method: str, url: str, out: Replay, what: str,
                body: dict[str, Any] | None = None, *, deadline: float) -> tuple[int, dict[str, Any]]:
    """One request, retried after 503 as ``Retry-After`` says; any other failure is an error of the replay."""
    while True:
        t0 = time.monotonic()
        try:
            async with session.request(method, url, json=body) as resp:
                payload = await resp.json(content_type=None)
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            out.errors.append(f"{what}: {type(exc).__name__}: {exc}")
            return 0, {}
        took = time.monotonic() - t0
        out.statuses[(what, status)] += 1
        if what == "feedback":
            out.feedback_s.append((t0, took, status))
        if status != 503:
            return status, payload
        out.unavailable_s.append(took)
        if retry_after is None:
            out.errors.append(f"{what}: 503 without Retry-After: {payload}")
            return status, payload
        if time.monotonic() > deadline:
            out.errors.append(f"{what}: still 503 at the deadline")
            return status, payload
        await asyncio.sleep(float(retry_after))


async def _replay(web_url: str, kill: int, pid: int) -> tuple[Replay, float]:
    """Replay :data:`EVENTS` events at :data:`RATE`; SIGKILL ``pid`` once ``kill`` feedbacks are acknowledged."""
    out = Replay()
    rng = random.Random(25)
    plan = [(str(rng.randrange(USERS)), rng.random() < 0.3) for _ in range(EVENTS)]
    killed_at = 0.0
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=32)) as session:
        t0 = time.monotonic()
        deadline = t0 + EVENTS / RATE + 90

        async def one(i: int) -> None:
            nonlocal killed_at
            await asyncio.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
            user, liked = plan[i]
            status, rec = await _call(session, "GET", f"{web_url}/recommend?user={user}&k=5", out, "recommend",
                                      deadline=deadline)
            if status != 200:
                out.errors.append(f"recommend {i}: {status} {rec}")
                return
            body = {"rec_id": rec["rec_id"], "item": rec["items"][0]["item"], "reward": 1.0 if liked else 0.0}
            status, answer = await _call(session, "POST", f"{web_url}/feedback", out, "feedback", body,
                                         deadline=deadline)
            if status in (202, 409):
                out.acknowledged += 1
                out.already += status == 409
                out.per_user[user] += 1
                if out.acknowledged == kill and not killed_at:
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.monotonic()
            else:
                out.errors.append(f"feedback {i}: {status} {answer}")

        await asyncio.gather(*(one(i) for i in range(EVENTS)))
    return out, killed_at


def _outbox_len(url: str, ns: str = NS) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.xlen(OutboxKeys(ns).stream))
    finally:
        client.close()


def _ledger(url: str, ns: str = NS) -> Counter[str]:
    """Interactions counted per user (the public ledger, written atomically with each ingest commit)."""
    client = redis.Redis.from_url(url)
    try:
        out: Counter[str] = Counter()
        for p in range(Settings().partitions):
            for user, n in client.hgetall(PublicKeys(ns).ledger_users(p)).items():
                out[user.decode()] += int(n)
        return out
    finally:
        client.close()


def _metric(base: str, name: str, state_dir: Path) -> float:
    """A gauge of the web's ``/metrics``, asked with the stack's operator token (the add/remove relation answers
    the metrics to it only)."""
    from privrec.ops.stackfile import read_tokens

    tokens = read_tokens(state_dir)
    assert tokens is not None and tokens.operator, f"no operator token in {state_dir}"
    for line in http("GET", f"{base}/metrics", token=tokens.operator, timeout=5).expect(200).splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _diagnosis(stack: Path, url: str, counted: Counter[str], per_user: Counter[str]) -> str:
    """What a failed drain leaves behind: per partition the stored offset and broker, where the retired logs were
    counted to, the dead letters and the users short of their acknowledged feedback; the logs' outbox lines."""
    from pipeline.config.keys import partition_of
    from pipeline.state.trusted import TrustedKeys

    client = redis.Redis.from_url(url)
    lines: list[str] = []
    try:
        keys, public = TrustedKeys(NS), PublicKeys(NS)
        partitions = Settings().partitions
        short = per_user - (_ledger(url) - counted)
        for p in range(partitions):
            lines.append(f"p{p}: offset {client.get(keys.offset(p))} broker {client.get(keys.broker(p))} "
                         f"retired {client.hgetall(public.retired_logs(p))} "
                         f"dead {client.hgetall(keys.deadletters(p))} "
                         f"short {sum(n for u, n in short.items() if partition_of(u, partitions) == p)}")
    finally:
        client.close()
    for log in sorted(stack.rglob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if any(w in line for w in ("outbox", "new broker", "stored offset", "re-reading", "Error")):
                lines.append(f"{log.name}: {line[:300]}")
    return "\n".join(lines[-80:])


def _outage(stack: Path, service: str) -> None:
    before = ops.status(stack)
    assert before["running"], before
    web_url, url = before["http"], admin_url(stack)  # the stack's Redis as its administrator (ACL users by default)
    pid = before["processes"][service]
    repairs = before["restarts"].get(service, 0)
    wait_for(lambda: _outbox_len(url) == 0, 30, "an empty outbox before the replay")
    base = released_events(url, NS)
    counted = _ledger(url)
    out, killed_at = asyncio.run(_replay(web_url, KILL_AT, pid))
    assert killed_at, f"the {service} was never killed: {out.acknowledged} acknowledged"
    assert not alive(pid)
    assert out.errors == [], out.errors[:10]
    assert out.acknowledged == EVENTS, (out.acknowledged, out.statuses)
    # the supervisor repaired the stack: a new process on the same address, counted
    st = wait_for(lambda: (lambda s: s if s["restarts"].get(service, 0) == repairs + 1 and s["running"] else None)(
        ops.status(stack)), 60, f"the supervisor's repair of {service}")
    assert st["processes"][service] != pid
    assert st[service] == before[service]  # same port
    last = st["supervisor"]["last"][service]
    assert last["old_pid"] == pid and last["new_pid"] == st["processes"][service], last
    assert st["repairs"][-1]["by"] == "supervisor" and service in st["repairs"][-1]["dead"]
    import subprocess
    import sys

    human = subprocess.run([sys.executable, "-m", "privrec.cli", "status", "--state-dir", str(stack)],
                           capture_output=True, text=True, timeout=60).stdout
    assert f"{service} {repairs + 1}" in human and "by supervisor" in human, human
    # every acknowledged feedback released, exactly once
    want = base + out.acknowledged
    deadline = time.monotonic() + 90
    while not (_outbox_len(url) == 0 and released_events(url, NS) >= want):
        assert time.monotonic() < deadline, (f"the outbox did not drain, or not every acknowledged event was "
                                             f"released: outbox {_outbox_len(url)}, released "
                                             f"{released_events(url, NS)} of {want}\n"
                                             f"{_diagnosis(stack, url, counted, out.per_user)}")
        time.sleep(0.1)
    drained = time.monotonic()
    time.sleep(2.0)  # several more release ticks: nothing counted twice arrives late
    assert released_events(url, NS) == want
    assert _ledger(url) - counted == out.per_user  # per user: every acknowledged feedback counted once
    assert _metric(web_url, 'privrec_stack_repairs_total{service="' + service + '"}', stack) >= 1.0
    slow = max(s for _, s, _ in out.feedback_s)
    during = [s for t, s, _ in out.feedback_s if t >= killed_at and t <= killed_at + last.get("seconds", 0) + 5]
    print(f"\n{service} killed after {KILL_AT} acknowledged: repaired in {last.get('seconds')} s (supervisor), "
          f"outbox drained and all {out.acknowledged} released {drained - killed_at:.1f} s after the kill; "
          f"feedback answers {dict((k[1], v) for k, v in out.statuses.items() if k[0] == 'feedback')}, "
          f"409 after a lost answer {out.already}; slowest /feedback {slow * 1000:.0f} ms, "
          f"slowest in the outage {max(during, default=0) * 1000:.0f} ms, slowest 503 "
          f"{max(out.unavailable_s, default=0) * 1000:.0f} ms; released {base} -> {want}")
    assert max(out.unavailable_s, default=0.0) < 2.0  # a 503 comes back within 2 s


def test_broker_killed_during_a_replay(stack: Path) -> None:
    _outage(stack, "kafka")


def test_redis_killed_during_a_replay(stack: Path) -> None:
    _outage(stack, "redis")




def test_broker_down_is_202_into_the_outbox_and_redis_down_is_503(tmp_path: Path) -> None:
    """No supervisor: with the broker dead, listens are answered 202 at once and kept in the outbox (durable:
    they are still there after redis-server is killed and restarted from its AOF); with redis-server dead too,
    503 with ``Retry-After`` within 2 s."""
    import sys

    from pipeline import services

    from stacks import WORLD

    broker = services.start_broker(tmp_path / "kafka")
    rds = services.start_redis(tmp_path / "redis")
    web = None
    try:
        services.create_topics(broker.address, {"interactions": 4, "dead-letters": 1, "recommendations": 1})
        port = services.free_port()
        env = {**os.environ, **WORLD, "KAFKA_BOOTSTRAP": broker.address, "REDIS_URL": rds.url,
               "PRIVREC_NAMESPACE": "down", "PRIVREC_STATE_DIR": str(tmp_path)}
        web = services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], tmp_path,
                                     env=env, address=f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/listen"
        assert http("POST", url, {"user": "1", "item": "3"}, timeout=30)[0] == 202
        os.kill(broker.pid, signal.SIGKILL)
        wait_for(lambda: not services.is_running(broker), 10, "the broker to exit")
        answers = [http("POST", url, {"user": str(i % 6), "item": str(i)}, timeout=30) for i in range(20)]
        assert [a[0] for a in answers] == [202] * 20
        slowest_202 = max(a.seconds for a in answers)
        assert slowest_202 < 2.0
        keys = OutboxKeys("down")
        client = redis.Redis.from_url(rds.url)
        assert client.xlen(keys.stream) == 21  # the first one too: sent, but kept until a worker counts it
        client.close()
        os.kill(rds.pid, signal.SIGKILL)
        wait_for(lambda: not services.is_running(rds), 10, "redis-server to exit")
        refused = [http("POST", url, {"user": "2", "item": "5"}, timeout=30) for _ in range(5)]
        assert all(r.status == 503 and "Retry-After" in r.headers for r in refused), refused
        slowest_503 = max(r.seconds for r in refused)
        assert slowest_503 < 2.0
        rds = services.start_redis(tmp_path / "redis", port=int(rds.url.rsplit(":", 1)[1].split("/")[0]))
        client = redis.Redis.from_url(rds.url)
        assert client.xlen(keys.stream) == 21  # durable: from the AOF
        client.close()
        status, _ = wait_for(lambda: (lambda a: a if a[0] == 202 else None)(
            http("POST", url, {"user": "2", "item": "5"}, timeout=30)), 20, "202 again once redis-server is back")
        print(f"\nbroker dead: 20 listens answered 202 in at most {slowest_202 * 1000:.0f} ms; redis dead too: "
              f"503 + Retry-After in at most {slowest_503 * 1000:.0f} ms")
    finally:
        if web is not None:
            services.stop(web)
        services.stop(rds)
        services.stop(broker)


def test_where_a_lost_log_was_counted_to_is_recorded(redis_client: redis.Redis) -> None:
    """Adopting a new broker (a worker) or resetting the offsets (``privrec up``, the repair) records, per
    partition, the next offset the old log would have been counted from — what the outbox re-sends beyond."""
    from pipeline.state.trusted import TrustedStore

    store = TrustedStore(redis_client, "lost")
    public = PublicKeys("lost")
    assert store.adopt_broker("A", 2) is False  # the first broker: nothing to retire
    redis_client.set(store.keys.offset(0), 7)
    assert store.adopt_broker("B", 2) is True
    assert redis_client.hgetall(public.retired_logs(0)) == {b"A": b"7", b"@adopted": b"B"}
    assert redis_client.hgetall(public.retired_logs(1)) == {b"A": b"0", b"@adopted": b"B"}  # nothing counted there
    assert store.offsets(2) == [None, None]
    redis_client.set(store.keys.offset(1), 5)
    store.reset_offsets(2)  # `privrec up` after a new broker, before any worker adopts it
    assert redis_client.hget(public.retired_logs(1), "B") == b"5"
    assert store.adopt_broker("C", 2) is True
    assert redis_client.hget(public.retired_logs(1), "B") == b"5"  # the reset's record stands
    assert redis_client.hget(public.retired_logs(1), "@adopted") == b"C"


def test_a_forwarder_killed_between_the_acks_and_their_record_counts_nothing_twice(
        tmp_path: Path, redis_server: Any) -> None:
    """The web server SIGKILLs itself right after the broker acknowledged a batch, before the positions are in
    Redis (fault point ``outbox-acknowledged``). The next web server finds the batch in flight, reads where its
    entries landed, and sends none of them again: every acknowledged feedback is counted exactly once."""
    import sys

    from pipeline import services

    from stacks import open_stack

    def web(env: dict[str, str], port: int) -> services.ServiceHandle:
        return services.start_process("web", [sys.executable, "-m", "pipeline.apps.web", "--port", str(port)], tmp_path,
                                      env={**os.environ, **env}, address=f"127.0.0.1:{port}")

    def feedback(base: str, user: str) -> int:
        """The status of one feedback answering a fresh list; 0 when there was no list (the server is gone)."""
        rec = http("GET", f"{base}/recommend?user={user}&k=3")
        if rec.status != 200:
            return 0
        body = {"rec_id": rec.body["rec_id"], "item": rec.body["items"][0]["item"], "reward": 1}
        return http("POST", f"{base}/feedback", body, timeout=30).status

    ns = "inflight"
    with open_stack(tmp_path, redis_server.url, ns) as st:
        st.start_worker()
        wait_for(lambda: st.model_version() >= 1, 30, "a first model")
        port = services.free_port()
        base = f"http://127.0.0.1:{port}"
        first = web({**st.env, "PRIVREC_FAULT": "outbox-acknowledged@3"}, port)
        acked: Counter[str] = Counter()
        try:
            for i in range(20):
                user = str(i % 6)
                status = feedback(base, user)
                if status == 0:
                    break  # the server killed itself
                assert status == 202
                acked[user] += 1
                time.sleep(0.1)  # one batch per feedback
            wait_for(lambda: not services.is_running(first), 10, "the web server to kill itself")
        finally:
            services.stop(first)
        assert 3 <= sum(acked.values()) < 20
        client = redis.Redis.from_url(st.redis_url)
        assert client.exists(OutboxKeys(ns).inflight)  # it died with the batch in flight
        client.close()
        second = web(st.env, port)
        try:
            for i in range(6):
                assert feedback(base, str(i)) == 202
                acked[str(i)] += 1
            deadline = time.monotonic() + 60
            while _outbox_len(st.redis_url, ns) or _ledger(st.redis_url, ns) != acked:
                assert time.monotonic() < deadline, (_outbox_len(st.redis_url, ns), _ledger(st.redis_url, ns), acked)
                time.sleep(0.1)
            time.sleep(1.5)  # nothing counted twice arrives late
            assert _ledger(st.redis_url, ns) == acked
            assert b"recovered a batch" in Path(second.log_path).read_bytes()
        finally:
            services.stop(second)


def test_the_web_role_may_use_its_outbox_and_nothing_trusted(tmp_path: Path) -> None:
    """Under the ACL users of :func:`pipeline.config.acl.global_rules`, the web role enqueues (the claim and the event in
    one script), takes the forwarding lease, records positions and reads the retired logs; it still cannot read
    an offset (a trusted key)."""
    from pipeline.config import acl
    from pipeline import services
    from pipeline.serve.outbox import ENQUEUE_SCRIPT, LEASE_SCRIPT
    from pipeline.state.trusted import TrustedKeys

    handle = services.start_redis(tmp_path, name="redis-acl-outbox")
    try:
        rules = acl.global_rules("aclbox")
        creds = acl.new_credentials(list(rules))
        acl.apply_acl(redis.Redis.from_url(handle.url), rules, creds)
        web = redis.Redis.from_url(acl.role_url(handle.url, "web", creds["web"]))
        keys = OutboxKeys("aclbox")
        answered = PublicKeys("aclbox").recommendation("r1") + ":answered"
        enqueue = web.register_script(ENQUEUE_SCRIPT)
        assert enqueue(keys=[keys.stream, answered], args=["interactions", b"u", b"{}", "1", 60]) is not None
        assert enqueue(keys=[keys.stream, answered], args=["interactions", b"u", b"{}", "1", 60]) is None  # 409
        assert web.register_script(LEASE_SCRIPT)(keys=[keys.lease], args=["me", 1000]) == 1
        web.hset(keys.sent, "1-0", "id interactions 0 0")
        web.hset(keys.inflight, "ident", "id")
        assert web.hgetall(PublicKeys("aclbox").retired_logs(0)) == {}
        with pytest.raises(redis.exceptions.NoPermissionError):
            web.get(TrustedKeys("aclbox").offset(0))
        web.close()
    finally:
        services.stop(handle)


def test_a_produce_begun_against_a_dead_broker_is_not_taken_by_its_replacement(tmp_path: Path) -> None:
    """Issue 25: the broker is SIGKILLed while the web's feedback producer holds batches it has not acknowledged, and a
    new broker is started on its port as the repair does (:func:`privrec.ops.repair.start_new_broker`, the topics
    created right after). The producer's retries must not reach the new broker: Tansu acknowledges a produce to a topic
    it does not have yet without keeping it (the outbox then drops the events as counted), and the partition's log is
    damaged from then on (a later record is acknowledged and never read). Each such produce fails instead, and the new
    broker's log reads back exactly what it acknowledged afterwards."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from pipeline import services
    from pipeline.config.kafkaconn import PRODUCE_TIMEOUT_MS
    from privrec.ops.repair import start_new_broker

    old = services.start_broker(tmp_path)
    new = None
    notes: list[str] = []
    try:
        services.create_topics(old.address, {"interactions": 2})

        async def run() -> tuple[list[BaseException | Any], dict[tuple[int, int], bytes], set[tuple[int, int, bytes]]]:
            nonlocal new
            loop = asyncio.get_running_loop()
            producer = AIOKafkaProducer(bootstrap_servers=old.address, linger_ms=0, request_timeout_ms=PRODUCE_TIMEOUT_MS)
            await producer.start()
            try:
                await producer.send_and_wait("interactions", b"before", partition=0)
                os.kill(old.pid, signal.SIGKILL)
                await loop.run_in_executor(None, lambda: wait_for(lambda: not alive(old.pid), 10, "the broker to exit"))
                seen = time.monotonic()
                pending = [await producer.send("interactions", b"pending-%d" % i, partition=i % 2) for i in range(10)]
                new = await loop.run_in_executor(None, lambda: start_new_broker(
                    tmp_path, old.address, dead_since=seen, timeout=30, note=notes.append))
                await loop.run_in_executor(None, lambda: services.create_topics(new.address, {"interactions": 2}))
                outcomes = await asyncio.gather(*pending, return_exceptions=True)
                after = [await producer.send("interactions", b"after-%d" % i, partition=i % 2) for i in range(10)]
                later = await asyncio.gather(*after, return_exceptions=True)
                acked = {(md.partition, md.offset): b"after-%d" % i for i, md in enumerate(later)
                         if not isinstance(md, BaseException)}
                assert len(acked) == 10 or [o for o in outcomes if not isinstance(o, BaseException)], later
            finally:
                await producer.stop()
            consumer = AIOKafkaConsumer(bootstrap_servers=new.address, enable_auto_commit=False)
            await consumer.start()
            try:
                tps = [TopicPartition("interactions", p) for p in range(2)]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                read: set[tuple[int, int, bytes]] = set()
                while batches := await consumer.getmany(timeout_ms=2000):
                    read |= {(tp.partition, r.offset, bytes(r.value or b"")) for tp, rs in batches.items() for r in rs}
            finally:
                await consumer.stop()
            return outcomes, acked, read

        outcomes, acked, read = asyncio.run(run())
        assert new is not None and new.address == old.address  # the same port
        taken = [o for o in outcomes if not isinstance(o, BaseException)]
        assert taken == [], (f"the new broker acknowledged {len(taken)} of 10 produces begun against the dead one, at "
                             f"{[(md.partition, md.offset) for md in taken]}")
        assert read == {(p, o, v) for (p, o), v in acked.items()}  # every acknowledged record read back, nothing else
        assert notes and "waiting" in notes[0], notes
    finally:
        for h in (new, old):
            if h is not None:
                services.stop(h)
