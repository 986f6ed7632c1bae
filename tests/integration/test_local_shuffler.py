"""Local mode with a shuffler the server does not control (encode-shuffle-analyze), against a real stack.

``privrec up --mode local --shuffle-batch 3`` on LastFM (model units are friend-graph clusters, so a unit's batch
holds several users) starts the embedded broker, redis-server with ACL users, the shuffler as its own process
(own port, own Redis user and keys), the worker (the analyzer, the only holder of the private key), the web
server and the supervisor. Simulated devices (:class:`models.local.LocalClient`) ask the web server for
recommendations and send sealed envelopes to the shuffler. Then:

* the analyzer's process never holds a user id next to a report's contents: its topics (``ldp-shuffled``,
  ``dead-letters``), its Redis keys and its log hold no plaintext report vector at all (only sums), no user, version
  or request id comes with a batch, and no sealed content appears anywhere the operator sees identities (the web's
  log, keys and topics) — so the analyzer cannot link an opened content back to its sender;
* the shuffler's process never holds a decrypted report: its keys, its log and its output topic hold no plaintext
  report vector and no raw reward;
* the local-mode boundary scan (no raw reward, no exact per-user statistic on any topic, Redis value or log) passes;
* the released sums are exactly the sums of the reports of the closed batches (the analyzer decrypted them all);
* bad input: a malformed envelope gets a 4xx naming the field; a ciphertext under another key, changed bytes or a
  content that names its user are dead-lettered by the analyzer with the reason, and the rest of the batch counts;
* the Redis ACL: neither the worker nor the web can read the shuffler's keys; the shuffler can read no trusted key
  and cannot write the shown lists; only the worker's environment names the private key;
* kill -9 of the shuffler mid-batch: the supervisor starts it again and the accepted envelopes are still there;
* two workers (analyzers only: the open batches live in the shuffler), one partition of ``ldp-shuffled`` each;
  batches of units on both partitions are counted, each once;
* a batch with a content that does not open counts not at all (its shown items cannot be told apart);
* ``/budget`` shows the users' user-level ledger, which the shuffler mirrors to the public ledger keys.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from models.local import LocalClient, LocalConfig, LocalReport
from models.local.esa import CONTENT_SCHEMA, MESSAGE_SCHEMA, seal_report
from models.local.seal import AnalyzerKey, b64decode, b64encode, seal
from models.local.shuffle import Shuffler
from models.streaming import ReleasedStats
from pipeline import services
from pipeline.data.catalog import load_catalog
from pipeline.modes.local.esa import KEY_ENV, PUBLIC_ENV
from pipeline.config.settings import Settings
from privrec import ops
from privrec.ops.redis_users import role_redis_url
from privrec.ops.stackfile import read_tokens

from stacks import http, lastfm_data_or_skip, up_stack, wait_for
from test_local_mode import _all_messages, _arrays, _assert_no_leak, _find, _redis_values, _walk

pytestmark = pytest.mark.integration

N = 3  # distinct users per batch
NS = "esa"



class Stack:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.info = ops.read_stack(state)
        self.base = self.info["http"]
        self.admin = redis.Redis.from_url(role_redis_url(self.info, "admin"))
        status, public = wait_for(lambda: (r := http("GET", f"{self.base}/local/config"))[0] == 200 and r, 30, "config")
        self.public = public
        from producers.devices import config_from_public

        self.config: LocalConfig = config_from_public(public)
        self.pk = b64decode(public["esa"]["public_key"])
        self.submit = public["esa"]["shuffler"]
        self.catalog = load_catalog(Settings.from_mapping(self.info["settings"], environ={}))
        self.devices: dict[str, LocalClient] = {}

    def released(self) -> ReleasedStats:
        return ReleasedStats.from_mapping(self.admin.hgetall(f"{NS}:released:{{{NS}:rel}}:stats"))

    def count(self) -> int:
        try:
            return int(self.released().count.sum())
        except Exception:  # noqa: BLE001 - nothing released yet
            return 0

    def wait_count(self, count: int) -> ReleasedStats:
        wait_for(lambda: self.count() >= count, 60, f"a release covering {count} reports")
        time.sleep(0.8)  # anything more would be released by now
        assert self.count() == count
        return self.released()

    def users_of(self, unit: int, k: int) -> list[str]:
        return sorted((u for u in self.catalog.users if self.catalog.unit_of(u) == unit), key=int)[:k]

    def recommend(self, user: str) -> dict[str, Any]:
        status, rec = wait_for(lambda: (r := http("GET", f"{self.base}/recommend?user={user}&k=3"))[0] == 200 and r, 30,
                               "/recommend")
        return dict(rec)

    def report(self, user: str, reward: float, rng: random.Random) -> tuple[LocalReport, Any, dict[str, Any]]:
        """One interaction: recommend, the device's report, its envelope; returns (report, envelope, the list)."""
        dev = self.devices.setdefault(user, LocalClient(user, self.config))
        rec = self.recommend(user)
        item = rec["items"][rng.randrange(len(rec["items"]))]
        rep = dev.report(rec_id=rec["rec_id"], x=np.asarray(item["x"]), reward=reward)
        return rep, seal_report(rep, self.pk), rec


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data = lastfm_data_or_skip()
    state = tmp_path_factory.mktemp("esa") / "stack"
    settings = Settings(mode="local", namespace=NS, catalog="lastfm", data_dir=str(data), local_algorithm="round",
                        shuffle_batch=N, epsilon=2.0, algorithm="linucb", tick_seconds=0.3, partitions=2,
                        user_cap=64)  # user level (the default): a cap above what a device here reports in one epoch
    with up_stack(settings, state, workers=2, timeout=120, loglevel="INFO"):  # two analyzers, a partition each
        yield Stack(state)


def _expected_sums(reports: list[LocalReport], unit_of: Any, d: int, n_units: int) -> tuple[np.ndarray, int]:
    """The per-unit sums of the reports that closed batches, by the same batching policy (membership is
    deterministic; only the order inside a batch is random)."""
    cfg = LocalConfig(algorithm="round", d=d, epsilon=2.0, shuffle_batch=N)
    sh = Shuffler(cfg)
    sums, count = np.zeros((n_units, d)), 0
    for rep in reports:
        for b in sh.add(rep, unit=unit_of(rep.user)):
            sums[b.unit] += np.asarray(b.vectors).sum(axis=0)
            count += b.n
    return sums, count


def _sealed_finder(envelopes: list[Any]) -> Callable[[bytes], bool]:
    """Whether a blob holds a sealed blob of ``envelopes`` (the content or a codeword message, raw or in base64).

    Exact and fast with thousands of messages: each form is looked up by its first 16 bytes at the blob's
    positions that hold a form's first byte (``\\x04`` raw, ``B`` in base64), then compared whole."""
    raw = [e.sealed for e in envelopes] + [m for e in envelopes for m in e.msgs]
    index: dict[bytes, list[bytes]] = {}
    for form in raw + [b64encode(b).encode() for b in raw]:
        index.setdefault(form[:16], []).append(form)
    heads = {prefix[:1] for prefix in index}

    def found(blob: bytes) -> bool:
        for head in heads:
            i = blob.find(head)
            while i >= 0:
                if any(blob.startswith(form, i) for form in index.get(blob[i:i + 16], ())):
                    return True
                i = blob.find(head, i + 1)
        return False

    return found


#: Fields that would name a report's sender, and fields that would carry a codeword index or message.
IDENTITY_FIELDS = {"user", "users", "version", "rec_id"}
CODEWORD_FIELDS = {"c", "code", "codeword", "msgs", "messages"}


def assert_no_identified_codeword(where: str, blob: bytes) -> None:
    """No opened item message (its plaintext schema) in ``blob``, and no JSON object at any depth that names a
    sender next to a codeword index or messages."""
    assert MESSAGE_SCHEMA.encode() not in blob, f"an opened item message in {where}"
    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        return
    for v in _walk(doc):
        if isinstance(v, dict) and IDENTITY_FIELDS & set(v):
            assert not CODEWORD_FIELDS & set(v), f"a codeword next to a user in {where}: {str(v)[:200]}"


def assert_parties_apart(info: dict[str, Any], state: Path, ns: str, *, d: int, contents: np.ndarray,
                         envelopes: list[Any], rec_ids: list[str], rewards: list[float],
                         exact: list[np.ndarray]) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """The boundary scan of an ESA stack (``privrec up`` with a separate shuffler) after devices sent
    ``envelopes``; returns every Kafka message and Redis key/value scanned.

    * the analyzer (``ldp-shuffled``, ``dead-letters``, its ``{ns}:*`` keys, the worker's log) holds no plaintext
      report vector (``contents``; all-zero rows, as with codewords, are not searched), no batch an identity,
      no request id; with codewords no opened item message and no codeword next to a user;
    * no sealed content or message appears where the operator sees identities (the web's log, keys, topics);
    * the shuffler (its keys, log and output) holds no plaintext vector and, with codewords, no opened message or
      content (their plaintext schemas);
    * the local-mode boundary: no raw reward, no exact per-user statistic anywhere.
    """
    messages = _all_messages(info["kafka"])
    values = _redis_values(role_redis_url(info, "admin"))
    logs = {name: [(f"{name}.log", line) for line in (state / f"{name}.log").read_bytes().splitlines()]
            for name in ("worker-0", "web", "shuffler")}
    assert all(logs.values())
    secret = contents[np.abs(contents).max(axis=1) > 0]
    codewords = any(e.msgs for e in envelopes)
    shuffled = [(t, v) for t, v in messages if t == "ldp-shuffled"]
    assert shuffled and (secret.size or codewords), "the scan has nothing to look for"

    # the analyzer: its topics, its keys and its log hold no plaintext report, and no batch an identity
    analyzer = ([(t, v) for t, v in messages if t in ("ldp-shuffled", "dead-letters")]
                + [(k, v) for k, v in values if k.startswith(f"{ns}:")] + logs["worker-0"])
    for where, blob in analyzer:
        if secret.size:
            for arr in _arrays(blob, d):
                assert not _find(arr, secret), f"a plaintext report in the analyzer's {where}"
        if codewords:
            assert_no_identified_codeword(f"the analyzer's {where}", blob)
    for _, blob in shuffled:
        doc = json.loads(blob)
        assert not {"user", "version", "rec_id", "shown"} & set(doc), "a batch carries an identity"
        assert not any(r.encode() in blob for r in rec_ids), "a request id reached the analyzer"
        assert bool(doc.get("msgs")) == codewords
    assert not any(rid.encode() in line for _, line in logs["worker-0"] for rid in rec_ids)
    # ... and no sealed content or message appears where the operator sees identities (the web's log, keys, topics)
    sealed = _sealed_finder(envelopes)
    assert any(sealed(blob) for _, blob in shuffled), "no sealed blob of the devices reached the analyzer"
    operator = ([(t, v) for t, v in messages if t not in ("ldp-shuffled", "dead-letters")]
                + [(k, v) for k, v in values if k.startswith(f"{ns}:")] + logs["web"] + logs["worker-0"])
    for where, blob in operator:
        assert not sealed(blob), f"a sealed content next to identities in {where}"

    # the shuffler: its keys, its log and its output hold no plaintext report and no raw reward
    shuffler = ([(k, v) for k, v in values if k.startswith(f"{ns}-shuffler:")] + logs["shuffler"] + shuffled)
    assert any(k.startswith(f"{ns}-shuffler:") for k, _ in values)
    for where, blob in shuffler:
        if secret.size:
            for arr in _arrays(blob, d):
                assert not _find(arr, secret), f"a decrypted report in the shuffler's {where}"
        if codewords:
            assert MESSAGE_SCHEMA.encode() not in blob and CONTENT_SCHEMA.encode() not in blob, \
                f"an opened message or content in the shuffler's {where}"

    # the local-mode boundary: no raw reward, no exact per-user statistic anywhere
    blobs = messages + values + [x for lines in logs.values() for x in lines]
    _assert_no_leak(blobs, rewards, exact, d)
    return messages, values


def test_each_party_sees_only_its_part(stack: Stack) -> None:
    st = stack
    rng = random.Random(11)
    assert st.public["esa"]["curve"] == "P-256" and st.submit.startswith("http://127.0.0.1:")
    users = st.users_of(1, 4) + st.users_of(2, 4)
    start = st.count()
    reports: list[LocalReport] = []
    envelopes, rewards, exact, rec_ids = [], [], [], []
    for _ in range(66):
        user = rng.choice(users)
        reward = rng.random() if rng.random() < 0.5 else float(rng.randrange(2))  # fractions: distinctive digits
        rep, env, rec = st.report(user, reward, rng)
        status, body = http("POST", st.submit, env.to_dict())
        assert status == 202, body
        st.devices[user].acknowledge(rep.version)
        reports.append(rep)
        envelopes.append(env)
        rewards.append(reward)
        exact.append(st.devices[user].exact_b)
        rec_ids.append(rec["rec_id"])
    # the web server refuses a report: it must never see one next to its user
    status, body = http("POST", f"{st.base}/report", reports[-1].to_dict())
    assert status == 400 and st.submit in body["error"]["message"]
    sums, count = _expected_sums(reports, st.catalog.unit_of, st.config.d, st.catalog.n_units)
    assert count >= 12  # several batches closed
    rel = st.wait_count(start + count)
    np.testing.assert_allclose(rel.b_tilde.reshape(-1, st.config.d)[[1, 2]], sums[[1, 2]], rtol=0, atol=1e-9)
    # units 1 and 2's batches are keyed to different partitions, so the two workers each counted some
    from pipeline.config.keys import partition_of

    assert {partition_of("1", 2), partition_of("2", 2)} == {0, 1}
    assert {n for n in ops.status(st.state, probe=False)["processes"] if n.startswith("worker-")} == {
        "worker-0", "worker-1"}
    # the shuffler checked the cap and mirrored each user's ledger record to the public keys: /budget has them
    counts = {u: sum(r.user == u for r in reports) for u in users}
    own = read_tokens(st.state).for_user(users[0])  # the user's own token (privrec up's secret)
    status, b = http("GET", f"{st.base}/budget?user={users[0]}", token=own)
    assert b["user"]["ticks_this_epoch"] == counts[users[0]] and b["user"]["epsilon"] > 0
    assert b["ledger"]["users"] >= sum(c > 0 for c in counts.values())
    time.sleep(1.0)  # let the logs flush

    contents = np.stack([r.vector for r in reports])  # the plaintext report vectors (each noisy, each distinctive)
    messages, values = assert_parties_apart(st.info, st.state, NS, d=st.config.d, contents=contents,
                                            envelopes=envelopes, rec_ids=rec_ids, rewards=rewards, exact=exact)
    assert len([t for t, _ in messages if t == "ldp-shuffled"]) >= count // N
    # the shuffler holds the open envelopes: their sealed bytes, never the vectors
    assert any(b64encode(e.sealed).encode() in v for e in envelopes[-3:] for k, v in values
               if k.startswith(f"{NS}-shuffler:open")) or count == len(reports)

    # /budget states the guarantee against each party
    status, b = http("GET", f"{st.base}/budget?user={users[0]}", token=own)
    p = b["local"]["guarantee"]["parties"]
    assert p["analyzer_operator"]["epsilon"] == 2.0 and p["colluding"]["epsilon"] == pytest.approx(
        st.config.epsilon0)
    assert p["shuffler_operator"]["epsilon"] == 0.0 and "separate service" in p["shuffler"]
    assert b["privacy"]["parties"]["analyzer_operator"]["epsilon"] == 2.0  # the worker's statement agrees
    assert "separate service" in b["local"]["guarantee"]["statement"] and "separate service" in b["privacy"]["note"]


def test_bad_envelopes_get_a_4xx_naming_the_field(stack: Stack) -> None:
    st = stack
    rng = random.Random(3)
    (user, other), = [st.users_of(3, 2)]
    rep, env, rec = st.report(user, 1.0, rng)
    good = env.to_dict()
    cases = [
        (b"not json", 400, "body"),
        ({**good, "sealed": "%%%"}, 400, "sealed"),
        ({**good, "sealed": b64encode(b"\x04" + bytes(120))}, 400, "sealed"),
        ({**good, "m": rep.vector.tolist()}, 400, "m"),
        ({**good, "user": "no-such-user"}, 404 if _unknown(st, "no-such-user") else 400, "user"),
        ({**good, "rec_id": "no-such-list"}, 404, "rec_id"),
        ({**good, "user": other}, 400, "user"),
        # user level (the default): the shuffler checks the cap per epoch from the envelope's epoch
        ({k: v for k, v in good.items() if k != "epoch"}, 400, "epoch"),
        ({**good, "epoch": "soon"}, 400, "epoch"),
        ({**good, "epoch": good["epoch"] + 5}, 403, "epoch"),
    ]
    for body, status, parameter in cases:
        got, answer = http("POST", st.submit, body)
        assert (got, answer["error"]["parameter"]) == (status, parameter), (body, answer)
    assert http("POST", st.submit, good)[0] == 202
    got, answer = http("POST", st.submit, good)
    assert got == 409 and answer["error"]["parameter"] == "rec_id"
    rep2, env2, _ = st.report(user, 0.0, rng)
    stale = {**env2.to_dict(), "version": rep.version}
    got, answer = http("POST", st.submit, stale)
    assert got == 409 and "stale or repeated version" in answer["error"]["message"]


def test_a_batch_with_a_content_that_does_not_open_counts_not_at_all(stack: Stack) -> None:
    st = stack
    rng = random.Random(4)
    users = st.users_of(5, N)
    start = st.count()
    wrong_key = AnalyzerKey.generate().public_bytes()
    sent = []
    for i, user in enumerate(users):
        rep, env, _ = st.report(user, 0.5, rng)
        if i == 0:  # sealed to another key
            env = seal_report(rep, wrong_key)
        elif i == 1:  # a content that names its user (it would re-identify the report)
            content = json.dumps({"schema": "privrec.ReportContent/1", "algorithm": "round",
                                  "m": rep.vector.tolist(), "user": user}).encode()
            env = type(env)(env.user, env.version, env.rec_id, seal(st.pk, content), epoch=env.epoch)
        assert http("POST", st.submit, env.to_dict())[0] == 202
        sent.append((rep, env))
    before = st.released()
    good, shown = [], []  # then a whole batch of the same unit: it counts, the first one never did
    for user in users:
        rep, env, rec = st.report(user, 0.5, rng)
        assert http("POST", st.submit, env.to_dict())[0] == 202
        good.append(rep)
        shown += [np.asarray(item["x"]) for item in rec["items"]]
    rel = st.wait_count(start + N)
    d = st.config.d
    np.testing.assert_allclose(rel.b_tilde.reshape(-1, d)[5] - before.b_tilde.reshape(-1, d)[5],
                               sum(r.vector for r in good), rtol=0, atol=1e-9)
    X = np.stack(shown)  # the Gram took the good batch's lists only, none of the first batch's
    np.testing.assert_allclose(rel.gram[5] - before.gram[5], X.T @ X, rtol=0, atol=1e-9)
    dead = [json.loads(v) for t, v in _all_messages(st.info["kafka"]) if t == "dead-letters"]
    reasons = {d["reason"] for d in dead}
    assert any("authentication failed" in r for r in reasons), reasons
    assert any("malformed" in r and "user" in r for r in reasons), reasons
    assert any("not counted: 2 of the 3 contents" in r for r in reasons), reasons


def test_the_shuffler_is_a_party_apart_in_redis_and_in_its_environment(stack: Stack) -> None:
    st = stack
    url = st.info["redis"]
    from pipeline.config import acl

    creds = acl.load_credentials(st.state)
    assert creds is not None and "shuffler" in creds
    conn = {role: redis.Redis.from_url(acl.role_url(url, role, creds[role])) for role in ("worker", "web", "shuffler")}
    shuffler_key = next(k for k in st.admin.scan_iter(match=f"{NS}-shuffler:*"))
    for role in ("worker", "web"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn[role].type(shuffler_key)
    with pytest.raises(redis.exceptions.NoPermissionError):
        conn["shuffler"].get(f"{NS}:trusted:{{{NS}:p0}}:offset")
    rec_key = next(k for k in st.admin.scan_iter(match=f"{NS}:recs:*"))
    assert conn["shuffler"].get(rec_key) is not None  # it reads the shown lists ...
    with pytest.raises(redis.exceptions.NoPermissionError):
        conn["shuffler"].set(rec_key, b"x")  # ... and cannot change them
    for c in conn.values():
        c.close()
    procs = ops.status(st.state, probe=False)["processes"]

    def environ(name: str) -> dict[str, str]:
        pid = procs[name]["pid"] if isinstance(procs[name], dict) else procs[name]
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return dict(x.decode().split("=", 1) for x in raw if b"=" in x)

    assert KEY_ENV in environ("worker-0")
    assert KEY_ENV not in environ("web") and KEY_ENV not in environ("shuffler")
    assert PUBLIC_ENV in environ("web")
    key_file = Path(environ("worker-0")[KEY_ENV])
    assert key_file.stat().st_mode & 0o077 == 0  # owner only


def test_kill9_of_the_shuffler_keeps_accepted_envelopes(stack: Stack) -> None:
    st = stack
    rng = random.Random(6)
    users = st.users_of(4, N)
    start = st.count()
    reps = []
    for user in users[:2]:
        rep, env, _ = st.report(user, 1.0, rng)
        assert http("POST", st.submit, env.to_dict())[0] == 202
        reps.append(rep)
    handle = services.read_handles(st.state)["shuffler"]
    os.kill(handle.pid, 9)
    wait_for(lambda: not services.is_running(handle), 10, "the killed shuffler to exit")
    wait_for(lambda: _alive(st) and _healthy(st.submit.rsplit("/", 1)[0] + "/healthz"), 60,
             "the supervisor to start the shuffler again")
    assert services.read_handles(st.state)["shuffler"].pid != handle.pid
    rep, env, _ = st.report(users[2], 1.0, rng)
    assert http("POST", st.submit, env.to_dict())[0] == 202
    reps.append(rep)
    rel = st.wait_count(start + N)
    np.testing.assert_allclose(rel.b_tilde.reshape(-1, st.config.d)[4], sum(r.vector for r in reps), rtol=0,
                               atol=1e-9)


def _unknown(st: Stack, user: str) -> bool:
    """Whether the catalog refuses ``user`` (LastFM's maps any id to a unit: then the list's owner differs)."""
    try:
        st.catalog.unit_of(user)
    except Exception:  # noqa: BLE001 - UnknownUserError
        return True
    return False


def _healthy(url: str) -> bool:
    return http("GET", url)[0] == 200  # 0 while not listening yet


def _alive(st: Stack) -> bool:
    h = services.read_handles(st.state).get("shuffler")
    return h is not None and services.is_running(h)


def test_the_lastfm_replay_reports_through_the_shuffler(stack: Stack, tmp_path: Path) -> None:
    """``privrec replay lastfm --mode local`` notices the separate shuffler: every report is sealed and sent there
    (none to the web server), and the batches that close reach the model."""
    from privrec.cli import main

    start = stack.count()
    accepted_key = f"{NS}-shuffler:accepted:{{{NS}-shuffler}}"
    versions_key = f"{NS}-shuffler:versions:{{{NS}-shuffler}}"
    before = sum(int(v) for v in stack.admin.hvals(accepted_key))
    versions_before = {k.decode(): int(v) for k, v in stack.admin.hgetall(versions_key).items()}
    assert main(["replay", "lastfm", "--mode", "local", "--events", "150", "--http", stack.base, "--out",
                 str(tmp_path / "out"), "--no-baselines", "--no-progress"]) == 0
    # every report went to the shuffler (the web server answers /report with 400 here: the replay would have
    # failed). The replay's fresh devices start at version 1: a user who reported in an earlier test has their
    # first versions refused as stale (409, which the replay counts as delivered), so each user's accepted
    # envelopes are exactly how far their latest version moved, and only such users can have a refusal.
    accepted = sum(int(v) for v in stack.admin.hvals(accepted_key)) - before
    versions_after = {k.decode(): int(v) for k, v in stack.admin.hgetall(versions_key).items()}
    assert accepted == sum(v - versions_before.get(u, 0) for u, v in versions_after.items())
    assert 0 <= 150 - accepted <= sum(versions_before.values())
    assert accepted > 100
    wait_for(lambda: stack.count() > start, 60, "a batch of the replay released")


def test_the_codeword_scan_finds_what_it_looks_for() -> None:
    """The codeword part of the scan is not vacuous: an opened message, or a codeword beside a user id at any depth,
    is found; a batch's sealed messages without a user, or a user without a codeword, pass."""
    from models.local.esa import message_content

    assert_no_identified_codeword("clean", json.dumps({"unit": 0, "msgs": ["QUJD"], "sealed": ["REVG"]}).encode())
    assert_no_identified_codeword("ledger", json.dumps({"user": "7", "epoch": 3, "k": 1}).encode())
    assert_no_identified_codeword("log", b"INFO batch 4 of 100 users: 912 messages")
    planted = [("opened", b"x " + message_content(5) + b" y"),
               ("beside", json.dumps({"user": "7", "c": 5}).encode()),
               ("nested", json.dumps({"batch": [{"rec_id": "r1", "msgs": [3, 4]}]}).encode()),
               ("version", json.dumps({"version": 2, "codeword": 1}).encode())]
    for where, blob in planted:
        with pytest.raises(AssertionError):
            assert_no_identified_codeword(where, blob)


#: KEYS none, ARGV[1] microseconds: keeps the redis-server busy (one script runs alone) for that long; returns 1.
_BUSY = """local t0 = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) >= tonumber(ARGV[1]) then return 1 end
end"""


def test_a_slow_store_does_not_stall_the_shufflers_event_loop(redis_client: redis.Redis) -> None:
    """While the redis-server is busy for 0.6 s, an envelope's accept waits for it — and the event loop keeps
    running (a 10 ms ticker never waits 0.2 s): the shuffler's Redis calls are off the loop."""
    import asyncio
    import threading

    from pipeline.config.keys import PublicKeys
    from pipeline.data.catalog import SyntheticCatalog
    from pipeline.modes.local.shuffler_service import ShufflerService

    settings = Settings(mode="local", namespace="lag", d=4, n_users=4, n_arms=12, local_algorithm="round",
                        shuffle_batch=3, epsilon=2.0, privacy_unit="event", redis_url="redis://unused")
    catalog = SyntheticCatalog(n_users=4, d=4, n_arms=12)
    config = settings.local_config(catalog.d)
    service = ShufflerService(redis_client, settings, catalog, config)
    redis_client.set(PublicKeys("lag").recommendation("r1"), json.dumps({"user": "1", "items": ["0", "1", "2"]}))
    envelope = seal_report(LocalClient("1", config).report(rec_id="r1", x=np.full(4, 0.5), reward=1.0),
                           AnalyzerKey.generate().public_bytes()).to_json()
    busy = redis.Redis.from_url(f"redis://127.0.0.1:{redis_client.connection_pool.connection_kwargs['port']}/0")
    script = threading.Thread(target=busy.eval, args=(_BUSY, 0, 600_000))

    async def run() -> tuple[tuple[int, Any], float, float]:
        script.start()
        await asyncio.sleep(0.05)  # the script holds the server now
        t0 = time.perf_counter()
        task = asyncio.create_task(service.accept(envelope))
        gap, last = 0.0, time.perf_counter()
        while not task.done():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        return await task, time.perf_counter() - t0, gap

    (status, body), took, gap = asyncio.run(run())
    script.join()
    busy.close()
    assert status == 202, body
    assert took > 0.4, f"the accept did not wait for the busy server ({took:.3f} s): the test shows nothing"
    assert gap < 0.2, f"the event loop stalled {gap:.3f} s while the store was busy"
    assert int(redis_client.hget(service.store.versions, "1")) == 1  # and the envelope was saved
